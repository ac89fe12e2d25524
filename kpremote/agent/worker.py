"""One piece of a run in its own process, so a hang or a crash costs that piece and not the run.

    python -m kpremote.agent.worker prepare  --job JOB.json --out RESULT.json   toolchain, both builds, device probe
    python -m kpremote.agent.worker workload --job JOB.json --out RESULT.json   correctness, then (if PASSED) timing

The runner writes the job, starts the worker in its own process group (so a cancel reaches it), enforces the
timeout, and reads the result. A workload worker touches job["ready_path"] once torch, both sides and the
adapter are imported: the workload's timeout counts from there, so a slow interpreter start on a busy host
never turns into a TIMEOUT.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

from . import build, correctness, timing
from .atomicfile import write_json_atomically
from .correctness import ERROR, INCORRECT, PASSED
from .runstate import DISK_FULL_EXIT, is_disk_full
from .taskspec import SIDES, TaskSpec, Workload, load_task


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.worker")
    parser.add_argument("what", choices=("prepare", "workload"))
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    try:
        result = prepare(job) if args.what == "prepare" else run_workload(job)
    except Exception as exc:  # noqa: BLE001 - the runner gets a result it can show, never just a dead process
        result = {"status": ERROR, "message": f"worker: {type(exc).__name__}: {exc}", "where": "worker",
                  "traceback": traceback.format_exc()}
    try:
        write_json_atomically(args.out, result, indent=1)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        return DISK_FULL_EXIT  # no room for a result: the exit code is the one message that gets through
    return 0


# --------------------------------------------------------------------------------------------- prepare


def prepare(job: dict[str, Any]) -> dict[str, Any]:
    spec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
    device = job["device"]
    record = build.build_sides(spec, Path(job["run_dir"]), device)
    result: dict[str, Any] = {"versions": build.toolchain_versions(), "build": record.to_json(), "device": None}
    if record.ok and not record.compile_only:
        result["device"] = probe_device(device)
    return result


def probe_device(device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info = {
            "name": props.name,
            "cc": [props.major, props.minor],
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": timing.l2_bytes_of_device(),
        }
    else:
        info = {"name": platform.processor() or platform.machine() or "cpu", "cc": None, "l2_bytes": None}
    info["copy_bandwidth"] = timing.measure_copy_bandwidth(device)
    return info


# --------------------------------------------------------------------------------------------- workload


def run_workload(job: dict[str, Any]) -> dict[str, Any]:
    spec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
    workload = next(w for w in spec.workloads if w.id == job["workload"])
    device = "cuda" if job["device"].startswith("cuda") else "cpu"
    try:
        adapter = _bound_adapter(spec, job.get("modules") or {})
    except Exception as exc:  # noqa: BLE001 - a task that does not import is this row's ERROR
        return {"status": ERROR, "message": f"import: {type(exc).__name__}: {exc}", "where": "import",
                "traceback": traceback.format_exc()}
    Path(job["ready_path"]).touch()
    verdict = correctness.check_workload(
        adapter, workload.params, device=device, seeds=spec.timing.seeds, atol=workload.atol, rtol=workload.rtol
    )
    result: dict[str, Any] = {
        "status": verdict.status,
        "message": verdict.message,
        "where": verdict.where,
        "correctness": verdict.to_json(),
        "timing": None,
    }
    if verdict.status != PASSED:
        return result  # nothing is timed for a row that is not correct
    try:
        result.update(_time_workload(spec, workload, adapter, job, device))
    except Exception as exc:  # noqa: BLE001
        result.update(status=ERROR, message=f"timing: {type(exc).__name__}: {exc}", where="timing",
                      traceback=traceback.format_exc())
    return result


def _bound_adapter(spec: TaskSpec, module_files: dict[str, str | None]) -> Any:
    modules = {side: build.import_side(spec, side, module_files.get(side)) for side in SIDES}
    adapter = build.import_adapter(spec)
    if callable(getattr(adapter, "bind", None)):
        adapter.bind(baseline=modules["baseline"], candidate=modules["candidate"])
    return adapter


def _time_workload(spec: TaskSpec, workload: Workload, adapter: Any, job: dict[str, Any], device: str) -> dict[str, Any]:
    params = workload.params
    seed = int(params.get("seed", 0)) + spec.timing.seeds  # fresh inputs, unlike any correctness seed
    case = adapter.make_case(params, device=device, seed=seed)
    calls = {
        "baseline": lambda: adapter.call_baseline(params, case.inputs, case.outputs_baseline),
        "candidate": lambda: adapter.call_candidate(params, case.inputs, case.outputs_candidate),
    }
    outputs = {"baseline": case.outputs_baseline, "candidate": case.outputs_candidate}
    bytes_moved = case.bytes_moved
    if bytes_moved is None and callable(getattr(adapter, "bytes_moved", None)):
        bytes_moved = adapter.bytes_moved(params)
    if device == "cpu":
        pair = timing.time_pair_smoke(calls["baseline"], calls["candidate"])
    else:
        # A side whose work is not on the current stream would be timed as a fiction: it is not timed at all.
        for side in ("candidate", "baseline"):
            reason = timing.stream_check(calls[side], outputs[side], correctness.poison_outputs)
            if reason:
                return _implausible(side, reason, {"timing": None, "bytes_moved": bytes_moved})
        gpu = job.get("gpu") or {}
        clock, clock_check = timing.ClockGuard.for_gpu(gpu.get("uuid"), gpu.get("sm_clock_max_mhz"))
        pair = timing.time_pair_cuda(calls["baseline"], calls["candidate"], spec.timing, clock=clock,
                                     clock_check=clock_check, l2_bytes=job.get("l2_bytes"))
    medians = {side: getattr(pair, side).to_json().get("median") for side in SIDES}
    result: dict[str, Any] = {
        "timing": pair.to_json(),
        "samples": {"baseline": pair.baseline.times_us, "candidate": pair.candidate.times_us},
        "bytes_moved": bytes_moved,
        "flops": case.flops,
        "gbps": {side: timing.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
        "implausible": None,
    }
    if pair.mode == "cold":  # with a warm L2 (graph mode) beating DRAM bandwidth is legitimate
        for side in ("candidate", "baseline"):
            reason = timing.bandwidth_check(bytes_moved, medians[side], job.get("copy_gbps"))
            if reason:
                return _implausible(side, reason, result)
    return result


def _implausible(side: str, reason: str, result: dict[str, Any]) -> dict[str, Any]:
    """Work off the current stream breaks the contract: the candidate's row fails; a baseline doing it voids the row."""
    return {**result, "status": INCORRECT if side == "candidate" else ERROR, "implausible": f"{side}: {reason}",
            "message": f"{side}: {reason}", "where": f"timing, {side}"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
