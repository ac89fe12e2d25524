"""`slurm-step` on the compute node, inside the job: lease one of the GPUs Slurm allocated (never another), run the
runner in a forked child, wait for it, and settle the record with what Slurm will say of the job.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from ..run.events import EventLog
from ..lease import acquire, utc_now_iso
from ..nvml import snapshot
from ..protocol import TERMINAL, AgentError, ExitCode, IdlePolicy, RunExit
from ..run.runpaths import existing_run_dir
from ..run.runstate import read_state, update_state
from .slurmjobs import jobs
from .slurmreaper import start_reaper
from .slurmsettle import settle, stopped_by_slurm
from ..run.start import runner_env
from ..run.startchecks import refuse_unusable_python, task_arch
from ..sync import snapshot_of


class NoAllocatedGpu(AgentError):
    """This job's node cannot run the task (no GPU Slurm allocated that NVML sees): the step exits with it."""

    kind = "refused"
    exit_code = ExitCode.ARCH_MISMATCH


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
        return exc.exit_code if exc.exit_code else RunExit.INFRA
    gpu = lease.gpu if lease else None
    # Slurm signals every process of the job (scancel, time limit, preemption): the runner records why it stops;
    # this step outlives it to settle the record with Slurm's reason.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    update_state(run_dir, status="running", phase="starting", hostname=node, node=node, gpu=gpu.to_json() if gpu
                 else None, device=device, started=utc_now_iso(),
                 slurm={"job_id": job_id, "state": "RUNNING", "node": node, "allocated_gpus": allocated_gpu_keys()})
    sys.stdout.flush()
    sys.stderr.flush()
    reaper_fd = start_reaper()  # whatever ends this step, nothing of the run outlives it (slurmreaper.py)
    runner_pid = _fork_runner(_runner_argv(root, run_dir, request, device, lease),
                              runner_env(root, device, gpu), run_dir / "raw" / "agent.log", job_id, reaper_fd)
    if lease:
        lease.write_record({**lease.record(), "pid": runner_pid, "job_id": job_id, "node": node})
        lease.hand_over()
    code = os.waitstatus_to_exitcode(os.waitpid(runner_pid, 0)[1])
    state = settle(run_dir, read_state(run_dir), jobs([job_id]).get(job_id) if job_id else None, in_job=True)
    if state.get("ended_by") and not state.get("slurm_settled"):  # the runner recorded why Slurm stopped the job
        update_state(run_dir, slurm={**(state.get("slurm") or {}), "state": state["ended_by"], "exit_code": code},
                     slurm_settled=True)
    elif not state.get("slurm_settled"):  # what Slurm will say once this step returns code
        update_state(run_dir, slurm={**(state.get("slurm") or {}), "state": "COMPLETED" if code == 0 else "FAILED",
                                     "exit_code": code})
    return code


def _lease_allocated(root: Path, run_dir: Path, request: dict[str, Any], where: str) -> tuple[str, Any]:
    """(device, lease): one of the GPUs Slurm allocated, checked against the task's arch and the idle rule; no
    lease when the job has no GPU (a CPU smoke run)."""
    keys = allocated_gpu_keys()
    snap = allocated_only(snapshot(), keys)
    device = request.get("device") or "auto"
    if device == "auto":
        device = "cuda" if snap.source == "nvml" and snap.gpus else "cpu"
        if keys and device == "cpu":  # gres gave GPUs this node's NVML cannot show: said in the run, not silent
            _warn(run_dir, f"{where} was allocated GPU {','.join(keys)} (gres), but NVML does not answer on this "
                           f"node (GPU readings: {snap.source}): a CPU smoke run, its timings not meaningful")
    if device == "cuda" and not snap.gpus:
        raise NoAllocatedGpu(f"{where} was allocated no GPU NVML can see: set gres (e.g. \"gpu:1\") for this host in "
                      "hosts.toml")
    refuse_unusable_python(device)
    if not snap.gpus:
        return device, None
    arch = task_arch(snapshot_of(run_dir, request["task"])) or request.get("arch") or "any"
    return device, acquire(root, policy=IdlePolicy.from_json(request.get("idle")), arch=arch,
                           run_id=request["run_id"], task=request["task"], snapshot_fn=lambda: snap)


def _runner_argv(root: Path, run_dir: Path, request: dict[str, Any], device: str, lease: Any) -> list[str]:
    argv = ["--task-dir", str(snapshot_of(run_dir, request["task"])), "--run-dir", str(run_dir), "--device", device,
            "--root", str(root)]
    for flag, value in (("--gpu", lease.gpu.uuid if lease else None), ("--lease-fd", str(lease.fd) if lease else None),
                        ("--workloads", request.get("workloads")), ("--mode", request.get("mode")),
                        ("--host-alias", request.get("host_alias"))):
        if value is not None:
            argv += [flag, value]
    return argv


def _fork_runner(argv: list[str], env: dict[str, str], log_path: Path, job_id: Optional[str],
                 reaper_fd: Optional[int]) -> int:
    """The runner in a forked child of this step: no second interpreter to start (a few hundred ms on a busy
    node). The child inherits the lease's fd, as the runner's --lease-fd expects; its output goes to agent.log.
    A signal that stops it is a cancel unless Slurm stopped the job itself (time limit, ...): it asks."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        if reaper_fd is not None:
            os.close(reaper_fd)  # the reaper waits for the step alone
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(env)
        from ..run.runner import main as runner_main

        code = runner_main(argv, stopped_by=lambda run_dir: stopped_by_slurm(run_dir, job_id))
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the step's code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warn(run_dir: Path, message: str) -> None:
    log = EventLog(run_dir / "raw" / "events.jsonl")
    try:
        log.emit("warning", message=message)
    finally:
        log.close()


def _record_refusal(run_dir: Path, job_id: Optional[str], node: str, message: str) -> None:
    log = EventLog(run_dir / "raw" / "events.jsonl")
    log.emit("error", message=message)
    log.emit("done", status="error", exit_code=NoAllocatedGpu.exit_code, message=message)
    log.close()
    update_state(run_dir, status="error", phase="done", exit_code=NoAllocatedGpu.exit_code, message=message,
                 hostname=node, node=node, finished=utc_now_iso(),
                 slurm={"job_id": job_id, "state": "RUNNING", "node": node})
