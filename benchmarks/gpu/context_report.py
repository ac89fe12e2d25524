"""The tables of benchmarks/gpu/context.sh (issue 45): each row in its three regimes, what the regimes cost, and the
A/A false-verdict rate per regime.

    python3 benchmarks/gpu/context_report.py [--root DIR] FOLDER_OR_TGZ...     -> markdown on stdout

Each argument is a folder holding runs (any depth: every */summary/results.json below it, or a run's results.json
where results_md.py imported it: kernels/<task>/results/<host>/<run id>/) or a context-*.tgz that
context.sh wrote (unpacked into a temporary folder). A run is named by its folder's path (from --root, else from the
argument); context.sh lays them out as runs/tasks/<task>/<with|without>-<run id> and runs/aa/<run id>. Tables:
- regimes: every row with a context, each regime's medians, speedup, interval, verdict (and the row's one line when
  it is FASTER alone but not in its context);
- cost: a row run with its context against the same row of a run without (context.sh's `without-` runs): the row's
  seconds in each, and what the warm and context regimes added;
- sampling time: every row with a context in any run, the seconds each regime's samples took (both sides);
- A/A: the dial's A/A rows (candidate = baseline) per regime: FASTER / SAME / SLOWER / other over every row-run.
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kpremote.agent.results import RunResults  # noqa: E402

REGIMES = ("cold", "warm", "context")


def folder_of(given: str) -> Path:
    """The folder given, or a .tgz given unpacked into a temporary one (tar's data filter: no link or path out)."""
    folder = Path(given)
    if folder.is_file() and folder.name.endswith(".tgz"):
        unpacked = Path(tempfile.mkdtemp(prefix="context-report-"))
        with tarfile.open(folder) as tar:
            tar.extractall(unpacked, filter="data")
        return unpacked
    return folder


def runs_in(paths: list[str], root: Path | None = None) -> list[tuple[str, RunResults]]:
    found = []
    for given in paths:
        folder = folder_of(given)
        for results in sorted(folder.rglob("results.json")):  # a run's summary/, or a run imported by results_md.py
            run = results.parent.parent if results.parent.name == "summary" else results.parent
            name = run.relative_to(root) if root is not None and run.is_relative_to(root) else run.relative_to(folder)
            found.append((str(name) if str(name) != "." else run.name, RunResults.read(results)))
    return found


def _us(value: float | None) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def regimes_table(runs: list[tuple[str, RunResults]]) -> list[str]:
    lines = ["| run | row | regime | baseline µs | candidate µs | speedup (95 %) | verdict |",
             "|---|---|---|---:|---:|---|---|"]
    notes = []
    for name, results in runs:
        for row in results.rows:
            if row.regimes is None:
                continue
            for regime in REGIMES:
                part = row.regime(regime)
                if part is None:
                    continue
                base, cand = part.side("baseline"), part.side("candidate")
                verdict = part.verdict
                interval = f" ({verdict.low:.3f}–{verdict.high:.3f})" if verdict and verdict.low else ""
                speedup = f"{part.speedup:.3f}x{interval}" if part.speedup else row.status
                lines.append(f"| {name} | {row.workload} | {regime} | {_us(base.median if base else None)} | "
                             f"{_us(cand.median if cand else None)} | {speedup} | {row.regime_word(regime) or '–'} |")
            if row.context_note:
                notes.append(f"- {name}: {row.context_note}")
    return lines + ([""] + notes if notes else [])


def cost_table(runs: list[tuple[str, RunResults]]) -> list[str]:
    """Rows of a `with-` run against the same rows of the `without-` run of the same task (context.sh's pairs)."""
    by_task: dict[str, dict[str, RunResults]] = {}
    for name, results in runs:
        kind = Path(name).name.split("-", 1)[0]
        if kind in ("with", "without"):
            by_task.setdefault(str(Path(name).parent), {})[kind] = results
    lines = ["| task | row | seconds without its context | seconds with it (three regimes) | added |",
             "|---|---|---:|---:|---:|"]
    for task, pair in sorted(by_task.items()):
        if set(pair) != {"with", "without"}:
            continue
        alone = pair["without"].by_workload()
        for row in pair["with"].rows:
            other = alone.get(row.workload)
            seconds, before = row.seconds, other.seconds if other else None
            if isinstance(seconds, (int, float)) and isinstance(before, (int, float)) and row.regimes is not None:
                lines.append(f"| {Path(task).name} | {row.workload} | {before:.1f} | {seconds:.1f} | "
                             f"{seconds - before:+.1f} s ({seconds / before:.2f}x) |")
    return lines


def sampling_table(runs: list[tuple[str, RunResults]]) -> list[str]:
    """Every row with a context in any run (no `without-` run needed): the seconds each regime's samples took, both
    sides over every process pair (their timings' wall_s), beside the row's own seconds (judge and sides, from its
    cases to its last check; the first row of a run also starts the judge and its sides; the audit not counted)."""
    lines = ["| run | row | row's seconds | cold sampling s | warm sampling s | context sampling s |",
             "|---|---|---:|---:|---:|---:|"]
    for name, results in runs:
        for row in results.rows:
            if row.regimes is None:
                continue
            spent = []
            for regime in REGIMES:
                part = row.regime(regime)
                walls = [getattr(part.side(side), "wall_s", None) if part else None for side in ("baseline", "candidate")]
                spent.append(f"{sum(walls):.2f}" if all(isinstance(w, (int, float)) for w in walls) else "–")
            seconds = f"{row.seconds:.1f}" if isinstance(row.seconds, (int, float)) else "–"
            lines.append(f"| {name} | {row.workload} | {seconds} | {' | '.join(spent)} |")
    return lines


def aa_table(runs: list[tuple[str, RunResults]]) -> list[str]:
    counts = {regime: Counter() for regime in REGIMES}
    odd = []
    for name, results in runs:
        if "aa" not in Path(name).parts[:-1]:
            continue
        for row in results.rows:
            for regime in REGIMES:
                word = row.regime_word(regime) if row.status == "PASSED" and not row.invalid else None
                counts[regime][word or f"{row.status}{' (invalid)' if row.invalid else ''}"] += 1
                if word not in (None, "SAME"):
                    part = row.regime(regime)
                    odd.append(f"- {name} {row.workload} {regime}: {word} {part.speedup:.4f}x "
                               f"(baseline {_us(part.side('baseline').median)} µs, candidate "
                               f"{_us(part.side('candidate').median)} µs)")
    lines = ["| regime | row-runs | SAME | FASTER | SLOWER | other |", "|---|---:|---:|---:|---:|---|"]
    for regime in REGIMES:
        total = sum(counts[regime].values())
        other = ", ".join(f"{n} {k}" for k, n in counts[regime].items() if k not in ("SAME", "FASTER", "SLOWER"))
        lines.append(f"| {regime} | {total} | {counts[regime]['SAME']} | {counts[regime]['FASTER']} | "
                     f"{counts[regime]['SLOWER']} | {other or '–'} |")
    return lines + ([""] + odd if odd else [])


def main(argv: list[str]) -> int:
    root = None
    if argv[:1] == ["--root"] and len(argv) > 1:
        root, argv = Path(argv[1]), argv[2:]
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = runs_in(argv, root)
    if not runs:
        print(f"context_report.py: no results.json under {' '.join(argv)}", file=sys.stderr)
        return 2
    devices = Counter(str(results.part("gpu").get("name") or results.provenance.get("device")) for _, results in runs)
    harness = Counter(str(results.part("harness").get("version")) for _, results in runs)
    print(f"# Rows in their context: {len(runs)} run(s) on {dict(devices)}, harness {dict(harness)}\n")
    for title, table in (("Each row with a context, per regime", regimes_table(runs)),
                         ("What the warm and context regimes cost", cost_table(runs)),
                         ("Each regime's sampling time", sampling_table(runs)),
                         ("A/A in context (the dial, candidate = baseline)", aa_table(runs))):
        print(f"## {title}\n")
        print("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
