"""`inv compare`: did the change help? Two fetched runs of a task, row by row: the candidate's median in each, the
change of the row's speedup with its 95 % interval and a FASTER / SAME / SLOWER verdict, and the headline's change.

The interval of a speedup change comes from the spread each run recorded: a speedup is a ratio of two medians, so in
log space its standard error is sqrt(rse_baseline² + rse_candidate²) (each side's relative standard error of the
median, as timing.py measured it), and a change of speedup between two independent runs adds the two in quadrature:
change × exp(±1.96·se). Where a row carries its own speedup interval, that interval's width is used instead. A row is
FASTER only when the whole interval lies above 1 and the change is at least MIN_CHANGE and beyond the two runs' own
noise thresholds (each row's verdict `noise`: on a GPU it holds the process floor, how far apart two side processes
read one kernel, which no interval of one run shows); SLOWER likewise below; else SAME: nothing is claimed inside
the noise. A run whose record does not verify (runstore.py: its results.json is not what its ledger line recorded)
gets no verdict: skipped by default, refused when named.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from ..agent.results import CONTEXT_REGIMES, Headline, RowResult, SideStats
from ..errors import KpremoteError
from .ledger import lines_by_run
from .runstore import FetchedRun, fetched_runs, find_run

Z95 = 1.959964
MIN_CHANGE = 0.01  # a change under 1 % is SAME however tight its interval: run-to-run drift is about that size
MAX_LAST = 1000  # --last N: a table of more runs than that is no comparison


def side_rse(side: Optional[SideStats]) -> Optional[float]:
    """The relative standard error of one side's median: as measured, else from its std and n (normal theory)."""
    if side is None or not side.n or not side.median:
        return None
    if side.rse is not None:
        return float(side.rse)
    if side.std is not None and side.n > 1:
        return 1.2533 * float(side.std) / math.sqrt(side.n) / float(side.median)
    return None


def log_se_of_speedup(row: RowResult) -> Optional[float]:
    interval = row.interval
    if interval and row.speedup:
        return (math.log(interval[1]) - math.log(interval[0])) / (2 * Z95)
    parts = [side_rse(row.side("baseline")), side_rse(row.side("candidate"))]
    if any(p is None for p in parts):
        return None
    return math.sqrt(sum(p * p for p in parts))


def verdict(change: float, low: Optional[float], high: Optional[float], threshold: float = MIN_CHANGE) -> str:
    if low is not None and low > 1.0 and change >= 1.0 + threshold:
        return "FASTER"
    if high is not None and high < 1.0 and change <= 1.0 - threshold:
        return "SLOWER"
    return "SAME"


def change_threshold(base: RowResult, new: RowResult) -> float:
    """The smallest change of a row's speedup that says anything: MIN_CHANGE, or both runs' noise in quadrature."""
    noises = [float((row.verdict.noise if row.verdict else None) or 0.0) for row in (base, new)]
    return max(MIN_CHANGE, math.hypot(*noises))


def _median_us(row: RowResult, side: str) -> Optional[float]:
    summary = row.side(side)
    return summary.median if summary else None


def _side(row: Optional[RowResult]) -> Optional[dict[str, Any]]:
    if row is None:
        return None
    return {"status": row.status, "speedup": row.speedup, "baseline_median_us": _median_us(row, "baseline"),
            "candidate_median_us": _median_us(row, "candidate")}


def compare_rows(base: RowResult, new: RowResult) -> dict[str, Any]:
    """One workload in both runs: the change of its speedup (new / base), its interval and verdict."""
    entry: dict[str, Any] = {"base": _side(base), "new": _side(new), "change": None, "low": None, "high": None,
                             "verdict": None}
    if not (base.speedup and new.speedup):
        entry["note"] = "no speedup in " + ("either run" if not base.speedup and not new.speedup
                                            else "the base run" if not base.speedup else "the new run")
        return entry
    change = new.speedup / base.speedup
    ses = [log_se_of_speedup(base), log_se_of_speedup(new)]
    low = high = None
    if all(se is not None for se in ses):
        spread = Z95 * math.sqrt(sum(se * se for se in ses))
        low, high = change * math.exp(-spread), change * math.exp(spread)
    threshold = change_threshold(base, new)
    entry.update(change=change, low=low, high=high, threshold=threshold, verdict=verdict(change, low, high, threshold))
    if low is None:
        entry["note"] = "no spread recorded: no interval, so no claim"
    return entry


