"""Slurm on the agent's side: a run as a batch job, its step on the compute node, its state read from Slurm.

On the login node (remote_root on the shared filesystem):
    slurm-submit   apply the sync, create the run, write its batch script, `sbatch` it; state.json holds the job id
    slurm-follow   the run's events as `follow` sends them, plus "queued" phases (Slurm's reason, queue position)
    slurm-status   the runs, each reconciled with Slurm
    slurm-cancel   `scancel`, then wait until the run has recorded it
    slurm-nodes    per node: partitions, state, GPUs total / allocated, kpremote's jobs on it (gpu-status)
On the compute node, inside the job:
    slurm-step     lease one of the GPUs Slurm allocated (never another), run the runner, wait for it

Slurm's commands are called with argv lists, never through a shell. What Slurm says wins over what the run's
state.json says only when the run could not say it itself: a job ended by its time limit, preemption or a node
failure reads as such (the runner saw only a SIGTERM), and a job that died without a record is marked from Slurm's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

from .lease import AgentError, BadRequest, IdlePolicy, acquire, utc_now_iso
from .protocol import ExitCode
from .runstate import TERMINAL, read_state, update_state

SCHEDULER = "slurm"
POLL_S = 0.05  # as state.follow's
SLURM_POLL_S = 1.0  # how often a follower asks Slurm (one squeue call) while the run has not ended
CANCEL_WAIT_S = 30.0
SETTLE_S = 3.0  # a job Slurm calls ended, whose state.json is not terminal this long after, died without a record
COMMAND_TIMEOUT_S = 60.0
SBATCH_ALLOWED = ("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu", "gpus", "gpus-per-node",
                  "gpu-bind", "nodelist", "exclude", "reservation", "nice", "comment", "wckey", "licenses",
                  "tmp", "hint", "exclusive", "mail-type", "mail-user", "clusters", "begin", "deadline",
                  "priority", "distribution", "ntasks", "nodes")  # the client's config.py holds the same list
SETTING_FLAGS = {"partition": "--partition", "account": "--account", "qos": "--qos", "gres": "--gres",
                 "time_limit": "--time", "constraint": "--constraint"}
SETTING_VALUE = re.compile(r"[A-Za-z0-9_.,:&|*()\[\]!+-]+")
# Slurm job states after which the job runs no more, and what each means for the run.
ENDED = {
    "COMPLETED": "the job ended",
    "FAILED": "the job's step failed",
    "CANCELLED": "the job was cancelled in Slurm (scancel)",
    "TIMEOUT": "the job reached its time limit",
    "PREEMPTED": "the job was preempted",
    "NODE_FAIL": "the job's node failed or was set down",
    "BOOT_FAIL": "the job's node failed to boot",
    "DEADLINE": "the job reached its deadline",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "REVOKED": "the job was revoked",
    "SPECIAL_EXIT": "the job ended with a special exit",
}
FORGOTTEN = "UNKNOWN"
ENDED[FORGOTTEN] = "Slurm no longer knows the job and has no accounting to ask"
KILLED_BY_SLURM = {"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}


class SlurmError(AgentError):
    kind = "slurm"


class Refused(AgentError):
    kind = "refused"
    exit_code = 4


# ------------------------------------------------------------------------------------------ Slurm's commands


def slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """One Slurm client command (argv list, no shell); a missing command or a failure is one clear line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found on {socket.gethostname()}: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
        why = re.sub(r"^\w+: error: ", "", why)
        raise SlurmError(f"{argv[0]} failed: {why}")
    return done


JOB_FORMAT = "%i|%T|%N|%S|%M|%l|%P|%r"  # id, state, nodes, start, elapsed, limit, partition, reason (may hold '|')


