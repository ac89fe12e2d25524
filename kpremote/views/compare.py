"""`inv compare` and `inv history` on the terminal: workload and run ids whole, verdicts coloured, columns dropped
before anything is cut, notes on lines of their own."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Group
from rich.text import Text

from ..agent.results import CONTEXT_REGIMES, TASK_LABELS
from ..results.history import commit_label
from .layout import Column, fitted_table
from .results import VERDICT_STYLE, number
from .terminal import Unbroken


def _ratio(value: Optional[float]) -> str:
    return f"{value:.3f}x" if value else "–"


def _change(entry: dict[str, Any]) -> str:
    if not entry.get("change"):
        return "–"
    text = f"{100 * (entry['change'] - 1):+.1f} %"
    if entry.get("low") and entry.get("high"):
        text += f" ({100 * (entry['low'] - 1):+.1f}…{100 * (entry['high'] - 1):+.1f})"
    return text


def _run_line(label: str, run: dict[str, Any]) -> Text:
    commit = commit_label(run)
    edited = TASK_LABELS.get(run.get("task_state") or "")
    return Text.assemble((f"{label}: ", "bold"), (run["run_id"], "cyan"),
                         f"  {run['host']}  {run['started'] or '?'}  {commit}  {run.get('status')}",
                         ("  smoke" if run.get("smoke") else "", "yellow"), (f"  {edited}" if edited else "", "yellow"),
                         (f"  task {run['task_digest'][:12]}" if run.get("task_digest") else "", "dim"))


def _verdict(value: Optional[str]) -> Text:
    return Text(value or "–", style=VERDICT_STYLE.get(value or "", ""))


def compare_view(document: dict[str, Any], width: int) -> Group:
    rows = document["rows"]
    parts: list[Any] = [Text(f"{document['task']}: new run against base run, row by row", style="bold"),
                        Unbroken(_run_line("base", document["base"])), Unbroken(_run_line("new ", document["new"]))]
    if document.get("smoke"):
        parts.append(Text("smoke: timings are not meaningful, and neither are their changes", style="bold yellow"))
    for run in document.get("skipped") or []:
        why = f"not verified: {run['record']}" if run.get("record") else f"nothing to compare: {run['why']}"
        parts.append(Text.assemble(("skipped ", "yellow"), (run["run_id"], "cyan"),
                                   (f" ({run['host']}): {why}", "bold red" if run.get("record") else "yellow")))

    def side(entry: dict[str, Any], which: str, key: str) -> Any:
        return (entry.get(which) or {}).get(key)

    columns = [
        Column("workload", [r["workload"] for r in rows], whole=True),
        Column("base µs", [number(side(r, "base", "candidate_median_us")) for r in rows], whole=True, drop=2,
               justify="right"),
        Column("new µs", [number(side(r, "new", "candidate_median_us")) for r in rows], whole=True, drop=3,
               justify="right"),
        Column("base", [_ratio(side(r, "base", "speedup")) for r in rows], whole=True, drop=1, justify="right"),
        Column("new", [_ratio(side(r, "new", "speedup")) for r in rows], whole=True, justify="right"),
        Column("speedup change (95 %)", [_change(r) for r in rows], whole=True, justify="right"),
        Column("verdict", [_verdict(r.get("verdict")) for r in rows], whole=True),
    ]
    for regime in CONTEXT_REGIMES:  # rows with a context in both runs: the change there too (harness 2.18)
        if any(regime in (r.get("regimes") or {}) for r in rows):
            columns.append(Column(f"{regime} change", [_regime_change(r, regime) for r in rows], whole=True,
                                  drop=5 if regime == "warm" else 4, justify="right"))
    parts.append(fitted_table(columns, width))
    parts += [Text.assemble((f"{r['workload']}: ", "bold"), r["note"]) for r in rows if r.get("note")]
    if document.get("other_tasks"):
        parts.append(Text(document["other_tasks"], style="bold yellow"))
    if document.get("same_candidate"):
        parts.append(Text(f"the same candidate in both runs (sha256 {str(document['new']['candidate_sha256'])[:12]}):"
                          " a change here is run-to-run noise, not the kernel's", style="yellow"))
    head = document["headline"]
    if head.get("change"):
        parts.append(Text.assemble(("headline: ", "bold"), f"{_ratio(head['base'])} → {_ratio(head['new'])}  ",
                                   _change(head), "  ", _verdict(head.get("verdict"))))
    else:
        parts.append(Text(f"headline: {_ratio(head.get('base'))} → {_ratio(head.get('new'))} (no change to compute)",
                          style="bold"))
    for regime, part in (head.get("regimes") or {}).items():
        parts.append(Text.assemble((f"headline in the {regime} regime: ", "bold"),
                                   f"{_ratio(part.get('base'))} → {_ratio(part.get('new'))}  ", _change(part), "  ",
                                   _verdict(part.get("verdict"))))
    if document.get("series"):
        parts.append(series_table(document["series"], width))
    return Group(*parts)


def _in_context(entry: dict[str, Any]) -> str:
    """A run's headline geomean in the context regime, over its rows with a context: `0.998x (0.990–1.006)`."""
    part = (entry.get("regimes") or {}).get("context") or {}
    if entry.get("record") or not part.get("geomean"):
        return "–"
    interval = f" ({part['low']:.3f}–{part['high']:.3f})" if part.get("low") and part.get("high") else ""
    return f"{part['geomean']:.3f}x{interval}"


