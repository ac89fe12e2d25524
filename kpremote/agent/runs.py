"""Runs on this host: ids, the detached start, following, status, cancel and the summary tar.

Layout under ROOT: tasks/<task>/workspace/ and tasks/<task>/runs/<run-id>/{state.json, summary/, raw/}.
A run's state.json is its only record; a run whose process died without saying so is marked failed by whoever
looks at it next (follow, status, cancel, pack-summary), so no run stays "running" forever.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from .events import complete_lines as _complete_lines
from .lease import Lease, acquire, utc_now_iso
from .nvml import GpuState, Snapshot, snapshot
from .procfs import command_line, is_alive, pid_exists
from .procfs import group_members as _group_members
from .protocol import NAME_PATTERN, PROFILE_MODE_PREFIX, RUN_ID_PATTERN, RUN_ID_RULE, RUNNERS, TERMINAL, is_name, new_run_id
from .protocol import AGENT_RUNNERS, run_kind
from .protocol import AgentError, BadRequest, ExitCode, GpuNotFound, IdlePolicy, NotFound, NotTerminal, UnusablePython
from .runstate import read_state, update_state

SAFE_NAME = re.compile(NAME_PATTERN)
RUN_ID = re.compile(RUN_ID_PATTERN)
HEARTBEAT_S = 2.0
FOLLOW_POLL_S = 0.05
CANCEL_GRACE_S = 5.0
# The folder that holds the `kpremote` package this code runs from: the detached runner imports the same copy.
AGENT_HOME = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ names and places


def validate_task_name(task: str) -> str:
    if not is_name(task):
        raise BadRequest(f"bad task name {task!r}: use letters, digits, '_', '.', '-' "
                         "(starting with a letter or digit)")
    return task


def task_dir(root: Path, task: str) -> Path:
    return Path(root) / "tasks" / validate_task_name(task)


def _check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id or ""):
        raise BadRequest(f"bad run id {run_id!r}: expected {RUN_ID_RULE}")
    return run_id


def existing_run_dir(root: Path, task: str, run_id: str) -> Path:
    _check_run_id(run_id)
    run_dir = task_dir(root, task) / "runs" / run_id
    if not (run_dir / "state.json").is_file():
        raise NotFound(f"no run {run_id} of task {task} on this host")
    return run_dir


def new_run(runs_dir: Path) -> tuple[str, Path]:
    """A fresh run id and its folder; the exclusive mkdir is what makes concurrent ids distinct."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = new_run_id()
        try:
            (runs_dir / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, runs_dir / run_id


# ------------------------------------------------------------------------------------------ start


class StartCancelled(AgentError):
    """The start was stopped before its runner began: cancelled, or its client went away while it waited."""

    kind = "cancelled"
    exit_code = ExitCode.CANCELLED_BEFORE_START


class TaskRefused(AgentError):
    """The synced task breaks its contract: refused before any run record exists."""

    kind = "task_refused"
    exit_code = ExitCode.BAD_REQUEST


TOMBSTONES = ".cancelled"  # tasks/<task>/.cancelled/<run-id>: cancelled before its start came; it refuses
CLAIMS_LOCK = ".claims.lock"  # tasks/<task>/.claims.lock: a claim and a cancel of an unborn run, one at a time


@dataclass
class StartRequest:
    task: str
    device: str = "auto"  # "auto" | "cuda" | "cpu"
    gpu: str | None = None  # index or UUID
    policy: IdlePolicy = field(default_factory=IdlePolicy)
    arch: str = "any"
    wait_s: float = 0.0
    lease: bool = True
    workloads: str | None = None
    mode: str | None = None  # a timing run's mode
    profile: str | None = None  # a profile run's request (protocol.ProfileRequest as JSON)
    host_alias: str | None = None
    run_id: str | None = None  # chosen by the client, so it can cancel the run before it hears back
    audit: str | None = None  # "off": no Nsight Compute audit (the run reads "unaudited: --no-audit")

    @property
    def runner_module(self) -> str:
        return RUNNERS[run_kind(self.profile)]

    @property
    def recorded_mode(self) -> str | None:
        """The run record's mode: a timing run's, or "profile:" + the request."""
        return self.mode if self.profile is None else PROFILE_MODE_PREFIX + self.profile


def start(root: Path, request: StartRequest, snapshot_fn: Callable[[], Snapshot] = snapshot,
          announce: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Check the task, record the run, lease a GPU (waiting if asked), spawn the runner detached, and return.

    The run record exists before the wait, so a cancel finds it; until the runner is handed its lease, SIGTERM
    (a cancel), SIGHUP or a vanished client ends the start, and no run begins that nobody asked for.
    announce, when given, receives JSON-able progress: "created" at once, then "waiting" lines while it waits.
    """
    root = Path(root).absolute()  # the detached runner and state.json must not depend on our cwd
    workspace = task_dir(root, request.task) / "workspace"
    if not workspace.is_dir():
        raise NotFound(f"task {request.task} has no workspace on this host ({workspace}); sync it first")
    spec = refuse_bad_task(workspace, request)
    snap = snapshot_fn()
    device = _resolve_device(request.device, snap)
    refuse_unusable_python(device)
    refuse_missing_packages(workspace, spec)
    # The task decides which GPUs it may run on (a b200 task refuses an H200); the host's declared arch is
    # only the fallback for a task that does not say.
    request = replace(request, arch=_task_arch(workspace) or request.arch)
    with StartGuard() as guard:
        waits = request.wait_s > 0
        run_id, run_dir = claim_run(workspace.parent / "runs", request.run_id, task=request.task,
                                    status="waiting" if waits else "starting", host_alias=request.host_alias,
                                    phase="waiting for a GPU" if waits else "leasing a GPU")
        try:
            if announce:
                announce({"event": "created", "run_id": run_id, "run_dir": str(run_dir)})
            with guard.interruptible():
                waiter = Waiter(run_dir, announce, guard.client)
                lease = _lease_for(root, request, snap, run_id, snapshot_fn, waiter.tick) \
                    if request.lease and snap.gpus else None
                gpu = lease.gpu if lease else _named_gpu(snap, request.gpu)
        except StartCancelled as exc:
            update_state(run_dir, status="cancelled", error=str(exc), finished=utc_now_iso())
            raise
        except BrokenPipeError:
            update_state(run_dir, status="cancelled", error=CLIENT_GONE, finished=utc_now_iso())
            raise StartCancelled(CLIENT_GONE) from None
        except AgentError:
            shutil.rmtree(run_dir, ignore_errors=True)  # refused (no idle GPU, wrong arch): no record stays
            raise
        return _spawn_runner(root, request, workspace, run_id, run_dir, device, gpu, lease, snap, guard)


def _spawn_runner(root: Path, request: StartRequest, workspace: Path, run_id: str, run_dir: Path, device: str,
                  gpu: GpuState | None, lease: Lease | None, snap: Snapshot, guard: "StartGuard") -> dict[str, Any]:
    (run_dir / "raw").mkdir()
    (run_dir / "summary").mkdir()
    command = _runner_command(request, workspace, run_dir, device, gpu, lease)
    gate = _spawn_gated(command, _runner_env(root, device, gpu), run_dir / "raw" / "agent.log", lease)
    try:
        update_state(
            run_dir,
            run_id=run_id,
            task=request.task,
            status="running",
            phase="starting",
            pid=gate.pid,
            pgid=gate.pid,  # start_new_session: the runner leads its own process group
            gpu=gpu.to_json() if gpu else None,
            started=utc_now_iso(),
            hostname=snap.hostname,
            host_alias=request.host_alias,
            device=device,
            workloads=request.workloads,
            mode=request.recorded_mode,
        )
        if lease:
            lease.write_record({**lease.record(), "pid": gate.pid})
        reason = guard.stop_reason()
        if reason:  # a cancel or a lost client while we spawned: the runner must not begin
            update_state(run_dir, status="cancelled", error=reason, finished=utc_now_iso())
            raise StartCancelled(reason)
        _open_gate(gate)
        guard.hand_over()
    finally:
        gate.stdin.close()  # without "go" the gate exits and the runner never starts
        if lease:
            lease.hand_over()
    return {"run_id": run_id, "run_dir": str(run_dir), "gpu": gpu.to_json() if gpu else None}


CLIENT_GONE = "its client went away before the run began"


class ClientWatch:
    """Whether the client that asked for this start is still there: our parent (sshd's session, or the local
    client) is alive and someone still reads our stdout. sshd sends no SIGHUP to a session without a terminal:
    a closed channel shows only as the far end of our stdout going away."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def gone(self) -> bool:
        return os.getppid() != self.parent or _reader_gone(sys.stdout)


class StartGuard:
    """SIGTERM, SIGINT and SIGHUP during a start: raise StartCancelled while it waits; remember them while it
    records or spawns (checked before the runner is let go); ignore them once the runner has its lease."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.client = ClientWatch()
        self.requested: str | None = None
        self.raising = False
        self.handed_over = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StartGuard":
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.handed_over:
            return  # a run now: only `cancel` (by its process group) or its own end stops it
        reason = CLIENT_GONE if signum == signal.SIGHUP else f"cancelled ({signal.Signals(signum).name}) before it began"
        if self.raising:
            self.raising = False
            raise StartCancelled(reason)
        self.requested = self.requested or reason

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.requested:
            raise StartCancelled(self.requested)
        self.raising = True
        try:
            yield
        finally:
            self.raising = False

    def stop_reason(self) -> str | None:
        return self.requested or (CLIENT_GONE if self.client.gone() else None)

    def hand_over(self) -> None:
        self.handed_over = True


class Waiter:
    """While no GPU is free: stop if the client left, and tell the client (and state.json) what we wait for."""

    def __init__(self, run_dir: Path, announce: Callable[[dict[str, Any]], None] | None, client: ClientWatch) -> None:
        self.run_dir = run_dir
        self.announce = announce
        self.client = client
        self.first_seen: dict[tuple[str, str], str] = {}
        self.last: list[dict[str, Any]] | None = None
        self.last_sent = 0.0

    def tick(self, snap: Snapshot, verdicts: dict[str, str]) -> None:
        if self.client.gone():
            raise StartCancelled("its client went away while it waited for a GPU")
        gpus = [self._describe(g, verdicts[g.uuid]) for g in snap.gpus if g.uuid in verdicts]
        changed = gpus != self.last
        if changed:
            update_state(self.run_dir, waiting_for=gpus)
            self.last = gpus
        if self.announce and (changed or time.monotonic() - self.last_sent > HEARTBEAT_S):
            # Also a heartbeat: a write to a closed channel fails (BrokenPipeError), so a lost client is noticed.
            self.announce({"event": "waiting", "hostname": snap.hostname, "gpus": gpus})
            self.last_sent = time.monotonic()

    def _describe(self, gpu: GpuState, verdict: str) -> dict[str, Any]:
        kind = verdict.split(":", 1)[0]
        since = self.first_seen.setdefault((gpu.uuid, kind), utc_now_iso())
        holder = re.search(r" since (\S+)$", verdict) if kind == "leased" else None
        return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "why": verdict,
                "since": holder.group(1) if holder else since}


def claim_run(runs_dir: Path, run_id: str | None = None, **fields: Any) -> tuple[str, Path]:
    """Create the run's record, or refuse: a tombstone says a cancel came first, an existing folder that the id
    is taken. One lock per task makes a claim and a cancel of a run that does not exist yet exclusive."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    with _claims_locked(runs_dir):
        if run_id is None:
            run_id, run_dir = new_run(runs_dir)
        else:
            _check_run_id(run_id)
            tombstone = runs_dir.parent / TOMBSTONES / run_id
            if tombstone.exists():
                tombstone.unlink()
                raise StartCancelled(f"run {run_id} was cancelled before its start arrived")
            run_dir = runs_dir / run_id
            try:
                run_dir.mkdir()
            except FileExistsError:
                raise BadRequest(f"run id {run_id} is already taken on this host") from None
        update_state(run_dir, run_id=run_id, **fields, pid=os.getpid(), created=utc_now_iso())
    return run_id, run_dir


@contextmanager
def _claims_locked(runs_dir: Path) -> Iterator[None]:
    fd = os.open(runs_dir.parent / CLAIMS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def refuse_bad_task(workspace: Path, request: StartRequest) -> None:
    """The checks the runner would make first, made before any run record exists; messages name the task as the
    user knows it (kernels/<task>/...), not this host's copy."""
    if request.runner_module not in AGENT_RUNNERS:  # a stand-in runner reads no task
        return None
    from .taskspec import TaskSpecError, load_task

    try:
        spec = load_task(workspace, timing_mode=request.mode,
                         packages=False)
        spec.select([w.strip() for w in request.workloads.split(",") if w.strip()] if request.workloads else None)
    except TaskSpecError as exc:
        raise TaskRefused(_users_path(str(exc), workspace, request.task)) from None
    return spec


def refuse_missing_packages(workspace: Path, spec: Any) -> None:
    """A build kind whose package this Python lacks: the host's problem (another host may have it), so not a
    task refusal; refused before any record or lease all the same."""
    if spec is None:
        return
    from .buildkinds import check_packages
    from .taskspec import TaskSpecError

    try:
        check_packages(workspace / "task.toml", spec.build)
    except TaskSpecError as exc:
        raise UnusablePython(_users_path(str(exc), workspace, spec.task.name)) from None


def _users_path(message: str, workspace: Path, task: str) -> str:
    from .taskspec import _shown

    for form in {str(workspace), str(workspace.resolve()), _shown(workspace)}:
        message = message.replace(form, f"kernels/{task}")
    return message


def refuse_unusable_python(device: str) -> None:
    """Refuse, before anything is leased, a run this interpreter cannot do: no torch, or a CPU-only torch for cuda."""
    where = f"{sys.executable} on {socket.gethostname()}"
    if importlib.util.find_spec("torch") is None:
        raise UnusablePython(f"torch is not installed for {where}; set python for this host in hosts.toml to an "
                             "interpreter that has torch and triton")
    if device == "cuda" and torch_cuda_build() is None:
        raise UnusablePython(f"the torch of {where} has no CUDA (a CPU-only build); set python for this host in "
                             "hosts.toml to one with a CUDA build of torch, or run with --device cpu")


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (None: CPU-only, or no torch), read from torch/version.py without
    importing torch, which takes seconds on a busy host."""
    spec = importlib.util.find_spec("torch")
    namespace: dict[str, Any] = {}
    try:
        version_py = Path(spec.submodule_search_locations[0], "version.py")
        exec(version_py.read_text(), namespace)  # noqa: S102 - torch's own generated constants file
    except (AttributeError, TypeError, IndexError, OSError, SyntaxError, ImportError):
        return None
    return namespace.get("cuda")


def _open_gate(gate: subprocess.Popen) -> None:
    try:
        gate.stdin.write(b"go\n")
    except BrokenPipeError:
        raise AgentError(f"the runner's launcher (pid {gate.pid}) died before it could start the runner") from None


def _task_arch(workspace: Path) -> str | None:
    """[task] arch of the synced task.toml, or None when it cannot be read (the runner refuses such a task)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the runner still checks the arch when it leases for itself
        return None
    try:
        task = tomllib.loads((workspace / "task.toml").read_text()).get("task")
    except (OSError, ValueError):
        return None
    arch = task.get("arch") if isinstance(task, dict) else None  # `task = 1` is the runner's to refuse, clearly
    return arch if isinstance(arch, str) else None


def _lease_for(
    root: Path, request: StartRequest, snap: Snapshot, run_id: str, snapshot_fn: Callable[[], Snapshot],
    on_wait: Callable[[Snapshot, dict[str, str]], None] | None = None,
) -> Lease:
    return acquire(
        root,
        policy=request.policy,
        arch=request.arch,
        run_id=run_id,
        task=request.task,
        gpu=request.gpu,
        wait_s=request.wait_s,
        snapshot_fn=snapshot_fn,
        on_wait=on_wait,
    )


def _named_gpu(snap: Snapshot, key: str | None) -> GpuState | None:
    if key is None:
        return None
    gpu = snap.find(key)
    if gpu is None:
        raise GpuNotFound(f"no GPU {key!r} on {snap.hostname}")
    return gpu


def _resolve_device(device: str, snap: Snapshot) -> str:
    if device != "auto":
        return device
    # Fixture GPUs are not real: a fixture host leases one and still runs on the CPU.
    return "cuda" if snap.source == "nvml" and snap.gpus else "cpu"


def _runner_command(
    request: StartRequest, workspace: Path, run_dir: Path, device: str, gpu: GpuState | None, lease: Lease | None
) -> list[str]:
    command = [sys.executable, "-m", request.runner_module, "--task-dir", str(workspace), "--run-dir", str(run_dir)]
    command += ["--device", device]
    optional = {
        "--gpu": gpu.uuid if gpu else None,
        "--lease-fd": str(lease.fd) if lease else None,
        "--workloads": request.workloads,
        "--mode": request.mode,
        "--profile": request.profile,
        "--host-alias": request.host_alias,
        "--audit": request.audit,
    }
    for flag, value in optional.items():
        if value is not None:
            command += [flag, value]
    return command


def _runner_env(root: Path, device: str, gpu: GpuState | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AGENT_HOME), env.get("PYTHONPATH")]))
    env["KPREMOTE_ROOT"] = str(root)
    if device == "cuda" and gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    return env