def jobs(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """What Slurm knows now of these jobs: squeue (any state, while slurmctld remembers them), else sacct."""
    if not job_ids:
        return {}
    # Our own jobs in every state, filtered here: `squeue -j` fails outright when one id is no longer known.
    done = slurm("squeue", "-h", "-t", "all", "--me", "-o", JOB_FORMAT)
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split("|", 7)
        if len(parts) == 8 and parts[0] in job_ids:
            job_id, state, nodes, start, elapsed, limit, partition, reason = parts
            found[job_id] = {"job_id": job_id, "state": state.split()[0], "node": nodes or None, "start": start,
                             "elapsed": elapsed, "time_limit": limit, "partition": partition,
                             "reason": None if reason in ("None", "") else reason}
    missing = [j for j in job_ids if j not in found]
    if missing:
        found.update(_from_accounting(missing))
    for job_id in job_ids:  # slurmctld forgot it (MinJobAge) and there is no accounting to ask
        found.setdefault(job_id, {"job_id": job_id, "state": FORGOTTEN, "reason": "no longer in squeue; no sacct"})
    return found


def _from_accounting(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """sacct, where accounting exists (a cluster without slurmdbd answers an error: then nothing is known)."""
    done = slurm("sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,NodeList,Start,Elapsed,"
                 "Timelimit,Partition,Reason", check=False)
    found = {}
    if done.returncode != 0:
        return found
    for line in done.stdout.splitlines():
        parts = line.split("|", 7)
        if len(parts) == 8 and parts[0] in job_ids:
            job_id, state, nodes, start, elapsed, limit, partition, reason = parts
            found[job_id] = {"job_id": job_id, "state": state.split()[0], "node": nodes or None, "start": start,
                             "elapsed": elapsed, "time_limit": limit, "partition": partition,
                             "reason": None if reason in ("None", "") else reason, "source": "sacct"}
    return found


def queue_position(job_id: str, partition: Optional[str]) -> tuple[Optional[int], int]:
    """(1-based place among the pending jobs of its partition, in Slurm's priority order; how many are pending)."""
    args = ["squeue", "-h", "-t", "PENDING", "--sort=-p,i", "-o", "%i"]
    if partition:
        args += ["-p", partition]
    pending = slurm(*args, check=False).stdout.split()
    return (pending.index(job_id) + 1 if job_id in pending else None), len(pending)


# ------------------------------------------------------------------------------------------ submit (login node)


def submit(root: Path, request: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Create the run, write its batch script, sbatch it; the job id goes into state.json before we answer."""
    from .runs import claim_run, task_dir

    sbatch_settings = sbatch_options(settings)  # refused before anything is written or submitted
    workspace = task_dir(root, request["task"]) / "workspace"
    if not workspace.is_dir():
        raise BadRequest(f"task {request['task']} has no workspace on this host ({workspace}); sync it first")
    # The client's run id (it may cancel the run before it hears back): a cancel that came first refuses it here.
    run_id, run_dir = claim_run(workspace.parent / "runs", request.get("run_id"), task=request["task"],
                                status="pending", phase="queued", scheduler=SCHEDULER)
    (run_dir / "raw").mkdir()
    (run_dir / "summary").mkdir()
    script = run_dir / "raw" / "job.sh"
    script.write_text(batch_script(root, request["task"], run_id))
    now = utc_now_iso()  # `started` is the submit time until the job's step starts the run
    update_state(run_dir, run_id=run_id, task=request["task"], status="pending", phase="queued",
                 scheduler=SCHEDULER, job_id=None, submitted=now, started=now, host_alias=request.get("host_alias"),
                 device=request.get("device"), workloads=request.get("workloads"), mode=request.get("mode"),
                 request=request, settings=settings)
    argv = ["sbatch", "--parsable", f"--job-name=kp-{request['task']}"[:120], f"--output={run_dir / 'raw' / 'slurm-%j.out'}",
            f"--chdir={run_dir}", "--no-requeue", "--nodes=1", "--ntasks=1", *sbatch_settings, str(script)]
    try:
        done = slurm(*argv)
    except SlurmError as exc:
        update_state(run_dir, status="error", phase="done", message=f"not submitted: {exc}", finished=utc_now_iso())
        raise
    job_id = done.stdout.strip().split(";")[0]
    state = update_state(run_dir, job_id=job_id, slurm={"job_id": job_id, "state": "PENDING"})
    return {"run_id": run_id, "run_dir": str(run_dir), "job_id": job_id, "gpu": None, "state": state}


def sbatch_options(settings: dict[str, Any]) -> list[str]:
    """The host's Slurm settings as sbatch words: each checked again here, whatever the client sent."""
    words = []
    for key, flag in SETTING_FLAGS.items():
        value = settings.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not SETTING_VALUE.fullmatch(value):
            raise BadRequest(f"bad Slurm setting {key} = {value!r}")
        words.append(f"{flag}={value}")
    for arg in settings.get("sbatch_args") or []:
        key = arg[2:].split("=", 1)[0] if isinstance(arg, str) and arg.startswith("--") and "=" in arg else None
        if key not in SBATCH_ALLOWED or any(ord(ch) < 32 for ch in arg):
            raise BadRequest(f"sbatch argument {arg!r} is not allowed (allowed: --KEY=VALUE with KEY one of "
                             f"{', '.join(SBATCH_ALLOWED)})")
        words.append(arg)
    unknown = set(settings) - set(SETTING_FLAGS) - {"sbatch_args"}
    if unknown:
        raise BadRequest(f"unknown Slurm settings: {', '.join(sorted(unknown))}")
    return words


def batch_script(root: Path, task: str, run_id: str) -> str:
    """The job's script: one step, this very agent copy on the shared filesystem; every word quoted."""
    agent_home = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "kpremote.agent", "slurm-step", "--task", task, "--run", run_id, "--root", str(root)]
    return ("#!/bin/bash\n"
            f"# kpremote run {run_id} of task {task}: written by kpremote.agent.slurm\n"
            f"export PYTHONPATH={shlex.quote(str(agent_home))}\n"
            f"exec {' '.join(shlex.quote(word) for word in argv)}\n")


# ------------------------------------------------------------------------------------------ the step (compute node)


def allocated_gpu_keys(env: Optional[dict[str, str]] = None) -> Optional[list[str]]:
    """The GPUs Slurm gave this job (indices or UUIDs); None when it says nothing (no gres asked for)."""
    env = os.environ if env is None else env
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is not None and value.strip() not in ("", "NoDevFiles"):
            return [key.strip() for key in value.split(",") if key.strip()]
    return None


def allocated_only(snap: Any, keys: Optional[list[str]]) -> Any:
    """The NVML snapshot restricted to the GPUs Slurm allocated (none when Slurm allocated none).

    Slurm names GPUs by device minor number (/dev/nvidiaN of gres.conf); NVML numbers them in PCI order, and in a
    job whose cgroup hides the other GPUs (ConstrainDevices=yes) it shows only the job's, numbered from 0.
    """
    from dataclasses import replace

    if keys is None:
        return replace(snap, gpus=[])
    wanted = set(keys)
    if snap.source == "nvml" and len(snap.gpus) == len(wanted) and not any(k.startswith("GPU-") for k in wanted):
        return snap  # NVML already sees exactly the job's GPUs: the cgroup hides the others
    minors = _minor_numbers(snap)
    return replace(snap, gpus=[g for g in snap.gpus
                               if str(minors.get(g.uuid, g.index)) in wanted or g.uuid in wanted])


def _minor_numbers(snap: Any) -> dict[str, int]:
    """GPU UUID -> /dev/nvidiaN minor number, from NVML (empty for the fixture: there index stands for it)."""
    if snap.source != "nvml":
        return {}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return {g.uuid: int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(g.uuid)))
                    for g in snap.gpus}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - an NVML without minor numbers: the index is the best guess left
        return {}


