"""Runs on this host: ids, the detached start, following, status, cancel and the summary tar.

Layout under ROOT: tasks/<task>/workspace/ and tasks/<task>/runs/<run-id>/{state.json, summary/, raw/}.
A run's state.json is its only record; a run whose process died without saying so is marked failed by whoever
looks at it next (follow, status, cancel, pack-summary), so no run stays "running" forever.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from .lease import AgentError, BadRequest, GpuNotFound, IdlePolicy, Lease, acquire, utc_now_iso
from .nvml import GpuState, Snapshot, snapshot
from .runstate import TERMINAL, read_state, update_state

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")
HEARTBEAT_S = 2.0
FOLLOW_POLL_S = 0.05
CANCEL_GRACE_S = 5.0
DEFAULT_RUNNER = "kpremote.agent.runner"
# The folder that holds the `kpremote` package this code runs from: the detached runner imports the same copy.
AGENT_HOME = Path(__file__).resolve().parents[2]


class NotFound(AgentError):
    kind = "not_found"
    exit_code = 6


class NotTerminal(AgentError):
    kind = "not_terminal"
    exit_code = 5


class UnusablePython(AgentError):
    kind = "unusable_python"


# ------------------------------------------------------------------------------------------ names and places


def validate_task_name(task: str) -> str:
    if not SAFE_NAME.fullmatch(task or "") or task in (".", ".."):
        raise BadRequest(f"bad task name {task!r}: use letters, digits, '_', '.', '-' "
                         "(starting with a letter or digit)")
    return task


def task_dir(root: Path, task: str) -> Path:
    return Path(root) / "tasks" / validate_task_name(task)


def existing_run_dir(root: Path, task: str, run_id: str) -> Path:
    if not RUN_ID.fullmatch(run_id or ""):
        raise BadRequest(f"bad run id {run_id!r}: expected YYYYMMDD-HHMMSS-xxxxxx")
    run_dir = task_dir(root, task) / "runs" / run_id
    if not (run_dir / "state.json").is_file():
        raise NotFound(f"no run {run_id} of task {task} on this host")
    return run_dir


def new_run(runs_dir: Path) -> tuple[str, Path]:
    """A fresh run id and its folder; the exclusive mkdir is what makes concurrent ids distinct."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        try:
            (runs_dir / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, runs_dir / run_id


# ------------------------------------------------------------------------------------------ start


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
    mode: str | None = None
    host_alias: str | None = None
    runner_module: str = DEFAULT_RUNNER


def start(root: Path, request: StartRequest, snapshot_fn: Callable[[], Snapshot] = snapshot) -> dict[str, Any]:
    """Lease a GPU, spawn the runner detached (it inherits the lease), record the run, and return at once."""
    root = Path(root).absolute()  # the detached runner and state.json must not depend on our cwd
    workspace = task_dir(root, request.task) / "workspace"
    if not workspace.is_dir():
        raise NotFound(f"task {request.task} has no workspace on this host ({workspace}); sync it first")
    snap = snapshot_fn()
    device = _resolve_device(request.device, snap)
    refuse_unusable_python(device)
    run_id, run_dir = new_run(workspace.parent / "runs")
    # The task decides which GPUs it may run on (a b200 task refuses an H200); the host's declared arch is
    # only the fallback for a task that does not say.
    request = replace(request, arch=_task_arch(workspace) or request.arch)
    try:
        lease = _lease_for(root, request, snap, run_id, snapshot_fn) if request.lease and snap.gpus else None
        gpu = lease.gpu if lease else _named_gpu(snap, request.gpu)
    except AgentError:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
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
            mode=request.mode,
        )
        if lease:
            lease.write_record({**lease.record(), "pid": gate.pid})
        _open_gate(gate)
    finally:
        gate.stdin.close()  # without "go" the gate exits and the runner never starts
        if lease:
            lease.hand_over()
    return {"run_id": run_id, "run_dir": str(run_dir), "gpu": gpu.to_json() if gpu else None}


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
    root: Path, request: StartRequest, snap: Snapshot, run_id: str, snapshot_fn: Callable[[], Snapshot]
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
        "--host-alias": request.host_alias,
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
    return update_state(run_dir, status="failed", error="agent process died", finished=utc_now_iso())


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
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except PermissionError:
        return _pid_exists(pid)
    except OSError:
        return False
    if stat[stat.rfind(")") + 2 :].startswith("Z"):
        return False
    text = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return not text.strip() or run_id in text or "kpremote" in text


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _complete_lines(path: Path, offset: int) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b"", offset
    end = data.rfind(b"\n") + 1
    return data[:end], offset + end


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


def cancel(root: Path, task: str, run_id: str, grace_s: float = CANCEL_GRACE_S) -> dict[str, Any]:
    run_dir = existing_run_dir(root, task, run_id)
    state = current_state(run_dir)
    if state.get("status") in TERMINAL:
        return {"cancelled": False, "state": state}
    pgid = int(state.get("pgid") or state.get("pid") or 0)
    if pgid > 1 and pgid != os.getpgrp() and _group_is_run(pgid, run_id):
        _terminate_group(pgid, grace_s)
    state = read_state(run_dir)
    if state.get("status") not in TERMINAL:
        state = update_state(run_dir, status="cancelled", finished=utc_now_iso())
    return {"cancelled": True, "state": state}


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


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in the process group: a zombie holds nothing and cannot be killed again."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) S ppid pgrp ...": comm may contain spaces and parentheses, so split after the last ')'.
        after_comm = stat_line[stat_line.rfind(")") + 2 :].split()
        if len(after_comm) >= 3 and int(after_comm[2]) == pgid and after_comm[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


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