def _spawn_gated(command: list[str], env: dict[str, str], log_path: Path, lease: Lease | None) -> subprocess.Popen:
    """The runner in its own session, held at a gate until state.json names it.

    A small shell waits for "go" on its stdin and then execs the runner (same pid). Without the gate the runner's
    first state update could race ours and lose the pid; if the starter dies before "go", the gate just exits.
    """
    gate = ["/bin/sh", "-c", 'read -r _ && exec "$@" </dev/null', "kpremote-runner", *command]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            gate,
            stdin=subprocess.PIPE,
            bufsize=0,  # unbuffered: closing the gate's stdin after a failed write must not raise again
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(lease.fd,) if lease else (),
            env=env,
        )


# ------------------------------------------------------------------------------------------ liveness


def current_state(run_dir: Path) -> dict[str, Any]:
    """state.json, with a run whose process vanished mid-run marked failed."""
    state = read_state(run_dir)
    if not state or state.get("status") in TERMINAL or not state.get("pid"):
        return state
    if state.get("scheduler") == "slurm":  # its pid is on a compute node: Slurm judges it (agent/slurm.py)
        return state
    run_id = state.get("run_id") or Path(run_dir).name
    if _looks_like_run(int(state["pid"]), run_id):
        return state
    state = read_state(run_dir)  # it may have finished between our two looks
    if state.get("status") in TERMINAL:
        return state
    _end_leftovers(state, run_id)
    died = "agent process died" if state.get("pgid") else "its start process died before the run began"
    return update_state(run_dir, status="failed", error=died, finished=utc_now_iso())