def step(root: Path, task: str, run_id: str) -> int:
    """Inside the job: lease an allocated GPU, run the runner in the job's own process group, wait for it."""
    from .runner import EXIT_INFRA
    from .runs import existing_run_dir

    run_dir = existing_run_dir(root, task, run_id)
    state = read_state(run_dir)
    if state.get("status") in TERMINAL:  # cancelled while it was pending
        return 0
    request = {**(state.get("request") or {}), "task": task, "run_id": run_id}
    job_id = os.environ.get("SLURM_JOB_ID", state.get("job_id"))
    node = socket.gethostname()
    try:
        device, lease = _lease_allocated(root, run_dir, request, f"job {job_id} on {node}")
    except AgentError as exc:
        _record_refusal(run_dir, job_id, node, str(exc))
        return exc.exit_code if exc.exit_code else EXIT_INFRA
    gpu = lease.gpu if lease else None
    # Slurm signals every process of the job (scancel, time limit, preemption): the runner records why it stops;
    # this step outlives it to settle the record with Slurm's reason.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    update_state(run_dir, status="running", phase="starting", hostname=node, node=node, gpu=gpu.to_json() if gpu
                 else None, device=device, started=utc_now_iso(),
                 slurm={"job_id": job_id, "state": "RUNNING", "node": node, "allocated_gpus": allocated_gpu_keys()})
    runner_pid = _fork_runner(_runner_argv(root, run_dir, request, device, lease),
                              _runner_env(root, device, gpu), run_dir / "raw" / "agent.log")
    if lease:
        lease.write_record({**lease.record(), "pid": runner_pid, "job_id": job_id, "node": node})
        lease.hand_over()
    code = os.waitstatus_to_exitcode(os.waitpid(runner_pid, 0)[1])
    state = settle(run_dir, read_state(run_dir), jobs([job_id]).get(job_id) if job_id else None, in_job=True)
    if not state.get("slurm_settled"):  # what Slurm will say once this step returns code
        update_state(run_dir, slurm={**(state.get("slurm") or {}), "state": "COMPLETED" if code == 0 else "FAILED",
                                     "exit_code": code})
    return code


