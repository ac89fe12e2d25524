"""gpu-status of a Slurm cluster: one row per node, then its queue, below the usual GPU view of the GPU hosts (the
cluster's answer itself is gpustatus.ClusterReport, from the agent's slurm-nodes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .gpus import gpu_view
from .terminal import error_lines

if TYPE_CHECKING:  # annotations only
    from ..hosts.gpustatus import HostReport


def gpu_tables(reports: list["HostReport"], options: Any = None) -> list[Any]:
    """The usual GPU view for GPU hosts, and one row per node for each cluster."""
    hosts = [r for r in reports if r.source != "slurm"]
    clusters = [r for r in reports if r.source == "slurm"]
    tables = [gpu_view(hosts, options)] if hosts or not clusters else []
    if clusters:
        tables.append(nodes_table(clusters))
    return tables


def nodes_table(reports: list["HostReport"]) -> Any:
    """One row per node of each cluster, then its queue; a cluster whose Slurm did not answer reads "no answer",
    with the error on lines of its own below the table."""
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