def _end_leftovers(state: dict[str, Any], run_id: str) -> None:
    """A dead runner's workers would go on using a GPU its lease no longer holds: they end with it."""
    pgid = int(state.get("pgid") or 0)
    if pgid > 1 and pgid != os.getpgrp() and _group_is_run(pgid, run_id):
        _signal_group(pgid, signal.SIGKILL)
        _wait_group_gone(pgid, 2.0)


def _looks_like_run(pid: int, run_id: str) -> bool:
    """Whether pid is alive and still ours: a pid reused by an unrelated process does not count.

    An empty command line on a live process means it is between fork and exec (our launcher execs the
    runner): still ours. Only a missing process, a zombie, or a different program counts as dead.
    """
    if not is_alive(pid):
        return False
    text = command_line(pid)
    if text is None:  # unreadable (another user's pid: alive is all we can know) or gone since
        return pid_exists(pid)
    return not text.strip() or run_id in text or "kpremote" in text


# ------------------------------------------------------------------------------------------ follow


def follow(root: Path, task: str, run_id: str, offset: int = 0, out: BinaryIO | None = None,
           once: bool = False, with_summary: bool = False) -> int:
    """Copy events.jsonl to out as it grows; end with the final state once the run is over and all is sent.

    A heartbeat line goes out after HEARTBEAT_S of silence: the client takes a silent link for a lost one.
    With once, send what is there now and end with the current state (`inv logs` without --follow).
    With with_summary, a finished run's end line says "summary": true and the summary tar follows it to the end
    of the stream: `inv run` then needs no pack-summary channel (a round trip or two, and a remote Python start).
    """
    out = out if out is not None else sys.stdout.buffer
    run_dir = existing_run_dir(root, task, run_id)
    events = run_dir / "raw" / "events.jsonl"
    last_sent = time.monotonic()
    while True:
        # State first, events second: once the state is terminal, this read drains everything written before it.
        state = current_state(run_dir)
        chunk, offset = _complete_lines(events, offset)
        if chunk:
            out.write(chunk)
            out.flush()
            last_sent = time.monotonic()
        if once or state.get("status") in TERMINAL:
            summary = with_summary and state.get("status") in TERMINAL and state.get("status") != "cancelled"
            end = {"event": "end", "state": state, "offset": offset, **({"summary": True} if summary else {})}
            out.write(json.dumps(end).encode() + b"\n")
            if summary:
                write_summary_tar(run_dir / "summary", out)
            out.flush()
            return 0
        if _reader_gone(out):
            return 0
        if time.monotonic() - last_sent > HEARTBEAT_S:
            out.write(b'{"event": "heartbeat"}\n')
            out.flush()
            last_sent = time.monotonic()
        time.sleep(FOLLOW_POLL_S)


