"""The prepare step of a run in its own process: device probe first, then both builds.

    python -m kpremote.agent.task.worker prepare --job JOB.json --out RESULT.json [--result-fd N]

The probe (device, copy bandwidth, the L2 flush probe) runs BEFORE any task code is imported and goes to the
runner through the inherited pipe N, which is closed before the builds start: whatever a side's code does
while it is imported or built here cannot reach the numbers the floors are made of. A CPU run has no floor to
protect: its probe (a memcpy's bandwidth, for the record) comes after the builds, and this process never imports
torch there. The build record goes to RESULT.json as before. Each side is built in a sandboxed process of its own
(`worker build-side`), both at once: this process never imports or compiles a side's code, and neither side's build
can touch the other's folder or this record.
Workload rows run in the judge (judge.py), not here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from .. import sandbox
from . import build
from ..harness import floors, timing
from ..atomicfile import write_json_atomically
from ..harness.correctness import ERROR
from ..run.runstate import DISK_FULL_EXIT, is_disk_full
from .taskspec import SIDES, TaskSpec, load_task


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.task.worker")
    parser.add_argument("what", choices=("prepare", "build-side"))
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--result-fd", type=int, help="pipe for the probe, written before any task code runs")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    if args.what == "build-side":
        return build_side_main(job, args.result_fd)
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
    from ..harness import guard

    guard.make_undumpable()
    spec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
    device = job["device"]
    probe = None
    if device.startswith("cuda"):
        # The build processes start now and import torch and Triton while the device is probed; they wait at a
        # gate and touch no task code until the probe has been written and its pipe closed (BuildGate).
        with BuildGate() as gate:
            builds = gate.start(lambda: build.build_sides(spec, Path(job["run_dir"]), device,
                                                          build_one=gate.build_one, at_once=True))
            probe = probe_device(device)  # before any task code is imported
            _send_probe(result_fd, probe)
        record = builds.result()
    else:
        _send_probe(result_fd, probe)
        record = build.build_sides(spec, Path(job["run_dir"]), device, build_one=build_in_sandbox, at_once=True)
    result: dict[str, Any] = {"versions": build.toolchain_versions(), "build": record.to_json(), "device": probe}
    if probe is None and record.ok and not record.compile_only:
        result["device"] = probe_device(device)  # a CPU run: nothing to protect, the numbers are meaningless
    return result


def _send_probe(result_fd: int | None, probe: dict[str, Any] | None) -> None:
    """The probe up the inherited pipe, which then closes: nothing later in this run can write to it."""
    if result_fd is not None:
        _write_line(result_fd, {"probe": probe})
        os.close(result_fd)


class BuildGate:
    """Both sides' build processes, started before the device probe and held at a gate until it is done.

    Each imports what the harness itself imports (torch, Triton), then blocks reading the gate's pipe; leaving the
    `with` block closes it, and only then does a build enter its sandbox, load the task or import a side's code.
    The probe runs meanwhile in this process: a build's imports cost CPU time, never GPU time, and no task code
    runs before the probe's numbers have left for the runner."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_inheritable(self.read_end, True)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def __enter__(self) -> "BuildGate":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.open()

    def open(self) -> None:
        if self.write_end is not None:
            os.close(self.write_end)
            self.write_end = None

    def start(self, builds: Any) -> "concurrent.futures.Future[Any]":
        return self.pool.submit(builds)

    def build_one(self, spec: TaskSpec, run_dir: Path, side: str, builder: Any, *,
                  check_only: bool) -> tuple[build.SideBuild, str | None]:
        return build_in_sandbox(spec, run_dir, side, builder, check_only=check_only, gate_fd=self.read_end)