def _lease_allocated(root: Path, run_dir: Path, request: dict[str, Any], where: str) -> tuple[str, Any]:
    """(device, lease): one of the GPUs Slurm allocated, checked against the task's arch and the idle rule; no
    lease when the job has no GPU (a CPU smoke run)."""
    from .nvml import snapshot
    from .runs import _task_arch, refuse_unusable_python

    snap = allocated_only(snapshot(), allocated_gpu_keys())
    device = request.get("device") or "auto"
    if device == "auto":
        device = "cuda" if snap.source == "nvml" and snap.gpus else "cpu"
    if device == "cuda" and not snap.gpus:
        raise Refused(f"{where} was allocated no GPU NVML can see: set gres (e.g. \"gpu:1\") for this host in "
                      "hosts.toml")
    refuse_unusable_python(device)
    if not snap.gpus:
        return device, None
    arch = _task_arch(run_dir.parent.parent / "workspace") or request.get("arch") or "any"
    return device, acquire(root, policy=IdlePolicy.from_json(request.get("idle")), arch=arch,
                           run_id=request["run_id"], task=request["task"], snapshot_fn=lambda: snap)


def _runner_argv(root: Path, run_dir: Path, request: dict[str, Any], device: str, lease: Any) -> list[str]:
    argv = ["--task-dir", str(run_dir.parent.parent / "workspace"), "--run-dir", str(run_dir), "--device", device,
            "--root", str(root)]
    for flag, value in (("--gpu", lease.gpu.uuid if lease else None), ("--lease-fd", str(lease.fd) if lease else None),
                        ("--workloads", request.get("workloads")), ("--mode", request.get("mode")),
                        ("--host-alias", request.get("host_alias"))):
        if value is not None:
            argv += [flag, value]
    return argv


def _runner_env(root: Path, device: str, gpu: Any) -> dict[str, str]:
    from .runs import AGENT_HOME

    env = {**os.environ, "KPREMOTE_ROOT": str(root),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(AGENT_HOME), os.environ.get("PYTHONPATH")]))}
    if device == "cuda" and gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # one of Slurm's: the lease chose among those only
    return env