def _reader_gone(stream: BinaryIO) -> bool:
    """True once nobody reads our stdout (client gone), so a quiet run does not keep an orphan follow alive."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # only POLLERR / POLLHUP / POLLNVAL are reported
    return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))


# ------------------------------------------------------------------------------------------ status


def status(root: Path, task: str | None = None) -> dict[str, Any]:
    tasks = [task_dir(root, task)] if task else sorted(Path(root, "tasks").glob("*"))
    run_dirs = [run for t in tasks for run in (t / "runs").glob("*") if (run / "state.json").is_file()]
    return {"runs": [current_state(run) for run in sorted(run_dirs, key=lambda run: run.name)]}


# ------------------------------------------------------------------------------------------ cancel


def cancel(root: Path, task: str, run_id: str, grace_s: float = CANCEL_GRACE_S,
           pending: bool = False) -> dict[str, Any]:
    """Stop a run, whatever it is doing: still in its start (waiting for a GPU, spawning) or running.

    With pending, a run that does not exist yet (its start is still on the way: syncing, or not arrived) gets a
    tombstone instead, and that start refuses to begin.
    """
    if pending and _tombstoned(task_dir(root, task) / "runs", _check_run_id(run_id)):
        return {"cancelled": True, "state": {"run_id": run_id, "task": task, "status": "cancelled",
                                             "phase": "never started"}}
    run_dir = existing_run_dir(root, task, run_id)
    state = current_state(run_dir)
    if state.get("status") in TERMINAL:
        return {"cancelled": False, "state": state}
    for _ in range(3):  # a start may hand over to its runner while we stop it: then the runner's group goes
        if state.get("status") in TERMINAL:
            break
        if not state.get("pgid"):
            _stop_starter(int(state.get("pid") or 0), run_id, grace_s)
        else:
            pgid = int(state["pgid"])
            if pgid > 1 and pgid != os.getpgrp() and _group_is_run(pgid, run_id):
                _terminate_group(pgid, grace_s)
            break
        state = read_state(run_dir)
    state = read_state(run_dir)
    if state.get("status") not in TERMINAL:
        state = update_state(run_dir, status="cancelled", finished=utc_now_iso())
    return {"cancelled": True, "state": state}


def _tombstoned(runs_dir: Path, run_id: str) -> bool:
    """Leave a tombstone for run_id unless its record exists; True when it did not exist."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    with _claims_locked(runs_dir):
        if (runs_dir / run_id / "state.json").is_file():
            return False
        (runs_dir.parent / TOMBSTONES).mkdir(exist_ok=True)
        (runs_dir.parent / TOMBSTONES / run_id).write_text(utc_now_iso())
        return True


