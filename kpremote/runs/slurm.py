"""Slurm clusters behind the same commands: the client's side of a host with scheduler = "slurm" (docs/slurm.md).

The host's `ssh` is the login node and its remote_root is on the shared filesystem. `inv run` syncs to the login
node and submits one batch job per task in the same channel (agent `slurm-submit`); follow, status and cancel use
the agent's slurm-* twins of the usual subcommands (same arguments, same answers), which read Slurm's view of the
job; gpu-status asks `slurm-nodes` for the cluster's nodes instead of NVML.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, TYPE_CHECKING, Any, Optional

from ..agent.protocol import ExitCode
from ..hosts.agentclient import error_message
from ..hosts.config import Host
from ..errors import KpremoteError
from .interrupt import REGISTRY
from .started import StartedRun, raise_unless_started
from .sync import exchange, over_sync_apply
from ..task.taskscan import scan_task

if TYPE_CHECKING:
    from ..hosts.gpustatus import HostReport
    from .remote import RunOptions, RunSession
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


# ------------------------------------------------------------------------------------------ hosts --check


def check_cluster(host: Host, agent: Any) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(slurm-check's answer, the error naming the first check that failed, or None): sinfo answers from the login
    node's non-interactive session, the partition exists, sbatch --test-only takes the host's settings."""
    settings = {key: value for key, value in (host.slurm or {}).items() if value is not None}
    try:
        answer = agent.call_json("slurm-check", "--settings", json.dumps(settings))
    except KpremoteError as exc:
        return None, f"{host.name}: Slurm check: {exc}"
    failed = [c for c in answer.get("checks", []) if not c.get("ok")]
    if failed:
        return answer, f"{host.name}: Slurm: {failed[0]['check']}: {failed[0]['detail']}"
    return answer, None


# ------------------------------------------------------------------------------------------ gpu-status
# A cluster's answer itself (gpustatus.ClusterReport, from slurm-nodes) is gpu-status's; here is how it is shown.


def gpu_tables(reports: list["HostReport"], options: Any = None) -> list[Any]:
    """The usual GPU view for GPU hosts, and one row per node for each cluster."""
    from ..views.gpus import gpu_view

    hosts = [r for r in reports if r.source != "slurm"]
    clusters = [r for r in reports if r.source == "slurm"]
    tables = [gpu_view(hosts, options)] if hosts or not clusters else []
    if clusters:
        tables.append(nodes_table(clusters))
    return tables


def nodes_table(reports: list["HostReport"]) -> Any:
    """One row per node of each cluster, then its queue; a cluster whose Slurm did not answer reads "no answer",
    with the error on lines of its own below the table."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..views.terminal import error_lines

    table = Table(title="gpu-status (Slurm)", title_justify="left")
    for column in ("cluster", "node", "partitions", "state", "gpus", "kpremote runs", "other jobs"):
        table.add_column(column, overflow="fold")
    for report in reports:
        if not report.ok:
            table.add_row(report.host, "-", "", Text("no answer", style="bold red"), "", "", "")
            continue
        for node in getattr(report, "nodes", []):
            ours = [f"{j['run_id']} {j['task']} (job {j['job_id']})" for j in node["jobs"] if j.get("run_id")]
            others = [j for j in node["jobs"] if not j.get("run_id")]
            state = node_state(node)
            style = "green" if state == "idle" else "red" if state in ("down", "drained") else \
                "yellow" if state == "draining" else ""
            table.add_row(report.host, node["node"], ",".join(node["partitions"]),
                          Text(state + (f": {node['reason']}" if node.get("reason") else ""), style=style),
                          f"{node['gpus_allocated']}/{node['gpus_total']} allocated", "\n".join(ours) or "-",
                          str(len(others)) if others else "-")
        pending = getattr(report, "pending_jobs", 0)
        if pending:
            ours = ", ".join(f"{j['run_id']} {j['task']}" for j in getattr(report, "pending_ours", []))
            table.add_row(report.host, "(queue)", "", f"{pending} pending", "", ours or "-", "")
    failures = [line for r in reports if not r.ok for line in error_lines(r.error or f"{r.host}: failed")]
    return Group(table, *failures) if failures else table


def node_state(node: dict[str, Any]) -> str:
    """The node's state as sinfo names it: a node set to drain is "draining" while jobs still run on it and
    "drained" once none does (sinfo --json gives the base state and the DRAIN flag apart); else Slurm's state."""
    flags = {str(flag).upper() for flag in node.get("state_flags") or []}
    state = str(node.get("state") or "?").lower()
    if "DRAIN" in flags and state != "down":
        return "draining" if state in ("mixed", "mix", "allocated", "alloc", "completing") else "drained"
    return state

