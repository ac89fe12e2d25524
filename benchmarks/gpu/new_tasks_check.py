"""Standalone GPU check of the new tasks (run by new_tasks.sh, not by the harness): KP_TASKS (comma-separated
task folder names) or, by default, every task that new_tasks.sh lists.

For each task: load task.toml with kpremote's own validation (kpremote.agent.task.taskspec) and build both
sides with kpremote's own builders (kpremote.agent.task.build / builders: tvm-ffi through the generated
unit and `exports`, the row's template arguments from the adapter; cutedsl / triton: <side>/kernel.py
imported by the one loader), exactly as a harness run would; then per row: fresh case, each side once
on fresh copies (in-place inputs cloned, outputs NaN-poisoned), compare against the adapter's
reference, check untouched inputs, then time both sides (CUDA events over N back-to-back calls, N
doubled until a sample takes >= 1 ms, 15 samples, median). One table. This is a debugging aid for the
tasks, not the harness's numbers.

usage: python new_tasks_check.py [all | prod | smoke]
"""

from __future__ import annotations

import os
import statistics
import sys
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kpremote.agent.task import build  # after the repository is on the path
from kpremote.agent.task.taskspec import SIDES, load_task

# The tasks added since issue 17 (GPU validation not yet done by the harness); new_tasks.sh passes KP_TASKS.
NEW_TASKS = ("h200_diffusion_qknorm_rope__multi_shape", "h200_diffusion_cutedsl_norm_scale_shift__multi_shape",
             "h200_diffusion_group_norm_silu__multi_shape", "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape")
TASKS = tuple(t for t in os.environ.get("KP_TASKS", ",".join(NEW_TASKS)).split(",") if t)
BUILD_ROOT = Path("/tmp/kp-check")


def built_sides(task: Path) -> dict:
    """Both sides through kpremote's builders on the GPU; the build log of a side that failed is printed."""
    spec = load_task(task)
    run_dir = BUILD_ROOT / task.name
    record = build.build_sides(spec, run_dir, "cuda")
    for side, result in record.sides.items():
        print(f"  {side}: {result.kind} via {result.builder}: {'ok' if result.ok else result.error} "
              f"({result.seconds:.1f} s)", flush=True)
        if not result.ok:
            print((run_dir / result.log).read_text()[-4000:], flush=True)
    if not record.ok:
        raise RuntimeError(f"{task.name}: build failed")
    return {side: build.import_side(spec, side, record.sides[side].module) for side in SIDES}


def fresh(case, side: str, mutates: list[str]):
    inputs = dict(case.inputs)
    for name in mutates:
        inputs[name] = case.inputs[name].clone()
    outputs = getattr(case, f"outputs_{side}")
    for tensor in outputs.values():
        tensor.fill_(float("nan") if tensor.is_floating_point() else -17)
    return inputs, outputs


def compare(got: dict, ref: dict, atol: float, rtol: float) -> str | None:
    for name, expected in ref.items():
        value = got[name].double()
        if not torch.isfinite(value).all():
            return f"{name}: non-finite"
        err = (value - expected).abs()
        bound = atol + rtol * expected.abs()
        if not (err <= bound).all():
            worst = int((err - bound).argmax())
            return f"{name}[{worst}]: got {value.flatten()[worst].item():.5g} want {expected.flatten()[worst].item():.5g}"
    return None


def time_side(call) -> float:
    """Median microseconds of one call (N back-to-back calls per event-timed sample)."""
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 1
    while True:
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= 1.0 or n >= 4096:
            break
        n *= 2
    samples = []
    for _ in range(15):
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / n)
    return statistics.median(samples)


def run_task(task: Path, which: str) -> list[tuple]:
    spec = load_task(task)
    adapter = build.import_adapter(spec)
    rows = [{**w.params, "id": w.id, "production": w.production} for w in spec.workloads]
    if which == "prod":
        rows = [row for row in rows if row.get("production")]
    elif which == "smoke":
        rows = [row for row in rows if row.get("smoke") or row.get("production")]
    sides = built_sides(task)
    adapter.bind(baseline=sides["baseline"], candidate=sides["candidate"])
    table = []
    for row in rows:
        try:
            mutates = list(row.get("mutates", []))
            case = adapter.make_case(row, device="cuda", seed=int(row.get("seed", 0)))
            pristine = {k: v.clone() for k, v in case.inputs.items() if isinstance(v, torch.Tensor)}
            ref = adapter.reference(row, pristine)
            status = {}
            for side in ("baseline", "candidate"):
                inputs, outputs = fresh(case, side, mutates)
                getattr(adapter, f"call_{side}")(row, inputs, outputs)
                torch.cuda.synchronize()
                got = {**outputs, **{name: inputs[name] for name in mutates}}
                problem = compare(got, ref, case.atol, case.rtol)
                changed = [k for k, v in pristine.items() if k not in mutates and not torch.equal(v, case.inputs[k])]
                if changed:
                    problem = f"changed inputs {changed}"
                status[side] = problem
            times = {}
            if status["baseline"] is None and status["candidate"] is None:
                for side in ("baseline", "candidate"):
                    inputs, outputs = fresh(case, side, mutates)
                    call = getattr(adapter, f"call_{side}")
                    times[side] = time_side(lambda: call(row, inputs, outputs))
            table.append((task.name, row, status, times, case.bytes_moved))
        except Exception:
            traceback.print_exc()
            table.append((task.name, row, {"baseline": "ERROR", "candidate": "ERROR"}, {}, None))
        print_row(table[-1])
    return table


def print_row(entry: tuple) -> None:
    _, row, status, times, nbytes = entry
    verdict = "PASS" if not any(status.values()) else "FAIL"
    base, cand = times.get("baseline"), times.get("candidate")
    timing = ""
    if base and cand:
        gbps = f"{nbytes / cand / 1e3:7.0f} GB/s" if nbytes else ""
        timing = f"{base:9.2f} {cand:9.2f} {base / cand:6.2f}x {gbps}"
    prod = "P" if row.get("production") else " "
    print(f"{prod} {row['id'][:44]:44s} {verdict} {timing}", flush=True)
    for side, problem in status.items():
        if problem:
            print(f"    {side}: {problem}", flush=True)


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    print("  row                                          ok   base_us   cand_us  speedup  cand_bw", flush=True)
    failed = False
    for name in TASKS:
        print(f"== {name}", flush=True)
        table = run_task(REPO / "kernels" / name, which)
        speedups = [t[3]["baseline"] / t[3]["candidate"] for t in table if t[1].get("production") and t[3]]
        failed |= any(any(t[2].values()) for t in table)
        if speedups:
            geo = statistics.geometric_mean(speedups)
            print(f"   production geometric mean speedup {geo:.3f}x over {len(speedups)} rows", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