def _stop_starter(pid: int, run_id: str, grace_s: float) -> None:
    """SIGTERM a start that has not handed over yet (it records itself cancelled), SIGKILL it if it lingers."""
    if pid <= 1 or pid == os.getpid() or not _looks_like_run(pid, run_id):
        return
    for signum, patience in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while _looks_like_run(pid, run_id):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        else:
            return


def _group_is_run(pgid: int, run_id: str) -> bool:
    return any(_looks_like_run(pid, run_id) for pid in _group_members(pgid))


def _terminate_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the run's whole process group, then SIGKILL whatever is left: no worker may outlive a cancel."""
    _signal_group(pgid, signal.SIGTERM)
    if _wait_group_gone(pgid, grace_s):
        return
    _signal_group(pgid, signal.SIGKILL)
    _wait_group_gone(pgid, 2.0)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------------------------------------ pack-summary


def pack_summary(root: Path, task: str, run_id: str, out: BinaryIO) -> None:
    """Write an uncompressed tar of the run's summary/ (files and folders only) to out."""
    run_dir = existing_run_dir(root, task, run_id)
    status_now = current_state(run_dir).get("status")
    if status_now not in TERMINAL:
        raise NotTerminal(f"run {run_id} is {status_now}; its summary is not final yet")
    write_summary_tar(run_dir / "summary", out)


def write_summary_tar(summary: Path, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _summary_members(summary):
            tar.add(path, arcname=path.relative_to(summary).as_posix(), recursive=False)


def _summary_members(summary: Path) -> Iterator[Path]:
    """Regular files and real folders under summary/, parents before children; links are never followed."""
    if not summary.is_dir() or summary.is_symlink():
        return
    for folder, dirnames, filenames in os.walk(summary):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(folder, d)))
        base = Path(folder)
        if base != summary:
            yield base
        for name in sorted(filenames):
            if stat.S_ISREG(os.lstat(base / name).st_mode):
                yield base / name