def build_in_sandbox(spec: TaskSpec, run_dir: Path, side: str, builder: Any, *,
                     check_only: bool, gate_fd: int | None = None) -> tuple[build.SideBuild, str | None]:
    """One side's build in a process of its own, sandboxed before the side's code is imported or compiled: it may
    change only its own build folder, its build log and its scratch folder. Its record comes back through a pipe;
    whatever it says, its module must lie in its own build folder."""
    folder = build.build_dir(run_dir, side)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder.with_suffix(".log")
    log.touch()
    scratch = sandbox.make_scratch(Path(run_dir) / "raw" / "scratch" / f"build-{side}")
    job_path = Path(run_dir) / "raw" / f"build-{side}.job.json"
    write_json_atomically(job_path, {"task_dir": str(spec.root), "run_dir": str(run_dir), "side": side,
                                     "check_only": check_only, "also": [str(folder), str(log)], "gate_fd": gate_fd})
    read_end, write_end = os.pipe()
    try:
        launcher = [sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--"] if _namespaces() else []
        child = subprocess.Popen(launcher + [sys.executable, "-m", "kpremote.agent.task.worker", "build-side", "--job",
                                             str(job_path), "--result-fd", str(write_end)],
                                 pass_fds=(write_end,) if gate_fd is None else (write_end, gate_fd),
                                 stdin=subprocess.DEVNULL,
                                 env={**os.environ, **sandbox.scratch_env(scratch),
                                      **sandbox.reads_env(run_dir, [spec.root])})
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        reply = pipe.read(1 << 20)
    code = child.wait()
    try:
        record = json.loads(reply.decode().strip().splitlines()[-1])
        side_build, note = build.SideBuild(**record["side"]), record.get("note")
    except (ValueError, IndexError, KeyError, TypeError):
        return build.SideBuild(side=side, ok=False, seconds=0.0, log=str(log.relative_to(run_dir)),
                               error=f"the {side} side's build process ended ({code}) without a record"), None
    if side_build.module and not Path(side_build.module).resolve().is_relative_to(folder.resolve()):
        return build.SideBuild(side=side, ok=False, seconds=side_build.seconds, log=side_build.log,
                               error=f"the {side} side's build named a module outside its build folder: "
                                     f"{side_build.module}"), None
    return side_build, note


def _namespaces() -> bool:
    """A side's build as process 1 of a PID namespace, where the host allows one: nothing it starts outlives it."""
    if not hasattr(_namespaces, "answer"):
        _namespaces.answer = sandbox.support().pid_namespace  # type: ignore[attr-defined]
    return _namespaces.answer  # type: ignore[attr-defined]


def build_side_main(job: dict[str, Any], result_fd: int) -> int:
    """`worker build-side`: enter the sandbox, build one side, send its record up the pipe."""
    from dataclasses import asdict

    from .builders import builder_for

    if job.get("gate_fd") is not None:
        _wait_at_the_gate(int(job["gate_fd"]))
    applied = sandbox.enter(also=[Path(p) for p in job["also"]])
    spec = load_task(Path(job["task_dir"]))
    side = job["side"]
    side_build, note = build.build_one_here(spec, Path(job["run_dir"]), side, builder_for(spec.build, side),
                                            check_only=job["check_only"])
    _write_line(result_fd, {"side": asdict(side_build), "note": note, "sandbox": applied})
    return 0


def _wait_at_the_gate(fd: int) -> None:
    """Import torch and Triton (the harness's own imports, no task code), then wait until the gate opens (EOF)."""
    for name in ("torch", "triton"):
        try:
            __import__(name)
        except ImportError:
            pass
    while os.read(fd, 64):
        pass
    os.close(fd)


def _write_line(fd: int, value: dict[str, Any]) -> None:
    data = (json.dumps(value, default=str) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def probe_device(device: str) -> dict[str, Any]:
    """The device's name, SM count, memory and L2, its copy bandwidths and the L2 flush probe; on the CPU, its name
    and a memcpy's bandwidth (no torch: a CPU run's prepare step never imports it)."""
    if device.startswith("cuda"):
        import torch

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
        info["empty_window"] = timing.empty_window()
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
