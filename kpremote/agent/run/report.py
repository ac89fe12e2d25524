"""A run's summary: summary/results.json (schema kpremote.results/1), results.md, run_log.md, speedup.png.

results.json is the record a result is judged by: provenance first (what ran, where, built how, timed how,
the GPU before and after, which harness judged it), then one row per workload, then the headline: one
results.RunResults (build_results), which results.md (resultsmd.py), run_log.md and the plot (plot.py) are drawn
from. The headline is withheld, with the reason, when any production row failed or is in doubt. Standard library
only (matplotlib, when importable, draws the plot).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..harness import stats
from ..atomicfile import write_atomically as _write
from ..harness.correctness import ERROR, INCORRECT, NOT_CHECKED, PASSED, TIMEOUT
from ..results import (COLD_REGIME, CONTEXT_REGIMES, HEADLINE_LEVEL, RESULTS_SCHEMA, TASK_LABELS, Headline, RowResult,
                       RunResults)
from .resultsmd import render_results_md

SCHEMA = RESULTS_SCHEMA
SMOKE_LABEL = "smoke: timings are not meaningful"
UNSANDBOXED_LABEL = "unsandboxed"
ROW_DRAWS = 100
BOOTSTRAP_REPLICATES = 4000


# --------------------------------------------------------------------------------------------- results


def counts_in_headline(row: RowResult) -> bool:
    return bool(row.production and row.status == PASSED and not row.invalid and row.speedup)


BLOCKING_STATUSES = (INCORRECT, ERROR, TIMEOUT, NOT_CHECKED)


def headline_blockers(production: list[RowResult]) -> list[str]:
    """Why no speedup may be claimed: every production row that failed, is implausible or invalid."""
    blockers = []
    for row in production:
        if row.implausible:
            blockers.append(f"{row.workload} implausible")
        elif row.status in BLOCKING_STATUSES:
            blockers.append(f"{row.workload} {row.status}")
        elif row.invalid:
            blockers.append(f"{row.workload} invalid")
    return blockers


def process_offset_share(row: RowResult) -> float:
    """The row's process floor (its verdict's process_floor_us) over its shorter median; 0 where it has none."""
    floor = row.verdict.process_floor_us if row.verdict else None
    medians = [side.median if side else None for side in (row.side("baseline"), row.side("candidate"))]
    if not floor or not all(isinstance(m, (int, float)) and m > 0 for m in medians):
        return 0.0
    return float(floor) / min(medians)  # type: ignore[type-var]


def headline(rows: list[RowResult], samples: dict[str, dict[str, list[float]]], *, smoke: bool,
             unsandboxed: str | None = None, task_state: str | None = None,
             regime_samples: dict[str, dict[str, dict[str, list[float]]]] | None = None) -> Headline:
    """Equal-weight geometric mean of the production rows' speedups, with a seeded bootstrap interval.

    The interval carries each GPU row's process floor too (stats.with_process_offset): a 4 us row whose sides'
    processes may read it 0.75 us apart cannot narrow the interval below that.

    None at all when any production row is INCORRECT, ERROR, TIMEOUT, NOT CHECKED, implausible or invalid: a
    mean over the rows that survived would be built from a failed run (or a cheat's own rows).

    Computed from the cold regime (every row has it; the regimes of a row with a context are beside it: `regime`
    says which, `regimes` the same geomean in each context regime over the production rows that name a context).
    """
    production = [r for r in rows if r.production]
    counted = [r for r in production if counts_in_headline(r)]
    label = "; ".join(filter(None, [SMOKE_LABEL if smoke else None, UNSANDBOXED_LABEL if unsandboxed else None,
                                    TASK_LABELS["edited"] if task_state == "edited" else None]))
    result = Headline(level=HEADLINE_LEVEL, n=len(counted), of=len(production), label=label or None,
                      unsandboxed=unsandboxed, regime=COLD_REGIME,
                      absent=frozenset({"note", "verdicts", "method", "regimes"}))
    blockers = headline_blockers(production)
    if blockers:
        return replace(result, n=0, note="withheld: " + ", ".join(blockers),
                       absent=frozenset({"verdicts", "method", "regimes"}))
    if not counted:
        if production:
            counts = Counter(r.status for r in production)
            note = "no production row passed (" + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")"
        else:
            note = ("no production row in this run: a CPU run takes the task's smoke rows, production shapes are "
                    "timed on a GPU" if smoke else "no production row among the rows run")
        return replace(result, note=note, absent=frozenset({"verdicts", "method", "regimes"}))
    geomean, low, high, verdicts = _geomean_of(counted, samples)
    in_context = _regime_headlines(production, regime_samples or {})
    return replace(result, verdicts=verdicts, geomean=geomean, low=low, high=high, regimes=in_context or None,
                   method="percentile bootstrap, seeded: rows resampled, each row's samples resampled, and each GPU "
                          "row's speedup moved within its process floor",
                   absent=frozenset({"note"} | (set() if in_context else {"regimes"})))


def _geomean_of(counted: list[RowResult], samples: dict[str, dict[str, list[float]]]
                ) -> tuple[float, float, float, dict[str, int]]:
    """The geometric mean of the rows' speedups, its interval and the rows' verdicts."""
    draws = []
    for number, row in enumerate(counted):
        timed = samples.get(row.workload) or {}
        if timed.get("baseline") and timed.get("candidate"):
            row_draws = stats.row_speedup_draws(timed["baseline"], timed["candidate"], seed=number, n_draws=ROW_DRAWS)
        else:
            row_draws = [row.speedup]
        draws.append(stats.with_process_offset(row_draws, process_offset_share(row), seed=number))
    low, high = stats.hierarchical_geomean_ci(draws, seed=0, n_boot=BOOTSTRAP_REPLICATES, level=HEADLINE_LEVEL)
    verdicts = Counter(r.verdict_word for r in counted)
    return stats.geomean([r.speedup for r in counted]), low, high, {k: v for k, v in verdicts.items() if k}


def _regime_headlines(production: list[RowResult], regime_samples: dict[str, dict[str, dict[str, list[float]]]]
                      ) -> dict[str, Any]:
    """The headline's geomean in each context regime, over the production rows that name a context (each row as its
    regime timed it): {"warm": {...}, "context": {...}}; empty where no production row names one."""
    found: dict[str, Any] = {}
    with_context = [row for row in production if row.regimes is not None]
    for regime in CONTEXT_REGIMES:
        rows = [replace(row, timing=part.timing, verdict=part.verdict, speedup=part.speedup)
                for row in with_context if (part := row.regime(regime)) is not None and counts_in_headline(row)
                and part.speedup]
        if not rows:
            continue
        geomean, low, high, verdicts = _geomean_of(rows, regime_samples.get(regime) or {})
        found[regime] = {"geomean": geomean, "low": low, "high": high, "n": len(rows), "of": len(with_context),
                         "verdicts": verdicts}
    return found


def build_results(
    *,
    provenance: dict[str, Any],
    rows: list[RowResult],
    samples: dict[str, dict[str, list[float]]],
    status: str,
    exit_code: int,
    message: str | None,
    smoke: bool,
    unsandboxed: str | None = None,
    ended_by: str | None = None,
    regime_samples: dict[str, dict[str, dict[str, list[float]]]] | None = None,
) -> RunResults:
    """The run's results record from its judged rows. ended_by: the scheduler's state when it ended the run
    (Slurm's TIMEOUT, PREEMPTED, ...), else None. regime_samples: {regime: {workload: {side: times}}} of the rows
    with a context."""
    typed = list(rows)
    results = RunResults(
        schema=SCHEMA, status=status, exit_code=int(exit_code), message=message, ended_by=ended_by, smoke=smoke,
        label=SMOKE_LABEL if smoke else None, provenance=provenance, rows=typed, unsandboxed=unsandboxed,
    )
    results.headline = headline(typed, samples, smoke=smoke, unsandboxed=unsandboxed, task_state=results.task_state,
                                regime_samples=regime_samples)
    return results


def write_summary(run_dir: Path, results: RunResults, events: list[dict[str, Any]]) -> list[Path]:
    summary = Path(run_dir) / "summary"
    summary.mkdir(parents=True, exist_ok=True)
    from .plot import draw_speedup_plot

    plot = summary / "speedup.png"
    why_not = draw_speedup_plot(results, plot)  # None: drawn
    written = [
        _write(summary / "results.json", json.dumps(results.to_json(), indent=1, default=str) + "\n"),
        _write(summary / "results.md", render_results_md(results, plot_missing=why_not)),
        _write(summary / "run_log.md", render_run_log(results, events)),
    ]
    if why_not is None:
        written.append(plot)
    return written


# --------------------------------------------------------------------------------------------- run_log.md


def render_run_log(results: RunResults, events: list[dict[str, Any]]) -> str:
    prov = results.provenance
    lines = [f"# Run log: {results.part('task').get('name', '?')}", ""]
    if results.smoke:
        lines += [f"**SMOKE RUN** ({SMOKE_LABEL})", ""]
    lines += [f"- command: `{' '.join(prov.get('command', []))}`", f"- run: {prov.get('run_id')}", ""]
    start = events[0]["t"] if events else 0.0
    for event in events:
        text = _event_text(event)
        if text:
            lines.append(f"- +{event['t'] - start:7.2f} s  {text}")
    lines += ["", f"Ended **{results.status}**, exit code {results.exit_code}.", ""]
    return "\n".join(lines)


def _event_text(event: dict[str, Any]) -> str | None:
    name = event.get("event")
    if name == "phase":
        workload = f" {event['workload']} ({event.get('i')}/{event.get('n')})" if event.get("workload") else ""
        return f"phase {event.get('phase')}{workload}"
    if name == "build":
        return f"build {event.get('side')}: {'ok' if event.get('ok') else 'FAILED'} in {event.get('seconds')} s " \
               f"(log {event.get('log')}){': ' + event['error'] if event.get('error') else ''}"
    if name == "row":
        speedup = f", speedup {event['speedup']:.3f}×" if event.get("speedup") else ""
        message = f" — {event['message']}" if event.get("message") else ""
        return f"row {event.get('i')}/{event.get('n')} `{event.get('workload')}`: {event.get('status')}{speedup}{message}"
    if name == "audit":
        return (f"audit `{event.get('workload')}`: harness {event.get('harness_us')} us, ncu {event.get('ncu_us')} us, "
                f"{'agree' if event.get('agree') else 'DISAGREE'} (tolerance {event.get('tolerance')})")
    if name == "headline" and event.get("geomean"):
        return f"headline {event['geomean']:.3f}× ({event.get('low'):.3f}–{event.get('high'):.3f})"
    if name == "done":
        return f"done: {event.get('status')} (exit code {event.get('exit_code')})"
    if name in ("error", "warning", "provenance"):
        return f"{name}: {event.get('message') or 'recorded'}"
    return None