def _fork_runner(argv: list[str], env: dict[str, str], log_path: Path) -> int:
    """The runner in a forked child of this step: no second interpreter to start (a few hundred ms on a busy
    node). The child inherits the lease's fd, as the runner's --lease-fd expects; its output goes to agent.log."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(env)
        from .runner import main as runner_main

        code = runner_main(argv)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the step's code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _record_refusal(run_dir: Path, job_id: Optional[str], node: str, message: str) -> None:
    from .events import EventLog

    log = EventLog(run_dir / "raw" / "events.jsonl")
    log.emit("error", message=message)
    log.emit("done", status="error", exit_code=4, message=message)
    log.close()
    update_state(run_dir, status="error", phase="done", exit_code=4, message=message, hostname=node, node=node,
                 finished=utc_now_iso(), slurm={"job_id": job_id, "state": "RUNNING", "node": node})


# ------------------------------------------------------------------------------------------ reconciling


STEPD_MARKER = re.compile(rb"\*\*\* JOB (\d+) ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
STEPD_CAUSES = {b"TIME LIMIT": "TIMEOUT", b"PREEMPTION": "PREEMPTED", b"NODE FAILURE": "NODE_FAIL"}


def stepd_verdict(run_dir: Path, job_id: Optional[str]) -> Optional[str]:
    """Why slurmstepd signalled the job, from the line it writes to the job's output before it does:
    `*** JOB 12 ON node CANCELLED AT ... DUE TO TIME LIMIT ***`. Slurm's own state says so only once the job
    has finished COMPLETING, which waits for this very step."""
    try:
        with open(run_dir / "raw" / f"slurm-{job_id}.out", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            tail = f.read()
    except OSError:
        return None
    found = [m for m in STEPD_MARKER.finditer(tail) if m.group(1).decode() == str(job_id)]
    if not found:
        return None
    cause = found[-1].group(2)
    return STEPD_CAUSES.get(cause.strip(), "CANCELLED") if cause else "CANCELLED"


def settle(run_dir: Path, state: dict[str, Any], job: Optional[dict[str, Any]], in_job: bool = False
           ) -> dict[str, Any]:
    """state.json brought in line with what Slurm says of the job, written back when that changes it."""
    if not state or state.get("scheduler") != SCHEDULER or state.get("slurm_settled"):
        return state
    if job is None:
        return state
    if job["state"] not in ENDED and state.get("status") == "cancelled":
        verdict = stepd_verdict(run_dir, job.get("job_id"))
        job = {**job, "state": verdict} if verdict else job
    slurm_state = job["state"]
    status = state.get("status")
    record = {**(state.get("slurm") or {}), **{k: v for k, v in job.items() if v is not None}}
    if status in TERMINAL:
        if status == "cancelled" and not state.get("cancel_requested") and slurm_state in ENDED:
            return _killed_by_slurm(run_dir, state, record)
        if status == "cancelled" and not state.get("cancel_requested") and not in_job:
            return state  # Slurm has not said yet why the job stopped: ask again on the next look
        return update_state(run_dir, slurm=record, slurm_settled=True) if slurm_state in ENDED else state
    if slurm_state in ENDED:
        if not _ended_long_enough(state, job):
            return state
        return _died_without_record(run_dir, state, record)
    if slurm_state == "PENDING" and status == "pending":
        if record != state.get("slurm"):
            return update_state(run_dir, slurm=record)
    if slurm_state in ("RUNNING", "COMPLETING") and status == "pending":
        return update_state(run_dir, phase="starting", slurm=record)
    return state


def _ended_long_enough(state: dict[str, Any], job: dict[str, Any]) -> bool:
    seen = state.get("slurm_ended_seen")
    return seen is not None and time.time() - float(seen) > SETTLE_S


def _killed_by_slurm(run_dir: Path, state: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    slurm_state = record["state"]
    why = ENDED.get(slurm_state, slurm_state)
    reason = _reason_text(record)
    if slurm_state not in KILLED_BY_SLURM:  # scancel by hand, or a signal from outside Slurm: still a cancel
        message = f"Slurm job {record.get('job_id')} {slurm_state}: {why}{reason}"
        return update_state(run_dir, message=message, slurm=record, slurm_settled=True)
    message = f"Slurm job {record.get('job_id')} {slurm_state}: {why}{reason}; what the run wrote is kept"
    _append_event(run_dir, "slurm", state=slurm_state, reason=record.get("reason"), message=message)
    return update_state(run_dir, status="failed", message=message, slurm=record, slurm_settled=True,
                        ended_by=slurm_state)


def _reason_text(record: dict[str, Any]) -> str:
    """Slurm's reason for the job, and for a node failure the node's own (`scontrol update ... reason=...`)."""
    reasons = [record["reason"]] if record.get("reason") else []
    if record.get("state") == "NODE_FAIL" and record.get("node"):
        done = slurm("sinfo", "-h", "-N", "-n", record["node"], "-o", "%E", check=False)
        node_reason = (done.stdout.strip().splitlines() or [""])[0].strip()
        if node_reason and node_reason != "none":
            reasons.append(f"node {record['node']}: {node_reason}")
    return f" ({'; '.join(reasons)})" if reasons else ""


def _died_without_record(run_dir: Path, state: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    slurm_state = record["state"]
    why = ENDED.get(slurm_state, slurm_state)
    reason = _reason_text(record)
    was = "before it started" if state.get("status") == "pending" else "without recording an end"
    message = f"Slurm job {record.get('job_id')} {slurm_state}: {why}{reason}, {was}; see raw/slurm-*.out"
    status = "cancelled" if slurm_state == "CANCELLED" else "failed" if slurm_state in KILLED_BY_SLURM else "error"
    _append_event(run_dir, "done", status=status, exit_code=None, message=message)
    return update_state(run_dir, status=status, phase="done", message=message, slurm=record, slurm_settled=True,
                        ended_by=slurm_state, finished=utc_now_iso())


def _append_event(run_dir: Path, event: str, **fields: Any) -> None:
    from .events import EventLog

    log = EventLog(run_dir / "raw" / "events.jsonl")
    try:
        log.emit(event, **fields)
    finally:
        log.close()


def look(run_dir: Path) -> dict[str, Any]:
    """The run's state, reconciled with Slurm now (one squeue call)."""
    return look_all([run_dir])[0]


