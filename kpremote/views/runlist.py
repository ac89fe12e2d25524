"""`inv status`: runs by host and task, a table each, run ids whole, the newest SHOWN of each unless all are asked
for; why a run failed or ended in error, and a host that could not be asked, each on a line of its own."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Group
from rich.table import Table
from rich.text import Text

from . import terminal
from .layout import Column, fitted_table
from ..agent.protocol import TERMINAL
from .run import STATUS_STYLE, duration
from .terminal import error_lines

SHOWN = 10
"""Runs listed per host and task unless --all: the newest; a line says how many older ones there are."""


def runs_view(answers: list[dict], shown: Optional[int] = SHOWN) -> Group:
    """Runs by host and task: a line naming both, then a table whose run ids are whole (the newest `shown`, None:
    all); a host that could not be asked shows its error on a line of its own."""
    parts: list[Any] = []
    for answer in answers:
        if not answer["ok"]:
            parts += [Text.assemble((answer["host"], "bold"), ("  unreachable", "red")),
                      *error_lines(answer.get("error") or "failed", indent="  ")]
            continue
        if not answer["runs"]:
            parts.append(Text.assemble((answer["host"], "bold"), ("  no runs", "dim")))
        by_task: dict[str, list[dict]] = {}
        for run in answer["runs"]:
            by_task.setdefault(run.get("task", "?"), []).append(run)
        for task, runs in by_task.items():
            runs = sorted(runs, key=lambda run: str(run.get("run_id")))
            older = len(runs) - shown if shown is not None and len(runs) > shown else 0
            parts.append(Text.assemble((answer["host"], "bold"), " · ", (task, "bold")))
            parts.append(_runs_table(runs[older:]))
            parts += _why_they_ended(runs[older:])
            if older:
                parts.append(Text(f"  and {older} older run(s) of {task} (inv status --all lists them)", style="dim"))
    return Group(*parts)


def _runs_table(runs: list[dict]) -> Table:
    def headline(run: dict) -> str:
        head = run.get("headline") or {}
        if not head.get("geomean"):
            return "-"
        return f"{head['geomean']:.3f}x" + (" (smoke)" if head.get("label") or run.get("smoke") else "")

    def phase(run: dict) -> str:
        workload = run.get("workload") or {}
        if run.get("phase") == "workload" and workload.get("n") and run.get("status") == "running":
            return f"workload {workload.get('i')}/{workload['n']}"
        if run.get("status") in TERMINAL and run.get("phase") not in (None, "done"):
            return f"ended in: {run['phase']}"  # a cancelled wait is over: it no longer waits for a GPU
        return run.get("phase") or ""

    columns = [
        Column("run", [run.get("run_id", "?") for run in runs], whole=True),
        Column("gpu", [str((run.get("gpu") or {}).get("index", "-")) for run in runs], drop=1),
        Column("status", [Text(run.get("status", "?"), style=STATUS_STYLE.get(run.get("status", ""), ""))
                          for run in runs], whole=True),
        Column("phase", [phase(run) for run in runs], drop=2),
        Column("age", [_age(run.get("started") or _created(run.get("run_id"))) for run in runs], drop=3,
               justify="right"),
        Column("headline", [headline(run) for run in runs], whole=True),
    ]
    return fitted_table(columns, terminal.console.width - 2)


def _why_they_ended(runs: list[dict]) -> list[Text]:
    """Why each run that failed or ended in error ended (an INCORRECT row, a refused submit, Slurm's time limit...),
    on a line of its own under the table: it is never a column that a narrow terminal drops."""
    return [Text.assemble("  ", (str(run.get("run_id", "?")), "bold"), ": ", (str(run["message"]), "red"))
            for run in runs if run.get("status") in ("error", "failed") and run.get("message")]


def _created(run_id: Any) -> Optional[str]:
    """When a run was created, from its id (YYYYMMDD-HHMMSS-xxxxxx, UTC): a run that never started has no `started`."""
    text = str(run_id or "")
    if len(text) < 15 or not text[:8].isdigit() or not text[9:15].isdigit():
        return None
    return f"{text[:4]}-{text[4:6]}-{text[6:8]}T{text[9:11]}:{text[11:13]}:{text[13:15]}+00:00"


def _age(started: Optional[str]) -> str:
    if not started:
        return "?"
    from datetime import datetime, timezone

    try:
        then = datetime.fromisoformat(str(started).replace("Z", "+00:00"))
    except ValueError:
        return "?"
    return duration((datetime.now(timezone.utc) - then).total_seconds())
