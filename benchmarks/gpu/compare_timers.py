"""The same kernels timed three ways in one GPU session: kpremote's harness, triton.testing.do_bench, Nsight Compute.

Runs on the GPU machine (benchmarks/gpu/h200_timers.sh drives it). Modes:
  dobench  --task-dir D --workloads a,b --repeats 5 --out F.json
           each (workload, side) timed by do_bench (median, cache cleared between calls by do_bench itself)
           `repeats` times; writes the medians.
  ncu      --task-dir D --workloads a,b --calls 5
           warms up outside the profiled range, then calls each (workload, side) `calls` times between
           cudaProfilerStart/Stop, so `ncu --profile-from-start off` sees exactly those launches, in order.
  report   --harness R1.json,R2.json,... --dobench F.json --ncu-csv C.csv --workloads a,b --calls 5
           the table for benchmarks/README.md: per workload, the spread of medians over the harness runs and over
           the do_bench repeats, and the harness median against the median of ncu's gpu__time_duration.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SIDES = ("baseline", "candidate")


def bound_calls(task_dir: Path, workload_ids: list[str]):
    """(workload id, side) -> a zero-argument call, built and bound exactly as the harness's worker does."""
    from kpremote.agent.task import build, taskspec

    spec = taskspec.load_task(task_dir)
    record = build.build_sides(spec, Path(tempfile.mkdtemp(prefix="kp-timers-")), "cuda")
    modules = {side: build.import_side(spec, side, record.sides[side].module if side in record.sides else None)
               for side in SIDES}
    adapter = build.import_adapter(spec)
    if callable(getattr(adapter, "bind", None)):
        adapter.bind(baseline=modules["baseline"], candidate=modules["candidate"])
    calls = {}
    for workload in spec.select(workload_ids):
        params = workload.params
        case = adapter.make_case(params, device="cuda", seed=int(params.get("seed", 0)) + spec.timing.seeds)
        calls[(workload.id, "baseline")] = (lambda p=params, c=case: adapter.call_baseline(p, c.inputs, c.outputs_baseline))
        calls[(workload.id, "candidate")] = (lambda p=params, c=case: adapter.call_candidate(p, c.inputs, c.outputs_candidate))
    return calls


def run_dobench(args) -> None:
    import triton.testing

    calls = bound_calls(Path(args.task_dir), args.workloads.split(","))
    medians = {f"{w}/{s}": [triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000.0
                           for _ in range(args.repeats)] for (w, s), fn in calls.items()}
    Path(args.out).write_text(json.dumps(medians, indent=1))


def run_ncu_target(args) -> None:
    import torch

    calls = bound_calls(Path(args.task_dir), args.workloads.split(","))
    for fn in calls.values():  # JIT and first-touch outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in calls.values():
        for _ in range(args.calls):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(json.dumps([f"{w}/{s}" for (w, s) in calls]))


def harness_medians(paths: list[str]) -> dict[str, list[float]]:
    medians: dict[str, list[float]] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            timing = row.get("timing") or {}
            for side in SIDES:
                if timing.get(side):
                    medians.setdefault(f"{row['workload']}/{side}", []).append(timing[side]["median"])
    return medians


def ncu_durations(csv_path: str, order: list[str], calls: int) -> dict[str, list[float]]:
    """gpu__time_duration per launch, in launch order (one kernel per call), in µs."""
    lines = Path(csv_path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[start:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
    values = [float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "nsecond"), 1e-3)
              for r in rows]
    if len(values) != len(order) * calls:
        raise SystemExit(f"ncu saw {len(values)} kernels, expected {len(order) * calls}: one kernel per call?")
    return {key: values[i * calls:(i + 1) * calls] for i, key in enumerate(order)}


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1.0


def report(args) -> None:
    harness = harness_medians(args.harness.split(","))
    dobench = json.loads(Path(args.dobench).read_text()) if args.dobench else {}
    order = json.loads(Path(args.order).read_text()) if args.order else []
    ncu = ncu_durations(args.ncu_csv, order, args.calls) if args.ncu_csv else {}
    print(f"| workload / side | harness median µs (runs) | harness spread | do_bench median µs | do_bench spread "
          f"| ncu gpu__time_duration µs | harness / ncu |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(harness):
        h, d, n = harness[key], dobench.get(key, []), ncu.get(key, [])
        h_med = statistics.median(h)
        cells = [key, f"{h_med:.2f} ({len(h)})", f"{spread(h) * 100:.2f} %"]
        cells += [f"{statistics.median(d):.2f}", f"{spread(d) * 100:.2f} %"] if d else ["-", "-"]
        cells += [f"{statistics.median(n):.2f}", f"{h_med / statistics.median(n):.3f}"] if n else ["-", "-"]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("dobench", "ncu", "report"))
    parser.add_argument("--task-dir")
    parser.add_argument("--workloads", default="")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--harness", default="")
    parser.add_argument("--dobench")
    parser.add_argument("--ncu-csv")
    parser.add_argument("--order")
    args = parser.parse_args()
    {"dobench": run_dobench, "ncu": run_ncu_target, "report": report}[args.mode](args)


if __name__ == "__main__":
    main()
