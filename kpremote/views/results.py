"""A run's results.json on the terminal: a banner, one table row per workload (its id whole, its verdict shown,
columns dropped before anything is cut), each row's note on a line of its own, and the headline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from rich.console import Group
from rich.text import Text

from ..agent.protocol import row_interval
from . import terminal
from .layout import Column, fitted_table

STATUS_STYLE = {"PASSED": "green", "INCORRECT": "red", "ERROR": "red", "TIMEOUT": "red", "SKIPPED": "yellow",
                "INVALID": "red", "NOT CHECKED": "yellow"}
VERDICT_STYLE = {"FASTER": "green", "SAME": "", "SLOWER": "red"}
# Row keys that describe the workload rather than its shape (as the agent's results.md leaves them out).
NOT_SHAPE = {"id", "production", "preset", "atol", "rtol", "seed", "note", "notes", "function", "source", "smoke"}


def number(value: Optional[float]) -> str:
    """Three significant digits without exponents: 0.0123, 1.23, 123, 4,054."""
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def varying_params(rows: list[dict[str, Any]]) -> list[str]:
    """The parameter names whose values differ between rows: the key that tells rows apart, nothing constant."""
    names: list[str] = []
    for row in rows:
        names += [k for k in (row.get("params") or {}) if k not in NOT_SHAPE and k not in names]
    return [k for k in names if len({repr((r.get("params") or {}).get(k)) for r in rows}) > 1]


def _speedup_cell(row: dict[str, Any]) -> str:
    if not row.get("speedup"):
        return "–"
    interval = row_interval(row)
    return f"{row['speedup']:.3f}x" + (f" ({interval[0]:.3f}–{interval[1]:.3f})" if interval else "")


def _median(row: dict[str, Any], side: str) -> str:
    summary = (row.get("timing") or {}).get(side) or {}
    return number(summary.get("median")) if summary.get("n") else "–"


def results_columns(rows: list[dict[str, Any]], copy_gbps: Optional[float]) -> list[Column]:
    shape_keys = varying_params(rows)

    def gbps(row: dict[str, Any]) -> Optional[float]:
        return (row.get("gbps") or {}).get("candidate") if row.get("speedup") else None

    columns = [
        Column("workload", [row.get("workload", "?") for row in rows], whole=True),
        Column("prod", ["yes" if row.get("production") else "" for row in rows], drop=1),
        Column("status", [Text(row.get("status", "?") + (" (invalid)" if row.get("invalid") else ""),
                               style=STATUS_STYLE.get(row.get("status", ""), "")) for row in rows], whole=True),
    ]
    if any(row_verdict(row) for row in rows):
        columns.append(Column("verdict", [Text(row_verdict(row) or "–", style=VERDICT_STYLE.get(row_verdict(row), ""))
                                          for row in rows], whole=True))
    columns += [
        Column("speedup", [_speedup_cell(row) for row in rows], whole=True, justify="right"),
        Column("base µs", [_median(row, "baseline") for row in rows], whole=True, drop=4, justify="right"),
        Column("cand µs", [_median(row, "candidate") for row in rows], whole=True, drop=5, justify="right"),
        Column("GB/s", [number(gbps(row)) for row in rows], whole=True, drop=2, justify="right"),
    ]
    if copy_gbps:
        columns.append(Column("% copy BW", [f"{number(100 * gbps(row) / copy_gbps)} %" if gbps(row) else "–"
                                            for row in rows], whole=True, drop=6, justify="right"))
    if shape_keys:
        columns.append(Column("shape", [" ".join(f"{k}={(row.get('params') or {}).get(k)}" for k in shape_keys)
                                        for row in rows], drop=3))
    return columns


def _banner(results: dict[str, Any]) -> list[Text]:
    prov = results.get("provenance") or {}
    task = prov.get("task") or {}
    task = task.get("name") or (Path(task["dir"]).name if task.get("dir") else "?")  # refused: task.toml unread
    status = str(results.get("status", "?"))
    lines = [Text.assemble((f"{task}: ", "bold"), (status, "green" if status == "passed" else "red"),
                           f" (exit code {results.get('exit_code')})")]
    if results.get("smoke"):
        lines.append(Text("smoke: timings are not meaningful (CPU, Triton interpreter)", style="bold yellow"))
    gpu = prov.get("gpu") or {}
    host = prov.get("host") or {}
    where = host.get("alias") or host.get("hostname")
    device = gpu.get("name") or prov.get("device")
    if where or device:
        run = f", run {prov['run_id']}" if prov.get("run_id") else ""
        lines.append(Text(f"{where or '?'}, {device or '?'}{run}", style="dim"))
    if results.get("message"):
        lines.append(Text(str(results["message"]), style="red"))
    return lines


FRAME = re.compile(r'File "([^"]+)", line (\d+)')
HARNESS_PATHS = ("/kpremote/agent/", "/site-packages/", "/dist-packages/", "/lib/python")


def task_frame(traceback: Any) -> Optional[str]:
    """Where in the task's own code a raised error was (`solution/kernel.py:12`, `bench/adapter.py:42`): the last
    frame of the traceback that is neither the harness's nor a library's, as a path in the task folder."""
    frames = [(path, line) for path, line in FRAME.findall(str(traceback or ""))
              if not path.startswith("<") and not any(part in path for part in HARNESS_PATHS)]
    if not frames:
        return None
    path, line = frames[-1]
    for marker in ("/workspace/", "/kernels/"):  # a host's task workspace; a local task under kernels/
        if marker in path:
            path = path.rsplit(marker, 1)[1]
            path = path.split("/", 1)[1] if marker == "/kernels/" and "/" in path else path
            break
    return f"{path}:{line}"


def _notes(rows: list[dict[str, Any]]) -> list[Text]:
    notes = []
    for row in rows:
        parts = [str(p) for p in (row.get("message"), row.get("invalid"), row.get("implausible"), row.get("audit"))
                 if p and not isinstance(p, (dict, list))]
        where = task_frame((row.get("correctness") or {}).get("traceback") or row.get("traceback"))
        if where and parts:
            parts[0] += f" (at {where})"
        if parts:
            notes.append(Text.assemble((f"{row.get('workload')}: ", "bold"), "; ".join(dict.fromkeys(parts))))
    return notes


def headline_line(head: dict[str, Any]) -> Text:
    label = " (smoke: not meaningful)" if head.get("label") else ""
    if head.get("geomean") is None:
        return Text(f"headline: none ({head.get('note', 'no rows')}){label}", style="bold")
    return Text(f"headline: {head['geomean']:.3f}x geometric-mean speedup over {head.get('n')} of {head.get('of')} "
                f"production rows, {int(100 * (head.get('level') or 0.95))} % interval {head['low']:.3f}–"
                f"{head['high']:.3f}{label}", style="bold")


def results_view(results: dict[str, Any], width: int) -> Group:
    rows = results.get("rows") or []
    copy_gbps = ((results.get("provenance") or {}).get("copy_bandwidth") or {}).get("gbps")
    parts: list[Any] = _banner(results)
    if rows:
        parts.append(fitted_table(results_columns(rows, copy_gbps), width))
        parts += _notes(rows)
    parts.append(headline_line(results.get("headline") or {}))
    return Group(*parts)


def row_verdict(row: dict) -> Optional[str]:
    """FASTER / SAME / SLOWER: the agent writes {"verdict", "speedup", "low", "high", ...} (results.json rows);
    None for a smoke row, whose timings (and so verdicts) mean nothing."""
    if row.get("smoke") or row.get("label"):
        return None
    verdict = row.get("verdict")
    if isinstance(verdict, dict):
        verdict = verdict.get("verdict")
    return str(verdict) if verdict else None


def summary_markdown(path: Path) -> Any:
    """A fetched summary, shown: the results table from results.json (ids whole, columns dropped before anything is
    cut), else results.md as the agent wrote it."""
    results_json = path.with_name("results.json")
    if path.name == "results.md" and results_json.is_file():
        try:
            return results_view(json.loads(results_json.read_text()), terminal.console.width)
        except (ValueError, KeyError, TypeError):
            pass  # a summary we cannot read as results: the agent's own markdown below
    from rich.markdown import Markdown  # 40 ms of import (markdown_it) that every other command can skip

    return Markdown(path.read_text())
