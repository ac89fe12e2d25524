"""A run on a Slurm cluster: the client's submit for a host with scheduler = "slurm" (docs/slurm.md).

The host's `ssh` is the login node and its remote_root is on the shared filesystem. `inv run` syncs to the login
node and submits one batch job per task in the same channel (agent `slurm-submit`); follow, status and cancel use
the agent's slurm-* twins of the usual subcommands (same arguments, same answers, agentclient.agent_subcommand),
which read Slurm's view of the job. `hosts --check` asks Slurm what a run needs of it (gpustatus.check_cluster), and
gpu-status asks `slurm-nodes` for the cluster's nodes instead of NVML (gpustatus.probe_cluster, views/nodes.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, TYPE_CHECKING, Any

from ..agent.protocol import ExitCode
from ..hosts.agentclient import error_message
from ..hosts.config import Host
from ..errors import KpremoteError
from .interrupt import REGISTRY
from .session import StartedRun, raise_unless_started
from .sync import exchange, over_sync_apply
from ..task.taskscan import scan_task

if TYPE_CHECKING:
    from .session import RunOptions, RunSession
    from ..task.taskdir import TaskDir
    from ..transport import Completed

BAD_REQUEST = ExitCode.BAD_REQUEST
NEED_FULL_SYNC = ExitCode.NEED_FULL_SYNC


def submit_run(session: "RunSession", task: "TaskDir", options: "RunOptions", run_id: str,
               on_progress: Callable[[dict[str, Any]], None] = lambda event: None) -> StartedRun:
    """Sync the task to the login node and submit its job in one channel; a second only for a full re-sync.

    run_id is registered for Ctrl-C before the submit may reach the host (interrupt.py), as runs.start_run does.
    on_progress hears `connecting`, `syncing` (files, bytes) and `submitted` (the job id), as a start's does.
    """
    host = session.host
    if options.gpu:
        raise KpremoteError(f"{host.name}: --gpu does not apply to a Slurm cluster: Slurm picks the GPU (set gres "
                            "or constraint for this host in hosts.toml)")
    args = submit_args(host, task.name, options, run_id)
    on_progress({"event": "connecting"})
    session.agent.transport.connect_soon()
    tree = scan_task(task)
    session.agent.transport.connect()
    REGISTRY.add(host, task.name, run_id, session.agent.transport)
    submitted: list[dict[str, Any]] = []

    def submit_with_sync(request: bytes) -> dict[str, Any]:
        result = session.agent.call("slurm-submit", *args, "--sync", stdin=request)
        if result.exit_code == NEED_FULL_SYNC:
            return json.loads(result.stdout)  # nothing submitted: the sync's retry goes over sync-apply
        submitted.append(_submitted(session, run_id, result))
        return submitted[0]["sync"]

    synced = exchange(host, tree, submit_with_sync, resend=over_sync_apply(session.agent, task.name),
                      on_plan=lambda plan: on_progress(plan.syncing_event()))
    if not submitted:
        submitted.append(_submitted(session, run_id, session.agent.call("slurm-submit", *args)))
    answer = submitted[0]
    on_progress({"event": "submitted", "job_id": answer["job_id"]})
    return StartedRun(host=host.name, task=task.name, run_id=answer["run_id"], job_id=answer["job_id"],
                      gpu={"index": "-", "name": f"Slurm job {answer['job_id']}"}, synced_files=synced.files_sent)


def _submitted(session: "RunSession", run_id: str, result: "Completed") -> dict[str, Any]:
    """slurm-submit's answer; its refusals as the errors start_run raises (the run id unregistered: no job)."""
    host = session.host
    if not result.ok:
        REGISTRY.discard(host.name, run_id)  # refused or failed before sbatch took it: no job exists
    if result.exit_code == BAD_REQUEST:
        raise KpremoteError(f"{host.name}: {error_message(result)}")
    raise_unless_started(host, result, "submit")
    return json.loads(result.stdout)


def submit_args(host: Host, task: str, options: "RunOptions", run_id: str) -> list[str]:
    request = {"device": options.device, "workloads": options.workloads, "mode": options.mode,
               "host_alias": host.name, "arch": host.arch, "idle": dataclasses.asdict(host.idle), "run_id": run_id}
    settings = {key: value for key, value in (host.slurm or {}).items() if value is not None}
    return ["--task", task, "--request", json.dumps(request), "--settings", json.dumps(settings)]