def look_all(run_dirs: list[Path]) -> list[dict[str, Any]]:
    states = [read_state(d) for d in run_dirs]
    asking = [s["job_id"] for s in states if s.get("job_id") and _needs_slurm(s)]
    known = jobs(asking) if asking else {}
    settled = []
    for run_dir, state in zip(run_dirs, states):
        job = known.get(state.get("job_id") or "")
        if job and job["state"] in ENDED and state.get("status") not in TERMINAL and not state.get("slurm_ended_seen"):
            state = update_state(run_dir, slurm_ended_seen=time.time())
        settled.append(settle(run_dir, state, job))
    return settled


def _needs_slurm(state: dict[str, Any]) -> bool:
    return state.get("scheduler") == SCHEDULER and not state.get("slurm_settled") and (
        state.get("status") not in TERMINAL or state.get("status") == "cancelled")


def with_queue(state: dict[str, Any]) -> dict[str, Any]:
    """A pending run's state with its place in the queue (Slurm's reason is already in state["slurm"])."""
    job = state.get("slurm") or {}
    if state.get("status") != "pending" or not state.get("job_id"):
        return state
    position, pending = queue_position(state["job_id"], job.get("partition"))
    return {**state, "queue": {"reason": job.get("reason"), "position": position, "pending": pending}}


def queued_phase(state: dict[str, Any]) -> str:
    queue = state.get("queue") or {}
    where = f", {queue['position']} of {queue['pending']} pending" if queue.get("position") else ""
    return f"queued: {queue.get('reason') or 'waiting'}{where}"


# ------------------------------------------------------------------------------------------ follow / status / cancel


def follow(root: Path, task: str, run_id: str, offset: int = 0, out: Optional[BinaryIO] = None, once: bool = False,
           with_summary: bool = False) -> int:
    """As state.follow, with Slurm as the judge of liveness, and the queue shown while the job waits."""
    from .runs import HEARTBEAT_S, _complete_lines, _reader_gone, existing_run_dir, write_summary_tar

    out = out if out is not None else sys.stdout.buffer
    run_dir = existing_run_dir(root, task, run_id)
    events = run_dir / "raw" / "events.jsonl"
    last_sent, last_asked, last_phase, ended_at = time.monotonic(), 0.0, None, None
    state = read_state(run_dir)

    def send(line: bytes) -> None:
        nonlocal last_sent
        out.write(line)
        out.flush()
        last_sent = time.monotonic()

    while True:
        if time.monotonic() - last_asked >= SLURM_POLL_S and _needs_slurm(read_state(run_dir)):
            state = with_queue(look(run_dir))
            last_asked = time.monotonic()
            if state.get("status") == "pending" and queued_phase(state) != last_phase:
                last_phase = queued_phase(state)
                send(json.dumps({"t": round(time.time(), 6), "event": "phase", "phase": last_phase,
                                 "queue": state.get("queue"), "job_id": state.get("job_id")}).encode() + b"\n")
            elif last_phase and state.get("status") != "pending":  # out of the queue: say where it went
                job = state.get("slurm") or {}
                last_phase = None
                send(json.dumps({"t": round(time.time(), 6), "event": "phase", "phase": "started on "
                                 f"{job.get('node') or state.get('node') or '?'} (Slurm job {state.get('job_id')})",
                                 "job_id": state.get("job_id")}).encode() + b"\n")
        else:
            state = read_state(run_dir)
        chunk, offset = _complete_lines(events, offset)
        if chunk:
            send(chunk)
        if state.get("status") in TERMINAL and ended_at is None:
            ended_at = time.monotonic()
        # A run that stopped on a signal waits (briefly) for Slurm to say why: time limit, preemption, node.
        settled = ended_at is not None and (not _needs_slurm(state) or time.monotonic() - ended_at > 2 * SETTLE_S)
        if settled or once:
            summary = with_summary and state.get("status") in TERMINAL and state.get("status") != "cancelled"
            end = {"event": "end", "state": state, "offset": offset, **({"summary": True} if summary else {})}
            out.write(json.dumps(end, default=str).encode() + b"\n")
            if summary:
                write_summary_tar(run_dir / "summary", out)
            out.flush()
            return 0
        if _reader_gone(out):
            return 0
        if time.monotonic() - last_sent > HEARTBEAT_S:
            send(b'{"event": "heartbeat"}\n')
        time.sleep(POLL_S)