def _regime_change(entry: dict[str, Any], regime: str) -> Text:
    """`+1.2 % (-0.5…+2.9) SAME`: a row's speedup change in one context regime, or "–"."""
    part = (entry.get("regimes") or {}).get(regime)
    if not part:
        return Text("–")
    return Text.assemble(_change(part), "  ", _verdict(part.get("verdict")))


def series_table(series: list[dict[str, Any]], width: int) -> Group:
    """--last N: each workload's speedup in each of the runs, oldest left, each run's column headed by the tail of
    its id (a unique part, as --new and --base take it) and the whole ids below, so that the same runs show at any
    width; only when even that is too wide do the oldest columns go (the newest never)."""
    workloads = list(dict.fromkeys(w for run in series for w in run["speedups"]))
    in_context = list(dict.fromkeys(w for run in series for w in run.get("in_context") or {}))
    labels = short_ids([run["run_id"] for run in series])
    columns = [Column("workload", workloads + [f"{w} in context" for w in in_context], whole=True)]
    for age, (run, label) in enumerate(zip(series, labels)):
        cells = [_ratio(run["speedups"].get(w)) for w in workloads]
        cells += [_ratio((run.get("in_context") or {}).get(w)) for w in in_context]
        columns.append(Column(label, cells, whole=True, drop=age + 1 if age < len(series) - 1 else 0, justify="right"))
    table = fitted_table(columns, width, title=f"the last {len(series)} runs: speedup per row, oldest left")
    legend = [Text.assemble(f"{label}: ", (run["run_id"], "cyan"), f" ({run['host']})")
              for run, label in zip(series, labels) if label != run["run_id"]]
    return Group(table, *legend)


def short_ids(run_ids: list[str]) -> list[str]:
    """Each run id's random tail (20261121-100000-bbbbbb → bbbbbb), as --new and --base take it; the whole ids
    when two tails are the same."""
    tails = [run_id.rsplit("-", 1)[-1] for run_id in run_ids]
    return tails if len(set(tails)) == len(tails) else run_ids


def history_view(document: dict[str, Any], width: int) -> Group:
    runs = document["runs"]
    parts: list[Any] = [Text(f"{document['task']}: {len(runs)} fetched run(s), oldest first", style="bold")]
    if not runs:
        return Group(*parts)

    def headline(entry: dict[str, Any]) -> str:
        if entry.get("record"):
            return "NOT VERIFIED"
        if not entry.get("geomean"):
            return "–"
        interval = f" ({entry['low']:.3f}–{entry['high']:.3f})" if entry.get("low") and entry.get("high") else ""
        edited = TASK_LABELS.get(entry.get("task_state") or "")
        return f"{entry['geomean']:.3f}x{interval}" + (" smoke" if entry.get("smoke") else "") + \
            (f" {edited}" if edited else "")

    columns = [
        Column("run", [e["run_id"] for e in runs], whole=True),
        Column("host", [e["host"] for e in runs], whole=True, drop=2),
        Column("started", [(e.get("started") or "?").replace("T", " ").rstrip("Z") for e in runs], whole=True, drop=1),
        Column("commit", [commit_label(e) for e in runs], whole=True, drop=3),
        Column("candidate", [(e.get("candidate_sha256") or "?")[:12] for e in runs], whole=True, drop=1),
        Column("task", [(e.get("task_digest") or "?")[:12] for e in runs], whole=True, drop=4),
        Column("status", [str(e.get("status")) for e in runs], whole=True),
        Column("headline", [headline(e) for e in runs], whole=True),
    ]
    if any((e.get("regimes") or {}).get("context") for e in runs):  # rows with a context (harness 2.18)
        columns.append(Column("in context", [_in_context(e) for e in runs], whole=True, justify="right"))
    parts.append(fitted_table(columns, width))
    parts += [Text.assemble((e["run_id"], "cyan"), (f": not verified: {e['record']}", "bold red"))
              for e in runs if e.get("record")]
    if document.get("plot"):
        parts.append(Unbroken(f"plot: {document['plot']}"))  # a path to open: whole at any width
    elif document.get("plot_note"):
        parts.append(Text(document["plot_note"], style="yellow"))
    return Group(*parts)
