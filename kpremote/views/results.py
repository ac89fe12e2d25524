"""A run's results.json on the terminal: a banner, one table row per workload (its id whole, its verdict shown,
columns dropped before anything is cut), each row's note on a line of its own, and the headline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from rich.console import Group
from rich.text import Text

from ..agent.results import (CONTEXT_REGIMES, REGIME_WORDS, TASK_LABELS, UNVERIFIED_FASTER, Headline, RowResult,
                              RunResults)
from . import terminal
from .layout import Column, fitted_table

STATUS_STYLE = {"PASSED": "green", "INCORRECT": "red", "ERROR": "red", "TIMEOUT": "red", "SKIPPED": "yellow",
                "INVALID": "red", "NOT CHECKED": "yellow"}
VERDICT_STYLE = {"FASTER": "green", UNVERIFIED_FASTER: "yellow", "SAME": "", "SLOWER": "red"}
# Row keys that describe the workload rather than its shape (as the agent's results.md leaves them out).
NOT_SHAPE = {"id", "production", "preset", "atol", "rtol", "seed", "note", "notes", "function", "source", "smoke",
             "context"}


def number(value: Optional[float]) -> str:
    """Three significant digits without exponents: 0.0123, 1.23, 123, 4,054."""
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def varying_params(rows: list[RowResult]) -> list[str]:
    """The parameter names whose values differ between rows: the key that tells rows apart, nothing constant."""
    names: list[str] = []
    for row in rows:
        names += [k for k in (row.params or {}) if k not in NOT_SHAPE and k not in names]
    return [k for k in names if len({repr((r.params or {}).get(k)) for r in rows}) > 1]


def _speedup_cell(row: RowResult) -> str:
    if not row.speedup:
        return "–"
    interval = row.interval
    return f"{row.speedup:.3f}x" + (f" ({interval[0]:.3f}–{interval[1]:.3f})" if interval else "")


def _regime_cell(row: RowResult, regime: str) -> Text:
    """`0.999x SAME`: the row's speedup and verdict in a context regime ("–" where it has none)."""
    part = row.regime(regime)
    if part is None or not part.speedup:
        return Text("–")
    word = row_verdict(row) and row.regime_word(regime)
    return Text.assemble(f"{part.speedup:.3f}x", (f" {word}" if word else "", VERDICT_STYLE.get(word or "", "")))


def _median(row: RowResult, side: str) -> str:
    summary = row.side(side)
    return number(summary.median) if summary else "–"


def results_columns(rows: list[RowResult], copy_gbps: Optional[float]) -> list[Column]:
    shape_keys = varying_params(rows)

    def gbps(row: RowResult) -> Optional[float]:
        return (row.gbps or {}).get("candidate") if row.speedup else None

    columns = [
        Column("workload", [row.workload for row in rows], whole=True),
        Column("prod", ["yes" if row.production else "" for row in rows], drop=1),
        Column("status", [Text(row.status + (" (invalid)" if row.invalid else ""),
                               style=STATUS_STYLE.get(row.status, "")) for row in rows], whole=True),
    ]
    if any(row_verdict(row) for row in rows):
        columns.append(Column("verdict", [Text(row_verdict(row) or "–", style=VERDICT_STYLE.get(row_verdict(row), ""))
                                          for row in rows], whole=True))
    columns.append(Column("speedup", [_speedup_cell(row) for row in rows], whole=True, justify="right"))
    for regime in CONTEXT_REGIMES:  # the rows with a context: their speedup and verdict there (harness 2.18)
        if any(row.regime(regime) for row in rows):
            columns.append(Column(regime, [_regime_cell(row, regime) for row in rows], whole=True,
                                  drop=7 if regime == "warm" else 0, justify="right"))
    columns += [
        Column("base µs", [_median(row, "baseline") for row in rows], whole=True, drop=4, justify="right"),
        Column("cand µs", [_median(row, "candidate") for row in rows], whole=True, drop=5, justify="right"),
        Column("GB/s", [number(gbps(row)) for row in rows], whole=True, drop=2, justify="right"),
    ]
    if copy_gbps:
        columns.append(Column("% copy BW", [f"{number(100 * gbps(row) / copy_gbps)} %" if gbps(row) else "–"
                                            for row in rows], whole=True, drop=6, justify="right"))
    if shape_keys:
        columns.append(Column("shape", [" ".join(f"{k}={(row.params or {}).get(k)}" for k in shape_keys)
                                        for row in rows], drop=3))
    return columns


