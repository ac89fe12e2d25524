"""Standalone GPU check of the two issue-17 tasks (run by new_tasks.sh, not by the harness).

For each task: build both sides the way the task.toml assumes the build kinds will (tvm-ffi:
tvm_ffi.cpp.load of <side>/export.cu with the one flag list, the row's template arguments in a
generated kp_template_args.h; cutedsl/triton: import <side>/kernel.py), then per row: fresh case,
each side once on fresh copies (in-place inputs cloned, outputs NaN-poisoned), compare against the
adapter's reference, check untouched inputs, then time both sides (CUDA events over N
back-to-back calls, N doubled until a sample takes >= 1 ms, 15 samples, median). One table.

usage: python new_tasks_check.py [all | prod | smoke]
"""

from __future__ import annotations

import hashlib
import importlib.util
import statistics
import sys
import time
import tomllib
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TASKS = ("h200_diffusion_qknorm_rope__multi_shape", "h200_diffusion_cutedsl_norm_scale_shift__multi_shape")
CPP_NAMES = {"bfloat16": "bf16_t", "float16": "fp16_t", "float32": "fp32_t"}


def load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def template_args(build: dict, row: dict) -> str:
    def cpp(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        return CPP_NAMES.get(value, str(value))

    return ", ".join(cpp(row[key]) for key in build["template"])


_built: dict[tuple[str, str, str], object] = {}


def build_tvm_ffi(task: Path, build: dict, side: str, row: dict):
    import tvm_ffi.cpp

    args = template_args(build, row)
    key = (task.name, side, args)
    if key not in _built:
        tag = hashlib.sha256(f"{task.name}|{side}|{args}".encode()).hexdigest()[:12]
        out = Path("/tmp/kp-build") / tag
        out.mkdir(parents=True, exist_ok=True)
        (out / "kp_template_args.h").write_text(f"#define KP_TEMPLATE_ARGS {args}\n")
        folder = task / ("baseline" if side == "baseline" else "solution")
        started = time.time()
        _built[key] = tvm_ffi.cpp.load(
            f"kp_{side}_{tag}",
            cuda_files=[str(folder / src) for src in build["sources"]],
            extra_cuda_cflags=list(build["flags"]),
            extra_include_paths=[str(out), str(folder)] + [str(folder / inc) for inc in build.get("include_dirs", [])],
            build_directory=str(out),
        )
        print(f"  built {side} <{args}> in {time.time() - started:.1f} s", flush=True)
    return _built[key]


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
    spec = tomllib.loads((task / "task.toml").read_text())
    build = spec["build"]
    adapter = load_file(f"kp_adapter_{task.name}", task / "bench" / "adapter.py")
    data = tomllib.loads((task / "bench" / "workloads.toml").read_text())
    rows = [{**data.get("defaults", {}), **row} for row in data["workload"]]
    if which == "prod":
        rows = [row for row in rows if row.get("production")]
    elif which == "smoke":
        rows = [row for row in rows if row.get("smoke") or row.get("production")]
    if build["kind"] == "cutedsl":
        sides = {
            "baseline": load_file(f"kp_baseline_{task.name}", task / "baseline" / f"{build['entry']}.py"),
            "candidate": load_file(f"kp_candidate_{task.name}", task / "solution" / f"{build['entry']}.py"),
        }
    table = []
    for row in rows:
        try:
            if build["kind"] == "tvm-ffi":
                sides = {side: build_tvm_ffi(task, build, side, row) for side in ("baseline", "candidate")}
            adapter.bind(baseline=sides["baseline"], candidate=sides["candidate"])
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
