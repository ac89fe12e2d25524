"""The prepare step of a run in its own process: device probe first, then both builds.

    python -m kpremote.agent.worker prepare --job JOB.json --out RESULT.json [--result-fd N]

The probe (device, copy bandwidth, the L2 flush probe) runs BEFORE any task code is imported and goes to the
runner through the inherited pipe N, which is closed before the builds start: whatever a side's code does
while it is imported or built here cannot reach the numbers the floors are made of. The build record goes to
RESULT.json as before. Workload rows run in the judge (judge.py), not here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

from . import build, floors, timing
from .atomicfile import write_json_atomically
from .correctness import ERROR
from .runstate import DISK_FULL_EXIT, is_disk_full
from .taskspec import SIDES, TaskSpec, load_task


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.worker")
    parser.add_argument("what", choices=("prepare",))
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--result-fd", type=int, help="pipe for the probe, written before any task code runs")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    try:
        result = prepare(job, args.result_fd)
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


def prepare(job: dict[str, Any], result_fd: int | None = None) -> dict[str, Any]:
    from . import guard

    guard.make_undumpable()
    spec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
    device = job["device"]
    probe = None
    if device.startswith("cuda"):
        probe = probe_device(device)  # before any task code is imported
    if result_fd is not None:
        _write_line(result_fd, {"probe": probe})
        os.close(result_fd)
    record = build.build_sides(spec, Path(job["run_dir"]), device)
    result: dict[str, Any] = {"versions": build.toolchain_versions(), "build": record.to_json(), "device": probe}
    if probe is None and record.ok and not record.compile_only:
        result["device"] = probe_device(device)  # a CPU run: nothing to protect, the numbers are meaningless
    return result


def _write_line(fd: int, value: dict[str, Any]) -> None:
    data = (json.dumps(value, default=str) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


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
    info["copy_bandwidth"] = floors.measure_copy_bandwidth(device)
    if device.startswith("cuda"):
        # Back-to-back copies of a working set a quarter of the L2: the floor for graph-mode rows that fit there.
        info["l2_copy_bandwidth"] = floors.measure_copy_bandwidth(device, max_bytes=max(1, info["l2_bytes"] // 8),
                                                                  copies=20)
        info["l2_flush_probe"] = timing.flush_probe(info["l2_bytes"])
    return info


# --------------------------------------------------------------------------------------------- in-process


def _bound_adapter(spec: TaskSpec, module_files: dict[str, str | None]) -> Any:
    modules = {side: build.import_side(spec, side, module_files.get(side)) for side in SIDES}
    adapter = build.import_adapter(spec)
    if callable(getattr(adapter, "bind", None)):
        adapter.bind(baseline=modules["baseline"], candidate=modules["candidate"])
    return adapter


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