def _banner(results: RunResults) -> list[Text]:
    task = results.task_name  # a refused run names its folder: task.toml unread
    status = str(results.status)
    lines = [Text.assemble((f"{task}: ", "bold"), (status, "green" if status == "passed" else "red"),
                           f" (exit code {results.exit_code})")]
    if results.smoke:
        lines.append(Text("smoke: timings are not meaningful (CPU, Triton interpreter)", style="bold yellow"))
    if results.task_state in TASK_LABELS:
        changed = results.part("task_pin").get("changed") or []
        why = f": {', '.join(map(str, changed))}" if changed else ": no commit holds it"
        lines.append(Text(f"{TASK_LABELS[results.task_state]}{why} (not the pinned task's numbers)",
                          style="bold yellow"))
    host = results.part("host")
    where = host.get("alias") or host.get("hostname")
    device = results.part("gpu").get("name") or results.provenance.get("device")
    if where or device:
        run = f", run {results.run_id}" if results.run_id else ""
        lines.append(Text(f"{where or '?'}, {device or '?'}{run}", style="dim"))
    if results.message:  # a command it names (the failed build's log: inv fetch-results ...) on a line of its own
        lines += terminal.error_lines(str(results.message))
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


def _notes(rows: list[RowResult]) -> list[Text]:
    notes = []
    for row in rows:
        held = f"SAME: {row.verdict.held}" if row.verdict and row.verdict.held else None
        parts = [str(p) for p in (row.message, row.invalid, row.implausible, row.audit, held, row.unverified)
                 if p and not isinstance(p, (dict, list))]
        where = task_frame((row.correctness or {}).get("traceback") or row.traceback)
        if where and parts:
            parts[0] += f" (at {where})"
        if parts:
            notes.append(Text.assemble((f"{row.workload}: ", "bold"), "; ".join(dict.fromkeys(parts))))
    for row in rows:
        if row.context_note and row_verdict(row):
            notes.append(Text(row.context_note, style="yellow"))
    return notes


def headline_line(head: Headline) -> Text:
    label = f" ({head.label})" if head.label else ""
    if head.geomean is None:
        return Text(f"headline: none ({head.note or 'no rows'}){label}", style="bold")
    regime = f" in the {head.regime} regime ({REGIME_WORDS.get(head.regime, head.regime)})" if head.regime else ""
    line = Text(f"headline: {head.geomean:.3f}x geometric-mean speedup over {head.n} of {head.of} "
                f"production rows{regime}, {int(100 * (head.level or 0.95))} % interval {head.low:.3f}–"
                f"{head.high:.3f}{label}", style="bold")
    for name, part in (head.regimes or {}).items():
        if isinstance(part, dict) and part.get("geomean"):
            line.append(f"\n  {name} regime ({REGIME_WORDS.get(name, name)}): {part['geomean']:.3f}x over "
                        f"{part.get('n')} of {part.get('of')} production rows with a context, interval "
                        f"{part.get('low', 0):.3f}–{part.get('high', 0):.3f}", style="")
    return line


def results_view(results: RunResults, width: int) -> Group:
    rows = results.rows
    parts: list[Any] = _banner(results)
    if rows:
        parts.append(fitted_table(results_columns(rows, results.part("copy_bandwidth").get("gbps")), width))
        parts += _notes(rows)
    parts.append(headline_line(results.headline))
    return Group(*parts)


def row_verdict(row: RowResult) -> Optional[str]:
    """FASTER / SAME / SLOWER, as the judge gave it (the row's verdict); None for a smoke row, whose timings (and so
    verdicts) mean nothing."""
    if row.smoke or row.label:
        return None
    return row.verdict_word


def summary_markdown(path: Path) -> Any:
    """A fetched summary, shown: the results table from results.json (ids whole, columns dropped before anything is
    cut), else results.md as the agent wrote it."""
    results_json = path.with_name("results.json")
    if path.name == "results.md" and results_json.is_file():
        try:
            return results_view(RunResults.read(results_json), terminal.console.width)
        except (ValueError, KeyError, TypeError):
            pass  # a summary we cannot read as results: the agent's own markdown below
    from rich.markdown import Markdown  # 40 ms of import (markdown_it) that every other command can skip

    return Markdown(path.read_text())
