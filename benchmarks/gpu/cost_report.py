"""Compare harness versions on the same rows: medians, spread of medians across runs, wall seconds per row.

    python benchmarks/gpu/cost_report.py --old R1,R2 --new R3,R4,R5 > cost.md

Each R is a run folder (or its summary/results.json). For every row and side: the mean of the runs' medians per
harness, the new-vs-old difference, the spread of the new harness's medians ((max - min) / mean), and the wall
seconds per row (the runner's `seconds`: worker start to result). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SIDES = ("baseline", "candidate")


def load(path: str) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "summary" / "results.json"
    return json.loads(p.read_text())


def per_side(results: list[dict], statistic: str = "median") -> dict[tuple[str, str], list[float]]:
    """One statistic of each run's samples (median, p90, ...), per row and side."""
    found: dict[tuple[str, str], list[float]] = {}
    for res in results:
        for row in res.get("rows", []):
            timing = row.get("timing") or {}
            for side in SIDES:
                value = (timing.get(side) or {}).get(statistic)
                if value:
                    found.setdefault((row["workload"], side), []).append(float(value))
    return found


def seconds(results: list[dict]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for res in results:
        for row in res.get("rows", []):
            if row.get("seconds") is not None:
                found.setdefault(row["workload"], []).append(float(row["seconds"]))
    return found


def total_seconds(results: list[dict]) -> float:
    """Seconds per row over whole runs: a process started once for many rows counts once, as it costs."""
    per_run = []
    for res in results:
        rows = [float(r["seconds"]) for r in res.get("rows", []) if r.get("seconds") is not None]
        if rows:
            per_run.append(sum(rows) / len(rows))
    return statistics.fmean(per_run) if per_run else float("nan")


def spread(values: list[float]) -> float | None:
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    args = parser.parse_args()
    old = [load(p) for p in args.old.split(",") if p]
    new = [load(p) for p in args.new.split(",") if p]
    old_m, new_m = per_side(old), per_side(new)
    old_p90, new_p90 = per_side(old, "p90"), per_side(new, "p90")
    old_s, new_s = seconds(old), seconds(new)
    print(f"old harness: {old[0]['provenance'].get('harness', {}).get('version', 'pre-trust')} ({len(old)} runs); "
          f"new harness: {new[0]['provenance'].get('harness', {}).get('version', '?')} ({len(new)} runs)\n")
    print("| workload | side | old median µs | new median µs | new vs old | spread of new medians | "
          "largest p90 old → new µs | wall s/row old → new |")
    print("|---|---|---|---|---|---|---|---|")
    worst_diff, worst_ratio = 0.0, 0.0
    for (workload, side), values in sorted(new_m.items()):
        before = old_m.get((workload, side))
        new_mean = statistics.fmean(values)
        diff = (new_mean / statistics.fmean(before) - 1) if before else None
        sp = spread(values)
        wall = ""
        if side == "baseline" and old_s.get(workload) and new_s.get(workload):
            ratio = statistics.fmean(new_s[workload]) / statistics.fmean(old_s[workload])
            worst_ratio = max(worst_ratio, ratio)
            wall = f"{statistics.fmean(old_s[workload]):.1f} → {statistics.fmean(new_s[workload]):.1f} ({ratio:.2f}×)"
        if diff is not None:
            worst_diff = max(worst_diff, abs(diff))
        spread_cell = f"{sp * 100:.2f} %" if sp is not None else "– (one run)"
        tails = (f"{max(old_p90.get((workload, side), [float('nan')])):.2f} → "
                 f"{max(new_p90.get((workload, side), [float('nan')])):.2f}")
        print(f"| `{workload}` | {side} | {statistics.fmean(before):.2f} | {new_mean:.2f} | "
              f"{diff * 100:+.2f} % | {spread_cell} | {tails} | {wall} |" if before else
              f"| `{workload}` | {side} | – | {new_mean:.2f} | – | {spread_cell} | {tails} | {wall} |")
    print(f"\nlargest |new - old| of a median: {worst_diff * 100:.2f} %; largest wall-time ratio per row: "
          f"{worst_ratio:.2f}×")
    old_total, new_total = total_seconds(old), total_seconds(new)
    print(f"wall time per row over a whole run (the sum of the rows' seconds / rows, mean of the runs): "
          f"old {old_total:.2f} s → new {new_total:.2f} s ({new_total / old_total:.2f}×)")


if __name__ == "__main__":
    main()
