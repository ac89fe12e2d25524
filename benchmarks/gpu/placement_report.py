"""Where an A/A row's offset sits (harness 2.20-2.21, the warm regime): each row-run's speedup split by timing case
and by process pair, from the samples a run keeps (raw/samples.jsonl) and its results.json.

    python3 benchmarks/gpu/placement_report.py [--regime warm] [--rows s15] FOLDER_OR_TGZ...   -> markdown on stdout

A run's samples of one regime are its process pairs' shares one after another (each pair's count is in its
results.json, timing.process_pairs), and within a pair's share the k-th sample of a side is of timing case k mod 4
(sampling.Sampler rotates over the cases from the first). A row whose regime dropped a sample for the clock or took
a share again is left out: its samples no longer line up with their cases. Per case and per pair: the mean over the
row-runs of baseline median / candidate median (above 1: the baseline read slower), and which side harness 2.20 and
later take first for it (cases.allocation_order: the baseline for even cases, 2.21 on for the first and third pairs).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_report import folder_of  # noqa: E402

CASES = 4  # judge.TIMING_CASES_GPU
SIDES = ("baseline", "candidate")


def split_by_case(times: dict[str, list[float]], pair_counts: list[int], cases: int = CASES) -> dict[tuple[int, int], float]:
    """{(pair, case): baseline median / candidate median} of one row-run's regime."""
    by: dict[tuple[int, int, str], list[float]] = {}
    start = 0
    for pair, count in enumerate(pair_counts):
        for k in range(count):
            for side in SIDES:
                by.setdefault((pair, k % cases, side), []).append(times[side][start + k])
        start += count
    return {(pair, case): statistics.median(by[(pair, case, "baseline")]) / statistics.median(by[(pair, case, "candidate")])
            for pair, case, side in by if side == "baseline"}


def row_runs(folder: Path, regime: str, prefix: str) -> tuple[list[dict[tuple[int, int], float]], int]:
    """Every row-run under folder whose id starts with prefix, split by case; and how many were left out."""
    found, left_out = [], 0
    for results_path in sorted(folder.rglob("summary/results.json")):
        run = results_path.parent.parent
        samples_path = run / "raw" / "samples.jsonl"
        if not samples_path.is_file():
            continue
        samples = {}
        for line in samples_path.read_text().splitlines():
            record = json.loads(line)
            samples[(record["workload"], record["side"], record["regime"])] = record["times"]
        for row in json.loads(results_path.read_text()).get("rows", []):
            if not str(row.get("workload", "")).startswith(prefix) or row.get("status") != "PASSED":
                continue
            timing = row["timing"] if regime == "cold" else (row.get("regimes") or {}).get(regime, {}).get("timing")
            times = {side: samples.get((row["workload"], side, regime)) for side in SIDES}
            counts = [pair["n"] for pair in (timing or {}).get("process_pairs", [])]
            lined_up = timing and all(times.values()) and all(
                timing[side].get("dropped_clock", 0) == 0 and len(times[side]) == sum(counts) for side in SIDES)
            if not lined_up or (row.get("checks") or {}).get("retaken_in_context" if regime != "cold" else "retaken"):
                left_out += 1
                continue
            found.append(split_by_case(times, counts))
    return found, left_out


def table(runs: list[dict[tuple[int, int], float]]) -> list[str]:
    lines = ["| split | goes first (cases: 2.20 on; pairs: 2.21 on) | row-runs | mean baseline/candidate | share above 1 |",
             "|---|---|---:|---:|---:|"]
    for label, key in (("case", 1), ("pair", 0)):
        for index in sorted({k[key] for run in runs for k in run}):
            means = [statistics.mean(v for k, v in run.items() if k[key] == index) for run in runs]
            lines.append(f"| {label} {index + 1 if label == 'pair' else index} | {SIDES[index % 2]} | {len(means)} | "
                         f"{statistics.mean(means):.4f} | {sum(m > 1 for m in means) / len(means):.2f} |")
    return lines


def main(argv: list[str]) -> int:
    regime, prefix = "warm", ""
    while argv[:1] in (["--regime"], ["--rows"]) and len(argv) > 1:
        if argv[0] == "--regime":
            regime = argv[1]
        else:
            prefix = argv[1]
        argv = argv[2:]
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs, left_out = [], 0
    for given in argv:
        folder = folder_of(given)
        if not folder.exists():
            print(f"placement_report.py: no such folder or tgz: {given}", file=sys.stderr)
            return 2
        found, skipped = row_runs(folder, regime, prefix)
        runs += found
        left_out += skipped
    if not runs:
        print(f"placement_report.py: no row-run of regime {regime!r} with rows '{prefix}*' under {' '.join(argv)}",
              file=sys.stderr)
        return 2
    print(f"# {regime} regime, rows '{prefix}*': {len(runs)} row-run(s), {left_out} left out\n")
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
