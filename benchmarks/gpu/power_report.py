"""Read benchmarks/gpu/power.py's runs: verdict rates of the dial's rows, and the same samples under other rules.

    python3 benchmarks/gpu/power_report.py DIR/power [DIR2/power ...] [--tag runs] [--floors 0,0.1,0.2,0.3,0.75]

Several folders (one per GPU of a host that ran copies at once: power_pairs.sh's pairs.tgz each, unpacked) are read
as one set of runs.

Per row size and dial level: how many row-runs read SLOWER / SAME / FASTER under the harness that ran them (its
own verdict, from results.json), the measured extra time (candidate median - baseline median, µs and % of the
baseline's), and the spread of the A/A rows' medians between runs (each run is a fresh process pair). Then the power
curve (issue 25): per row size, the smallest measured change read SLOWER in at least 95 % of its row-runs, every
larger one too, with its one-sided 95 % lower bound (Clopper-Pearson) and the A/A rows' verdicts. Where the runs
kept the audit on (power_pairs.sh's POWER_AUDIT=on), how Nsight Compute read the two sides' kernels. Then every
row-run's raw samples judged again by kpremote.agent.harness.stats.row_verdict with each process floor in --floors, so one
call's samples show what a different floor would trade between the A/A false-verdict rate and the power.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kpremote.agent.harness import stats  # noqa: E402


def load(folder: Path) -> list[dict]:
    """One entry per row-run: run, size, level, verdict, speedup, medians, samples."""
    found = []
    for run in sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
        results = run / "results.json"
        if not results.exists():
            continue
        samples: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for line in (run / "samples.jsonl").read_text().splitlines() if (run / "samples.jsonl").exists() else []:
            entry = json.loads(line)
            if entry.get("regime", "cold") == "cold":  # a row with a context has warm and context samples too
                samples[entry["workload"]][entry["side"]] = entry["times"]
        for row in json.loads(results.read_text())["rows"]:
            size, _, level = row["workload"].partition("_")
            timed = samples.get(row["workload"], {})
            if row.get("status") != "PASSED" or len(timed) != 2:
                found.append({"run": run.name, "size": size, "level": level, "verdict": row.get("status"),
                              "invalid": row.get("invalid")})
                continue
            base, cand = statistics.median(timed["baseline"]), statistics.median(timed["candidate"])
            found.append({"run": run.name, "size": size, "level": level, "verdict": (row.get("verdict") or {}).get(
                "verdict"), "invalid": row.get("invalid"), "baseline": base, "candidate": cand, "samples": timed,
                "audit": row.get("audit")})
    return found


def table(entries: list[dict]) -> list[str]:
    lines = ["| size | level | row-runs | SLOWER | SAME | FASTER | other | extra µs (mean) | extra % | baseline median µs "
             "(min-max over runs) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for entry in entries:
        groups[(entry["size"], entry["level"])].append(entry)
    for (size, level), group in sorted(groups.items()):
        timed = [e for e in group if "baseline" in e]
        count = {v: sum(1 for e in group if e["verdict"] == v) for v in ("SLOWER", "SAME", "FASTER")}
        other = len(group) - sum(count.values())
        extra = [e["candidate"] - e["baseline"] for e in timed]
        share = [100 * (e["candidate"] / e["baseline"] - 1) for e in timed]
        bases = [e["baseline"] for e in timed]
        lines.append(f"| {size} | {level} | {len(group)} | {count['SLOWER']} | {count['SAME']} | {count['FASTER']} | "
                     f"{other} | {statistics.mean(extra) if extra else float('nan'):+.3f} | "
                     f"{statistics.mean(share) if share else float('nan'):+.2f} | "
                     f"{statistics.median(bases) if bases else float('nan'):.3f} ({min(bases, default=0):.3f}-"
                     f"{max(bases, default=0):.3f}) |")
    return lines


def lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided lower confidence bound of a rate seen k times in n (Clopper-Pearson): 14 of 14 -> 0.807."""
    if k == 0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(60):  # bisect p where P(X >= k | n, p) = 1 - confidence
        p = (low + high) / 2
        tail = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
        low, high = (p, high) if tail < 1 - confidence else (low, p)
    return low