def status(root: Path, task: Optional[str] = None) -> dict[str, Any]:
    from .runs import task_dir

    tasks = [task_dir(root, task)] if task else sorted(Path(root, "tasks").glob("*"))
    run_dirs = sorted((run for t in tasks for run in (t / "runs").glob("*") if (run / "state.json").is_file()),
                      key=lambda run: run.name)
    return {"runs": [_shown(with_queue(state)) for state in look_all(run_dirs)]}


def _shown(state: dict[str, Any]) -> dict[str, Any]:
    """How `inv status` shows a run: the queue while pending; a job Slurm is still ending is not over yet."""
    if state.get("queue"):
        return {**state, "phase": queued_phase(state)}
    if state.get("status") == "cancelled" and _needs_slurm(state) and not state.get("cancel_requested"):
        return {**state, "status": "running", "phase": f"stopping: Slurm is ending job {state.get('job_id')}"}
    return state


def cancel(root: Path, task: str, run_id: str, wait_s: float = CANCEL_WAIT_S, pending: bool = False
           ) -> dict[str, Any]:
    """scancel the job; the runner records the cancel (SIGTERM), or we do when the job never started.

    With pending, a run not submitted yet gets a tombstone instead (state.cancel's), and its submit refuses it.
    """
    from .runs import _check_run_id, _tombstoned, existing_run_dir, task_dir

    if pending and _tombstoned(task_dir(root, task) / "runs", _check_run_id(run_id)):
        return {"cancelled": True, "state": {"run_id": run_id, "task": task, "status": "cancelled",
                                             "phase": "never started", "scheduler": SCHEDULER}}
    run_dir = existing_run_dir(root, task, run_id)
    state = look(run_dir)
    if state.get("status") in TERMINAL:
        return {"cancelled": False, "state": state}
    update_state(run_dir, cancel_requested=True)
    if state.get("job_id"):
        slurm("scancel", state["job_id"])
    deadline, job = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        job = jobs([state["job_id"]]).get(state["job_id"]) if state.get("job_id") else None
        if state.get("status") in TERMINAL or (job and job["state"] in ENDED and state.get("status") == "pending"):
            break
        time.sleep(0.2)
    if state.get("status") not in TERMINAL:
        _append_event(run_dir, "done", status="cancelled", exit_code=None, message="cancelled (scancel)")
        state = update_state(run_dir, status="cancelled", phase="done", finished=utc_now_iso(),
                             message="cancelled (scancel)")
    if job:
        state = update_state(run_dir, slurm={**(state.get("slurm") or {}), **job}, slurm_settled=True)
    return {"cancelled": True, "state": state}


# ------------------------------------------------------------------------------------------ gpu-status


def nodes(root: Path) -> dict[str, Any]:
    """Per node: partitions, state (and why), GPUs total / allocated, and kpremote's jobs on it."""
    info = json.loads(slurm("sinfo", "--json").stdout)
    queue = json.loads(slurm("squeue", "--json").stdout)
    ours = _our_jobs(root)
    on_node: dict[str, list[dict[str, Any]]] = {}
    for job in queue.get("jobs", []):
        if job.get("job_state") not in ("RUNNING", "COMPLETING", "PENDING"):
            continue
        record = {"job_id": str(job.get("job_id")), "name": job.get("name"), "user": job.get("user_name"),
                  "state": job.get("job_state"), "reason": job.get("state_reason"),
                  "gpus": _gpu_detail(job.get("gres_detail") or []), **ours.get(str(job.get("job_id")), {})}
        for node in _node_names(job.get("nodes") or "") if job.get("job_state") != "PENDING" else []:
            on_node.setdefault(node, []).append(record)
    pending = [str(j.get("job_id")) for j in queue.get("jobs", []) if j.get("job_state") == "PENDING"]
    result = []
    for node in info.get("nodes", []):
        name = node.get("name")
        result.append({"node": name, "hostname": node.get("hostname"), "partitions": node.get("partitions", []),
                       "state": node.get("state"), "state_flags": node.get("state_flags", []),
                       "reason": node.get("reason") or None, "gpus_total": _gpu_count(node.get("gres", "")),
                       "gpus_allocated": _gpu_count(node.get("gres_used", "")), "cpus": node.get("cpus"),
                       "cpus_allocated": node.get("alloc_cpus"), "jobs": on_node.get(name, [])})
    return {"hostname": socket.gethostname(), "source": SCHEDULER, "nodes": result,
            "pending_jobs": len(pending), "pending_ours": [ours[j] for j in pending if j in ours]}


