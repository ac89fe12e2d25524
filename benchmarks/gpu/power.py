"""What the harness can see on small and large rows (issue 25): the dial task's power curve and its A/A rate.

    python3 benchmarks/gpu/power.py calibrate            -> $OUT/power/calibration.json, the task's workloads.toml
    python3 benchmarks/gpu/power.py runs --seconds 360   -> $OUT/power/runs/<i>/{results.json,samples.jsonl}
    python3 benchmarks/gpu/power.py probe                -> $OUT/power/probe.json (each process's empty window)
    python3 benchmarks/gpu/power_report.py $OUT/power    (here, after the call): verdict rates per row size and cost
    ROWS=power|aa bash benchmarks/gpu/power_pairs.sh     (one device call: runs alternating one and four process
                                                          pairs per side, rows from bench/workloads.h200-*.toml)

The dial task (benchmarks/gpu/dial/) times the baseline's fused scale-and-shift kernel against itself (A/A rows,
spin 0) and against itself plus `spin` dependent multiply-adds in its last program (+2 %, +5 %, +10 % of the row's
time). `calibrate` measures, on this GPU, each row size's window (the harness's way: L2 flushed, a head start, one
event pair) and the µs per spin step, and writes the rows: three sizes (~4, ~15, ~200 µs) x (aa1, aa2, d2, d5,
d10). POWER_ROW_US (e.g. `s4=6.88,s15=17.62`) takes a size's row time from the harness's own results on this host
instead (its window holds more than calibrate's on some hosts: the four-GPU H200's 6.9 us against 5.2), so +5 % is
5 % of what the harness reads; POWER_KEEP (e.g. `s4_aa1,s4_d5,s15_d2`) writes only those rows. `runs` starts `python -m kpremote.agent.run.runner` (audit off) on the whole task again and again until the time
is spent: every run has fresh side processes, so the A/A rows show each process pair's own offset; with POWER_AGENT
(a folder holding another commit's kpremote/, e.g. .gpustage/h27 from `bash benchmarks/gpu/cost_27.sh pack`) it runs
that commit's runner instead, so one call can time the same rows under harness 2.7 and this one. `probe` times an
empty event pair and a one-block kernel the harness's way in several fresh processes, and a dial kernel under ncu.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIAL = REPO / "benchmarks" / "gpu" / "dial"
SIZES = {"s4": 393_216, "s15": 3_670_016, "s200": 62_914_560}  # float32 elements per tensor
LEVELS = {"aa1": 0.0, "aa2": 0.0, "d2": 0.02, "d5": 0.05, "d10": 0.10}
RUNNER_OF_27 = "kpremote.agent.runner"  # the runner's module before agent/ had folders (POWER_AGENT: 2.7's tree)
HEAD_START_CYCLES = 100_000  # ~50 us at the H200's clocks: the call is queued before its start event runs


def out_dir() -> Path:
    folder = Path(os.environ.get("OUT", "/tmp/kp-power")) / "power"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def work_task() -> Path:
    task = Path(os.environ.get("POWER_WORK", "/tmp/kp-power")) / "kernels" / "dial"
    if not task.exists():
        shutil.copytree(DIAL, task)
    return task


# --------------------------------------------------------------------------------------------- calibrate


def window_us(fn, flusher, samples: int = 60) -> float:
    """Median event window of fn() the harness's way: flush, head start, one event pair."""
    import torch

    times = []
    for _ in range(samples):
        flusher.flush()
        torch.cuda._sleep(HEAD_START_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def calibrate() -> dict:
    import importlib.util

    import torch

    sys.path.insert(0, str(REPO))
    from kpremote.agent.harness.timing import L2Flusher, l2_bytes_of_device

    spec = importlib.util.spec_from_file_location("dial_solution", DIAL / "solution" / "kernel.py",
                                                  submodule_search_locations=[str(DIAL / "solution")])
    solution = importlib.util.module_from_spec(spec)
    sys.modules["dial_solution"] = solution
    spec.loader.exec_module(solution)
    flusher = L2Flusher(l2_bytes_of_device())
    found: dict = {"gpu": torch.cuda.get_device_name(), "sizes": {}}
    row_us = dict((pair.split("=")[0], float(pair.split("=")[1]))
                  for pair in os.environ.get("POWER_ROW_US", "").split(",") if pair)
    keep = set(filter(None, os.environ.get("POWER_KEEP", "").split(",")))
    for name, n in SIZES.items():
        x, scale, shift, out = (torch.randn(n, device="cuda") for _ in range(4))
        call = lambda spin=0: solution.scale_shift(x, scale, shift, out, spin=spin)  # noqa: E731
        for spin in (0, 4096, 16384):
            call(spin)
        torch.cuda.synchronize()
        base = window_us(call, flusher)
        steps = 16384
        slope = (window_us(lambda: call(steps), flusher) - window_us(lambda: call(0), flusher)) / steps
        rows = {}
        row = row_us.get(name, base)  # the row's time the shares are of
        for level, share in LEVELS.items():
            if keep and f"{name}_{level}" not in keep:
                continue
            spin = int(round(share * row / slope)) if share else 0
            measured = window_us(lambda: call(spin), flusher) if spin else base
            rows[level] = {"spin": spin, "target_us": round(share * row, 4), "window_us": round(measured, 4)}
        found["sizes"][name] = {"n": n, "window_us": round(base, 4), "row_us": row, "us_per_spin": slope,
                                "rows": rows}
        del x, scale, shift, out
    task = work_task()
    lines = ["# written by benchmarks/gpu/power.py calibrate on " + found["gpu"], "[defaults]", "production = true",
             'preset = "dial"', ""]
    for name, size in found["sizes"].items():
        for level, row in size["rows"].items():
            lines += ["[[workload]]", f'id = "{name}_{level}"', f"n = {size['n']}", f"spin = {row['spin']}", ""]
    (task / "bench" / "workloads.toml").write_text("\n".join(lines))
    (out_dir() / "calibration.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found, indent=1))
    return found


# --------------------------------------------------------------------------------------------- runs


def runner_module(agent: str | None) -> str:
    """The runner's module in this tree or in another commit's (2.7's before agent/ had folders, 2.16's after)."""
    if agent and not (Path(agent) / "kpremote" / "agent" / "run" / "runner.py").is_file():
        return RUNNER_OF_27
    return "kpremote.agent.run.runner"


def runs(seconds: float, audit: str, workloads: str | None, tag: str) -> None:
    task = work_task()
    agent = os.environ.get("POWER_AGENT")  # another commit's tree (its kpremote/): harness 2.7's, .gpustage/h27
    root = Path(os.environ.get("POWER_ROOT") or Path(os.environ.get("POWER_WORK", "/tmp/kp-power")) / "root")
    folder = out_dir() / tag
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline:
        index += 1
        run_dir = Path(os.environ.get("POWER_WORK", "/tmp/kp-power")) / "runs" / f"{tag}-{index}"
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [sys.executable, "-m", runner_module(agent), "--task-dir", str(task),
                   "--run-dir", str(run_dir), "--device", os.environ.get("POWER_DEVICE", "cuda"), "--root", str(root),
                   "--audit", audit]
        if workloads:
            command += ["--workloads", workloads]
        if os.environ.get("POWER_GPU"):  # one GPU of a host that runs several copies at once
            command += ["--gpu", os.environ["POWER_GPU"]]
        started = time.monotonic()
        left = deadline - started
        try:
            done = subprocess.run(command, cwd=agent or REPO, env={**os.environ, "PYTHONPATH": agent} if agent else None,
                                  capture_output=True, text=True,
                                  timeout=max(left + 60, float(os.environ.get("POWER_RUN_LIMIT_S", 120))))
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        wall = time.monotonic() - started
        keep = folder / str(index)
        keep.mkdir(parents=True, exist_ok=True)
        for name in ("summary/results.json", "raw/samples.jsonl", "summary/results.md"):
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, keep / Path(name).name)
        (keep / "run.json").write_text(json.dumps({"exit": code, "wall_s": round(wall, 2)}))
        print(f"{tag} run {index}: exit {code}, {wall:.1f} s", flush=True)
        if code == "timeout":
            break


# --------------------------------------------------------------------------------------------- probe


PROBE_ONE = r"""
import json, statistics, sys, torch
sys.path.insert(0, sys.argv[1])
from kpremote.agent.harness.timing import L2Flusher, l2_bytes_of_device
flusher = L2Flusher(l2_bytes_of_device())
one = torch.zeros(1, device="cuda")
def window(fn, k=200):
    t = []
    for _ in range(k):
        flusher.flush(); torch.cuda._sleep(100000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); t.append(a.elapsed_time(b) * 1000.0)
    return {"median": statistics.median(t), "p10": sorted(t)[len(t) // 10], "min": min(t)}
one.add_(1.0); torch.cuda.synchronize()
print(json.dumps({"empty": window(lambda: None), "one_kernel": window(lambda: one.add_(1.0))}))
"""


def probe(processes: int) -> None:
    found = []
    for _ in range(processes):
        done = subprocess.run([sys.executable, "-c", PROBE_ONE, str(REPO)], capture_output=True, text=True, timeout=120)
        found.append(json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else
                     {"error": done.stderr[-2000:]})
    (out_dir() / "probe.json").write_text(json.dumps(found, indent=1))
    print(json.dumps(found))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu/power.py")
    parser.add_argument("step", choices=("calibrate", "runs", "probe"))
    parser.add_argument("--seconds", type=float, default=360.0)
    parser.add_argument("--audit", default="off")
    parser.add_argument("--workloads")
    parser.add_argument("--tag", default="runs")
    parser.add_argument("--processes", type=int, default=6)
    args = parser.parse_args(argv)
    if args.step == "calibrate":
        calibrate()
    elif args.step == "runs":
        runs(args.seconds, args.audit, args.workloads, args.tag)
    else:
        probe(args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
