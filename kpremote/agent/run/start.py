"""`start`: check the task, record the run, lease a GPU (waiting for one if asked), and spawn the runner
detached in its own session, held at a gate until state.json names it; then answer and leave it running.

The refusals before any record are startchecks.py's, what may stop a start before its runner begins is
startguard.py's, and the run's folder and id are runpaths.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .. import AGENT_HOME
from ..lease import Lease, acquire, utc_now_iso
from ..nvml import GpuState, Snapshot, resolve_device, snapshot
from ..protocol import AgentError, GpuNotFound, NotFound, StartCancelled
from .runpaths import claim_run, task_dir
from .runstate import update_state
from ..sync import snapshot_of, snapshot_workspace
from .startchecks import (StartRequest, refuse_bad_task, refuse_missing_packages, refuse_unusable_python,
                          task_arch)
from .startguard import CLIENT_GONE, StartGuard, Waiter

# The folder that holds the `kpremote` package this code runs from: the detached runner imports the same copy.


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
    device = resolve_device(request.device, lambda: snap)
    refuse_unusable_python(device)
    refuse_missing_packages(workspace, spec)
    # The task decides which GPUs it may run on (a b200 task refuses an H200); the host's declared arch is
    # only the fallback for a task that does not say.
    request = replace(request, arch=task_arch(workspace) or request.arch)
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
                  gpu: GpuState | None, lease: Lease | None, snap: Snapshot, guard: StartGuard) -> dict[str, Any]:
    (run_dir / "raw").mkdir()
    (run_dir / "summary").mkdir()
    task_copy = snapshot_workspace(workspace, snapshot_of(run_dir, request.task))
    command = _runner_command(request, task_copy, run_dir, device, gpu, lease)
    gate = _spawn_gated(command, runner_env(root, device, gpu), run_dir / "raw" / "agent.log", lease)
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


def _open_gate(gate: subprocess.Popen) -> None:
    try:
        gate.stdin.write(b"go\n")
    except BrokenPipeError:
        raise AgentError(f"the runner's launcher (pid {gate.pid}) died before it could start the runner") from None


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


def runner_env(root: Path, device: str, gpu: GpuState | None) -> dict[str, str]:
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