def _our_jobs(root: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for state_file in Path(root, "tasks").glob("*/runs/*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if state.get("scheduler") == SCHEDULER and state.get("job_id") and state.get("status") not in TERMINAL:
            found[str(state["job_id"])] = {"run_id": state.get("run_id"), "task": state.get("task"),
                                          "status": state.get("status")}
    return found


def _gpu_count(gres: str) -> int:
    """GPUs in a gres string: "gpu:8", "gpu:h200:4(S:0-1)", "gpu:(null):2(IDX:0-1)", several comma-separated."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        match = re.match(r"gpu(?::[^:]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def _gpu_detail(details: list[str]) -> Optional[str]:
    return ", ".join(details) or None


def _node_names(expression: str) -> list[str]:
    """Slurm's node list ("vm", "gpu[01-03,07]") as names, through scontrol (it knows every form)."""
    if "[" not in expression:
        return [n for n in expression.split(",") if n]
    return slurm("scontrol", "show", "hostnames", expression).stdout.split()


# ------------------------------------------------------------------------------------------ the seam


def add_commands(command: Callable[..., Any]) -> None:
    """Register slurm-* on the agent's command line (kpremote/agent/__main__.py calls this)."""
    p = command("slurm-submit", _submit, "apply the sync, then submit the run as a Slurm batch job")
    p.add_argument("--task", required=True)
    p.add_argument("--request", required=True, help="JSON: device, workloads, mode, host_alias, arch, idle")
    p.add_argument("--settings", required=True, help="JSON: partition, account, qos, gres, time_limit, ...")
    p.add_argument("--sync", action="store_true", help="apply a sync stream from stdin first")
    p = command("slurm-step", _step, "inside the job: lease an allocated GPU and run the runner")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p = command("slurm-follow", _follow, "a cluster run's events, with its place in Slurm's queue while pending")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--from", dest="offset", type=int, default=0)
    p.add_argument("--once", action="store_true")
    p.add_argument("--with-summary", action="store_true")
    p = command("slurm-status", _status, "cluster runs, reconciled with squeue / sacct")
    p.add_argument("--task", default=None)
    p = command("slurm-cancel", _cancel, "scancel a run's job and record it cancelled")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--pending", action="store_true",
                   help="if the run is not submitted yet, make sure its submit never submits it")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds to wait for the job's runner to record the cancel (Slurm's KillWait still applies)")
    command("slurm-nodes", _nodes, "per node: partitions, state, GPUs total / allocated, kpremote's jobs")


def _root(args: Any) -> Path:
    return Path(os.path.expanduser(args.root))


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


def _json_arg(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise BadRequest(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


def _submit(args: Any) -> int:
    from .__main__ import _apply_sync
    from .runs import validate_task_name

    request = {**_json_arg(args.request, "--request"), "task": validate_task_name(args.task)}
    settings = _json_arg(args.settings, "--settings")
    sbatch_options(settings)  # a bad setting is refused before the sync touches anything
    synced = _apply_sync(args) if args.sync else None
    if synced is not None and "error" in synced:
        _print(synced)
        return int(synced.get("exit_code", 1))
    if synced is not None and synced.get("need_full"):
        _print(synced)
        return ExitCode.NEED_FULL_SYNC
    result = submit(_root(args), request, settings)
    _print({**result, "sync": synced} if synced is not None else result)
    return 0


def _step(args: Any) -> int:
    return step(_root(args), args.task, args.run)


def _follow(args: Any) -> int:
    return follow(_root(args), args.task, args.run, args.offset, once=args.once, with_summary=args.with_summary)


def _status(args: Any) -> int:
    _print(status(_root(args), args.task))
    return 0


def _cancel(args: Any) -> int:
    wait = {} if args.grace is None else {"wait_s": max(0.0, args.grace)}
    _print(cancel(_root(args), args.task, args.run, pending=args.pending, **wait))
    return 0


def _nodes(args: Any) -> int:
    _print(nodes(_root(args)))
    return 0