def in_regime(row: RowResult, regime: str) -> Optional[RowResult]:
    """The row as one of its context regimes timed it (its timing, verdict and speedup there), or None."""
    part = row.regime(regime)
    if part is None:
        return None
    return replace(row, timing=part.timing, verdict=part.verdict, speedup=part.speedup)


def compare_regimes(base: RowResult, new: RowResult) -> dict[str, Any]:
    """A row with a context in both runs: the change of its speedup in each context regime, by the same rule as its
    cold one (compare_rows); {} where either run did not time it so."""
    found = {}
    for regime in CONTEXT_REGIMES:
        old, now = in_regime(base, regime), in_regime(new, regime)
        if old is not None and now is not None:
            entry = compare_rows(old, now)
            found[regime] = {key: entry.get(key) for key in ("change", "low", "high", "verdict", "note")}
            found[regime]["base"], found[regime]["new"] = old.speedup, now.speedup
    return found


def headline_change(base: Headline, new: Headline) -> dict[str, Any]:
    """The geometric means' ratio (new / base) with an interval from the two bootstrap intervals."""
    result: dict[str, Any] = {"base": base.geomean, "new": new.geomean, "change": None, "low": None,
                              "high": None, "verdict": None}
    if not (base.geomean and new.geomean):
        return result
    change = new.geomean / base.geomean
    ses = []
    for head in (base, new):
        if head.low and head.high:
            ses.append((math.log(head.high) - math.log(head.low)) / (2 * Z95))
    low = high = None
    if len(ses) == 2:
        spread = Z95 * math.sqrt(ses[0] ** 2 + ses[1] ** 2)
        low, high = change * math.exp(-spread), change * math.exp(spread)
    result.update(change=change, low=low, high=high, verdict=verdict(change, low, high))
    return result


def run_summary(run: FetchedRun) -> dict[str, Any]:
    return {"host": run.host, "run_id": run.run_id, "started": run.started, "commit": run.commit, "dirty": run.dirty,
            "candidate_sha256": run.candidate_sha256, "task_digest": run.task_digest, "task_state": run.task_state,
            "status": run.status, "smoke": run.smoke,
            "headline": run.headline.geomean, "path": str(run.path)}


def same_candidate(base: FetchedRun, new: FetchedRun) -> Optional[bool]:
    """Whether both runs measured the very same candidate files (sha256); None when a summary does not say."""
    if not (base.candidate_sha256 and new.candidate_sha256):
        return None
    return base.candidate_sha256 == new.candidate_sha256


def other_tasks(base: FetchedRun, new: FetchedRun) -> Optional[str]:
    """Why two runs measured different tasks (their task digests differ), so that no verdict is given between them;
    None when they measured the same one (or a run made before tasks had a digest does not say)."""
    if base.task_digest and new.task_digest and base.task_digest != new.task_digest:
        return (f"the runs measured different tasks (task digest {base.task_digest[:12]} against "
                f"{new.task_digest[:12]}): no verdict between them")
    return None


def compare(base: FetchedRun, new: FetchedRun) -> dict[str, Any]:
    """The kpremote.compare/1 document's fields (docs/schemas/compare.json). Between runs of different tasks every
    change is shown and no verdict given (other_tasks)."""
    base_rows, new_rows = base.rows(), new.rows()
    order = list(dict.fromkeys([*base_rows, *new_rows]))
    rows = []
    for workload in order:
        if workload in base_rows and workload in new_rows:
            entry = {"workload": workload, **compare_rows(base_rows[workload], new_rows[workload])}
            regimes = compare_regimes(base_rows[workload], new_rows[workload])
            if regimes:
                entry["regimes"] = regimes
            rows.append(entry)
        else:
            only = "base" if workload in base_rows else "new"
            rows.append({"workload": workload, "base": _side(base_rows.get(workload)),
                         "new": _side(new_rows.get(workload)), "change": None, "low": None, "high": None,
                         "verdict": None, "note": f"only in the {only} run"})
    head = headline_change(base.headline, new.headline)
    in_context = {}
    for regime in CONTEXT_REGIMES:  # the headline's geomean in a context regime, where both runs have it
        parts = [(h.regimes or {}).get(regime) for h in (base.headline, new.headline)]
        if all(isinstance(p, dict) and p.get("geomean") for p in parts):
            in_context[regime] = headline_change(*(Headline(geomean=p["geomean"], low=p.get("low"), high=p.get("high"))
                                                   for p in parts))
    if in_context:
        head["regimes"] = in_context
    apart = other_tasks(base, new)
    if apart:
        for entry in [*rows, head, *(head.get("regimes") or {}).values(),
                      *(part for row in rows for part in (row.get("regimes") or {}).values())]:
            entry["verdict"] = None
    return {"task": new.task, "base": run_summary(base), "new": run_summary(new), "rows": rows,
            "headline": head, "smoke": base.smoke or new.smoke, "same_candidate": same_candidate(base, new),
            "other_tasks": apart}