def curve(entries: list[dict], power: float = 0.95) -> list[str]:
    """The power curve: per row size, the smallest measured change read SLOWER in at least `power` of its row-runs
    (every larger change too), with the levels below it; and the A/A rows' verdicts."""
    lines = ["| size | baseline median µs | smallest change SLOWER in >= 95 % of runs | its runs (95 % lower bound) | "
             "smaller changes | A/A rows |", "|---|---:|---|---|---|---|"]
    sizes: dict[str, list[dict]] = defaultdict(list)
    for entry in entries:
        sizes[entry["size"]].append(entry)
    for size, group in sorted(sizes.items(), key=lambda item: statistics.median(
            [e["baseline"] for e in item[1] if "baseline" in e] or [0])):
        levels: dict[str, list[dict]] = defaultdict(list)
        for entry in group:
            levels[entry["level"]].append(entry)
        aa = [e for level, runs in levels.items() if level.startswith("aa") for e in runs]
        dials = []
        for level, runs in levels.items():
            timed = [e for e in runs if "baseline" in e]
            if level.startswith("aa") or not timed:
                continue
            share = statistics.mean(100 * (e["candidate"] / e["baseline"] - 1) for e in timed)
            slower = sum(1 for e in runs if e["verdict"] == "SLOWER")
            dials.append((share, slower, len(runs)))
        dials.sort()
        seen = None
        for index, (share, slower, n) in enumerate(dials):
            if all(k >= power * m for _, k, m in dials[index:]):
                seen = index
                break
        found = (f"+{dials[seen][0]:.1f} %" if seen is not None else
                 f"none up to +{dials[-1][0]:.1f} %" if dials else "no dial rows")
        runs = (f"{dials[seen][1]} of {dials[seen][2]} ({100 * lower_bound(dials[seen][1], dials[seen][2]):.0f} %)"
                if seen is not None else "")
        below = ", ".join(f"+{share:.1f} %: {k} of {n}" for share, k, n in dials[:seen if seen is not None else None])
        same = sum(1 for e in aa if e["verdict"] == "SAME")
        false = sum(1 for e in aa if e["verdict"] in ("FASTER", "SLOWER"))
        base = statistics.median([e["baseline"] for e in group if "baseline" in e] or [float("nan")])
        lines.append(f"| {size} | {base:.2f} | {found} | {runs} | {below} | {same} of {len(aa)} SAME, {false} "
                     f"FASTER or SLOWER |")
    return lines


def audit_relations(entries: list[dict]) -> list[str]:
    """Rows audited by Nsight Compute (POWER_AUDIT=on): per size and level, the ratio of the two sides' kernel times
    as ncu read them (baseline / candidate: on A/A rows, ncu's own noise between two processes of one kernel) and how
    many µs more the candidate's window holds beyond its kernels than the baseline's (a forge below the seal makes it
    negative); min, median and max over the row-runs."""
    lines = ["| size | level | audited | ncu baseline / candidate (min, median, max) | candidate's window beyond its "
             "kernels - baseline's, µs (min, median, max) |", "|---|---|---:|---|---|"]
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for entry in entries:
        sides = (entry.get("audit") or {}).get("sides") or {}
        base, cand = sides.get("baseline") or {}, sides.get("candidate") or {}
        if not (base.get("ncu_us") and cand.get("ncu_us") and base.get("harness_us") and cand.get("harness_us")):
            continue
        beyond = (cand["harness_us"] - cand["ncu_us"]) - (base["harness_us"] - base["ncu_us"])
        groups[(entry["size"], entry["level"])].append((base["ncu_us"] / cand["ncu_us"], beyond))
    spread = lambda v, f: f"{f.format(min(v))}, {f.format(statistics.median(v))}, {f.format(max(v))}"  # noqa: E731
    for (size, level), found in sorted(groups.items()):
        ratios, beyond = [r for r, _ in found], [b for _, b in found]
        lines.append(f"| {size} | {level} | {len(found)} | {spread(ratios, '{:.3f}')} | {spread(beyond, '{:+.2f}')} |")
    return lines if groups else []


def rejudged(entries: list[dict], floors: list[float]) -> list[str]:
    lines = ["| floor µs | size | level | SLOWER | SAME | FASTER |", "|---:|---|---|---:|---:|---:|"]
    for floor in floors:
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for entry in entries:
            if "samples" not in entry:
                continue
            verdict = stats.row_verdict(entry["samples"]["baseline"], entry["samples"]["candidate"],
                                        process_floor_us=floor)["verdict"]
            groups[(entry["size"], entry["level"])].append(verdict)
        for (size, level), verdicts in sorted(groups.items()):
            lines.append(f"| {floor:g} | {size} | {level} | {verdicts.count('SLOWER')} | {verdicts.count('SAME')} | "
                         f"{verdicts.count('FASTER')} |")
    return lines


def cost(folders: list[Path]) -> list[str]:
    """Wall seconds: whole runs (run.json) and rows after the first (each row's `seconds`; the first starts the
    judge and every side process)."""
    runs, rows, first = [], [], []
    for run in (p for folder in folders for p in folder.iterdir() if p.is_dir()):
        if (run / "run.json").exists():
            runs.append(json.loads((run / "run.json").read_text())["wall_s"])
        if (run / "results.json").exists():
            seconds = [r.get("seconds") for r in json.loads((run / "results.json").read_text())["rows"]]
            first += seconds[:1]
            rows += [s for s in seconds[1:] if s]
    mean = lambda v: statistics.mean(v) if v else float("nan")  # noqa: E731
    return [f"runs {len(runs)}: whole run {mean(runs):.1f} s (mean); first row {mean(first):.2f} s; "
            f"later rows {mean(rows):.3f} s (mean of {len(rows)})"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu/power_report.py")
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--tag", default="runs")
    parser.add_argument("--floors", default="0,0.1,0.2,0.3,0.75")
    args = parser.parse_args(argv)
    folders = [folder / args.tag for folder in args.folders if (folder / args.tag).is_dir()]
    entries = [{**entry, "run": f"{i}/{entry['run']}"} for i, folder in enumerate(folders) for entry in load(folder)]
    print("\n".join(cost(folders)))
    print()
    print("\n".join(table(entries)))
    print()
    print("\n".join(curve(entries)))
    print()
    if audit_relations(entries):
        print("\n".join(audit_relations(entries)))
        print()
    print("\n".join(rejudged(entries, [float(f) for f in args.floors.split(",")])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