def with_results(runs: list[FetchedRun]) -> list[FetchedRun]:
    """The runs that have something to compare: not a profile run, and at least one row with a speedup."""
    return [r for r in runs if r.nothing_to_compare() is None]


def comparable(run: FetchedRun, where: str) -> FetchedRun:
    """run, when it has results and its record verifies; a named run that has none, or does not verify, is refused
    with the reason."""
    if run.record:
        raise KpremoteError(f"run {run.run_id} ({run.host}) {where} does not verify ({run.record}): no verdict on it")
    why = run.nothing_to_compare()
    if why:
        raise KpremoteError(f"run {run.run_id} {where} has nothing to compare ({why})")
    return run


def runs_to_compare(runs: list[FetchedRun], new: str, base: Optional[str], where: str) -> tuple[FetchedRun, FetchedRun]:
    """(older, newer): the runs `new` and `base` name, base by default the run before new on new's host; runs with
    no results are never chosen by default, and refused when named."""
    candidates = with_results(runs)
    if new == "latest" and runs and not candidates:
        raise KpremoteError(f"none of the {len(runs)} fetched run(s) {where} has results to compare (the newest, "
                            f"{runs[-1].run_id}: {runs[-1].nothing_to_compare()})")
    newer = comparable(find_run(candidates if new == "latest" else runs, new, where), where)
    if base:
        return comparable(find_run(runs, base, where), where), newer
    before = [r for r in candidates[:candidates.index(newer)] if r.host == newer.host]
    if not before:
        raise KpremoteError(f"run {newer.run_id} is the first fetched run with results {where} on {newer.host}: "
                            "give --base ID to compare it with another")
    return before[-1], newer


def last_runs(runs: list[FetchedRun], last: int, where: str) -> list[FetchedRun]:
    """The last `last` runs with results, oldest first: at least two."""
    if last < 2:
        raise KpremoteError(f"--last {last}: compare needs at least 2 runs")
    chosen = with_results(runs)[-last:]
    if len(chosen) < 2:
        raise KpremoteError(f"--last {last}: only {len(chosen)} fetched run(s) with results {where}")
    return chosen


def skipped_runs(runs: list[FetchedRun], chosen: list[FetchedRun], to_the_newest: bool) -> list[dict[str, Any]]:
    """The runs without results that the choice stepped over: between the chosen ones, and after them as well when
    the newest was asked for (latest, --last)."""
    places = [runs.index(r) for r in chosen]
    end = len(runs) if to_the_newest else max(places)
    return [{"run_id": r.run_id, "host": r.host, "why": why, **({"record": r.record} if r.record else {})}
            for r in runs[min(places):end] if (why := r.nothing_to_compare())]


def compare_document(kernels: Path, task: str, host: Optional[str], new: str, base: Optional[str],
                     last: Optional[int]) -> dict[str, Any]:
    """inv compare's document (docs/schemas/compare.json): the new run against the base, or the newest of the last
    N against the oldest with each row's speedup in each; the runs skipped, and the command line that brought each
    run (the ledger's)."""
    runs = fetched_runs(kernels, task, host)
    where = f"of {task}" + (f" on {host}" if host else "")
    if last is not None:
        chosen = last_runs(runs, last, where)
        document = compare(chosen[0], chosen[-1])
        document["series"] = series(chosen)
    else:
        chosen = list(runs_to_compare(runs, new, base, where))
        document = compare(*chosen)
    document["skipped"] = skipped_runs(runs, chosen, to_the_newest=last is not None or new == "latest")
    recorded = lines_by_run(kernels / task)
    for side in ("base", "new"):
        document[side]["command"] = (recorded.get((document[side]["host"], document[side]["run_id"])) or {}).get("command")
    return document


def series(runs: list[FetchedRun]) -> list[dict[str, Any]]:
    """--last N: each run's headline and each row's speedup, oldest first."""
    return [{"run_id": r.run_id, "host": r.host, "headline": r.headline.geomean, "task_digest": r.task_digest,
             "speedups": {w: row.speedup for w, row in r.rows().items()},
             **({"in_context": {w: part.speedup for w, row in r.rows().items()
                                if (part := row.regime("context")) is not None}}
                if any(row.regime("context") for row in r.rows().values()) else {})} for r in runs]
