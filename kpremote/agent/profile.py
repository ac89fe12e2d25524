"""A profile run: the timing runner's steps up to the correctness gate of one workload, then Nsight Compute.

    python -m kpremote.agent.profile --task-dir W --run-dir R --workloads ID --mode 'profile:{...}' [runner options]
        (what `start --runner-module kpremote.agent.profile` spawns; --mode carries ncu.ProfileRequest)
    python -m kpremote.agent.profile call --job JOB.json --out DONE.json
        (the process ncu profiles: warm-up calls, then the profiled calls inside cudaProfilerStart/Stop)

Both sides are built and the workload gated exactly as in `inv run` (the same Runner steps, the same workload
worker, so this row is also timed once); a row that is not PASSED is never profiled. Then each chosen side runs
under `ncu --clock-control none`, its report stays in raw/ncu/<side>-<workload>.ncu-rep, and the per-kernel
figures read back from it go to summary/profile.md and summary/profile.csv with each report's sha256 and host path.
profile.md ends with one roofline line per kernel. A failure leaves no profile.md or profile.csv, and no
half-written report.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from . import ncu
from .atomicfile import write_atomically
from .correctness import PASSED, SKIPPED
from .lease import BadRequest
from .liveness import current_state
from .protocol import NotFound, NotTerminal
from .runner import EXIT_FAILED, EXIT_PASSED, EXIT_REFUSED, Abort, Options, Runner, kill_tree
from .runner import parse_args as parse_runner_args
from .runpaths import SAFE_NAME, existing_run_dir
from .runstate import TERMINAL
from .sync import file_sha256
from .taskspec import Workload

PROFILE_LIMIT_S = 3600.0  # one side under ncu: a full set replays every kernel dozens of times
CHUNK = 1 << 20
SMOKE_NOTE = ("> **SMOKE PROFILE** — no GPU here: the calls ran on the CPU under whatever `ncu` is on PATH; "
              "every number below is the stand-in's, not a measurement.")


# --------------------------------------------------------------------------------------------- the run


@dataclass
class SideProfile:
    side: str
    report: Path
    bytes: int
    sha256: str
    kernels: list[ncu.KernelSummary]


class ProfileRunner(Runner):
    """Runner's validate → lease → build → gate, then ncu per side and the profile summary."""

    def __init__(self, options: Options, command: list[str], request: ncu.ProfileRequest | str) -> None:
        super().__init__(options, command)
        self.request = request  # a string says why the request could not be read; refused in _validate
        self.ncu_path = ""
        self.profiled: list[SideProfile] = []

    def _run_all(self) -> tuple[str, int]:
        self._phase("validate")
        self._validate()
        self._phase("lease")
        self._take_gpu()
        self._phase("build")
        self._prepare()
        self.events.emit("provenance", **self._provenance())
        [workload] = self.ctx.selected
        self._run_row(1, workload)
        self._require_gate_passed(self.ctx.rows[-1])
        self._phase("profile")
        for side in self.request.sides:
            self.profiled.append(self._profile_side(workload, side))
        self._phase("summarize")
        self._write_profile_summary(workload)
        return "passed", EXIT_PASSED

    def _validate(self) -> None:
        if isinstance(self.request, str):
            raise Abort(f"refused: {self.request}", EXIT_REFUSED)
        problems = self.request.problems()
        if problems:
            raise Abort(f"refused: {'; '.join(problems)}", EXIT_REFUSED)
        super()._validate()
        if len(self.ctx.selected) != 1:
            raise Abort(f"refused: a profile takes exactly one workload (--workload ID), not "
                        f"{len(self.ctx.selected)}", EXIT_REFUSED)
        try:
            self.ncu_path = ncu.require_ncu()  # before any lease or build: a host without ncu fails at once
        except ncu.NcuError as exc:
            raise Abort(str(exc)) from None

    def _require_gate_passed(self, row: dict[str, Any]) -> None:
        if row["status"] == SKIPPED:
            raise Abort(f"not profiled: {row.get('message')} (profile on a GPU host)", EXIT_FAILED, "failed")
        if row["status"] != PASSED:
            raise Abort(f"not profiled: workload {row['workload']} is {row['status']} at the correctness gate "
                        f"({row.get('message')}); only a correct row is profiled", EXIT_FAILED, "failed")

    # ---------------------------------------------------------------- one side under ncu

    def _profile_side(self, workload: Workload, side: str) -> SideProfile:
        folder = self.raw / "ncu"
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{side}-{workload.id}"
        report, done = folder / f"{stem}.ncu-rep", folder / f"{stem}.call.json"
        job_path, log_path = folder / f"{stem}.job.json", folder / f"{stem}.log"
        for stale in (report, done):
            stale.unlink(missing_ok=True)
        job_path.write_text(json.dumps(self._call_job(workload, side), indent=1))
        target = [sys.executable, "-m", "kpremote.agent.profile", "call", "--job", str(job_path), "--out", str(done)]
        command = ncu.profile_command(self.ncu_path, section_set=self.request.section_set,
                                      kernel_regex=self.request.kernel, report=report, target=target)
        self.events.emit("profile", side=side, step="ncu", command=command)
        try:
            returncode = self._run_under_ncu(command, log_path, side)
            ncu.check_profile(log_path.read_text(errors="replace"), returncode, report,
                              target_finished=done.is_file(), kernel_regex=self.request.kernel)
            csv_text = ncu.import_report(self.ncu_path, report)
        except BaseException as exc:
            report.unlink(missing_ok=True)  # a failed or cut-short report never stays looking like a good one
            if isinstance(exc, ncu.NcuError):
                raise Abort(f"{side}: {exc}") from None
            raise
        (folder / f"{stem}.raw.csv").write_text(csv_text)
        kernels = ncu.summarize(ncu.parse_raw_csv(csv_text))
        if not kernels:
            raise Abort(f"{side}: ncu's report {report.name} lists no kernel (see raw/ncu/{stem}.raw.csv)")
        profiled = SideProfile(side, report, report.stat().st_size, file_sha256(report), kernels)
        self.events.emit("profile", side=side, step="done", report=str(report), sha256=profiled.sha256,
                         kernels=[k.name for k in kernels])
        return profiled

    def _call_job(self, workload: Workload, side: str) -> dict[str, Any]:
        return {"task_dir": str(self.ctx.spec.root), "device": self.ctx.device, "workload": workload.id,
                "side": side, "warmup": self.request.warmup, "calls": self.request.calls,
                "modules": {s: rec.get("module") for s, rec in self.ctx.prepared["build"]["sides"].items()}}

    def _run_under_ncu(self, command: list[str], log_path: Path, side: str) -> int:
        with open(log_path, "ab") as log:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self._worker_env(),
                                     cwd=self.ctx.spec.root)
        try:
            return child.wait(timeout=PROFILE_LIMIT_S)
        except subprocess.TimeoutExpired:
            kill_tree(child)
            raise Abort(f"{side}: ncu did not finish within {PROFILE_LIMIT_S:g} s (log: {log_path})") from None
        except BaseException:  # Cancelled above all: ncu and the profiled process go with the run
            if child.poll() is None:
                kill_tree(child)
            raise

    # ---------------------------------------------------------------- summary

    def _write_profile_summary(self, workload: Workload) -> None:
        summary = self.run_dir / "summary"
        copy_gbps = self._copy_gbps()
        written = []
        try:
            # profile.md last: its presence says the profile is complete
            for name, text in (("profile.csv", render_profile_csv(workload.id, self.profiled, copy_gbps)),
                               ("profile.md", self._render_markdown(workload, copy_gbps))):
                written.append(summary / name)
                write_atomically(summary / name, text)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise

    def _copy_gbps(self) -> float | None:
        return ((self.ctx.prepared.get("device") or {}).get("copy_bandwidth") or {}).get("gbps")

    def _render_markdown(self, workload: Workload, copy_gbps: float | None) -> str:
        gpu = self.ctx.gpu
        facts = {
            "task": self.ctx.spec.task.name,
            "workload": workload.id,
            "run_id": self.run_dir.name,
            "host": self.options.host_alias or "",
            "hostname": os.uname().nodename,
            "gpu": f"{gpu.name} (index {gpu.index}, {gpu.uuid})" if gpu else f"none ({self.ctx.device})",
            "ncu": f"{self.ncu_path} ({ncu.ncu_version(self.ncu_path) or 'version unknown'})",
            "smoke": self.ctx.device != "cuda",
        }
        return render_profile_md(facts, self.request, self.ctx.rows[-1], self.profiled, copy_gbps)


# --------------------------------------------------------------------------------------------- rendering


def render_profile_md(facts: dict[str, Any], request: ncu.ProfileRequest, gate: dict[str, Any],
                      sides: list[SideProfile], copy_gbps: float | None) -> str:
    lines = [f"# {facts['task']}: Nsight Compute profile of `{facts['workload']}`", ""]
    if facts.get("smoke"):
        lines += [SMOKE_NOTE, ""]
    kernel_filter = f"`regex:{request.kernel}`" if request.kernel else "every kernel"
    lines += [
        f"- run `{facts['run_id']}` on `{facts['host'] or facts['hostname']}` (host {facts['hostname']}), "
        f"GPU {facts['gpu']}",
        f"- ncu: `{facts['ncu']}`; set `{request.section_set}`; {kernel_filter}; `--clock-control none` (the "
        "card's clocks untouched); caches flushed before each replay pass (ncu's default `--cache-control all`)",
        f"- per side: {request.warmup} warm-up calls outside the profiled region, then {request.calls} profiled "
        "calls (cudaProfilerStart/Stop); the inputs are the timing case's (seed = row seed + correctness seeds)",
        f"- correctness gate: **{gate['status']}**; {_gate_timing(gate)}",
        f"- device-to-device copy bandwidth measured in this run: {_num(copy_gbps, '{:.0f}')} GB/s; the task's "
        f"bytes_moved per call: {_num(_mega(gate.get('bytes_moved')), '{:.3g}')} MB (the roofline below uses the "
        "DRAM bytes ncu counted)",
        "",
        "## Reports (they stay on the host)",
        "",
        "| side | report on the host | bytes | sha256 |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {s.side} | `{s.report}` | {s.bytes} | `{s.sha256}` |" for s in sides]
    if sides:
        example = f"ncu/{sides[0].report.name}"
        lines += ["", f"Fetch one on request: `inv fetch-results --host {facts['host'] or '<host>'} --task "
                      f"{facts['task']} --run {facts['run_id']} --raw-file {example}`"]
    lines += ["", "## Kernels (median over each kernel's profiled launches)", "",
              "| side | kernel | launches | grid | block | duration µs | DRAM % | DRAM GB/s | memory SOL % | SM % "
              "| L1 % | L2 % | occupancy achieved / theoretical % | regs/thread | smem static / dynamic B "
              "| L2 hit % | top stalls (cycles per issued instruction) |",
              "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for side in sides:
        for k in side.kernels:
            lines.append(
                f"| {side.side} | `{k.name}` | {k.launches} | {k.grid or '-'} | {k.block or '-'} "
                f"| {_num(k.duration_us, '{:.2f}')} | {_num(k.get('dram_pct'), '{:.1f}')} "
                f"| {_num(_giga(k.dram_bytes_per_s), '{:.0f}')} | {_num(k.get('memory_sol_pct'), '{:.1f}')} "
                f"| {_num(k.get('sm_pct'), '{:.1f}')} | {_num(k.get('l1_pct'), '{:.1f}')} "
                f"| {_num(k.get('l2_pct'), '{:.1f}')} | {_num(k.get('achieved_occupancy_pct'), '{:.1f}')} / "
                f"{_num(k.get('theoretical_occupancy_pct'), '{:.1f}')} "
                f"| {_num(k.get('registers_per_thread'), '{:.0f}')} "
                f"| {_num(k.get('shared_static_bytes'), '{:.0f}')} / {_num(k.get('shared_dynamic_bytes'), '{:.0f}')} "
                f"| {_num(k.get('l2_hit_pct'), '{:.1f}')} | {_stalls(k.stalls)} |")
    lines += ["", "## Roofline", "",
              f"Memory roof: the copy bandwidth above. Compute roof: the FP32 peak ncu reports (2 x FFMA per cycle x "
              f"SM clock). Tensor-core work is not counted in FLOP; ncu's SM SOL % sees it. Below "
              f"{ncu.ROOF_NEAR:.0%} of both roofs a kernel is latency-bound (ncu's rule of thumb).", ""]
    lines += [roofline_line(side.side, k, copy_gbps) for side in sides for k in side.kernels]
    return "\n".join(lines) + "\n"


def roofline_line(side: str, kernel: ncu.KernelSummary, copy_gbps: float | None) -> str:
    roof = ncu.roofline(kernel, copy_gbps)
    memory = (f"{_num(_mega(roof.bytes), '{:.3g}')} MB DRAM / {_num(kernel.duration_us, '{:.2f}')} µs = "
              f"{_num(_giga(roof.bytes_per_s), '{:.0f}')} GB/s = {_pct(roof.memory_fraction)} of the "
              f"{_num(copy_gbps, '{:.0f}')} GB/s copy bandwidth (DRAM SOL {_num(kernel.get('dram_pct'), '{:.0f}')} %)")
    if roof.flop:
        compute = (f"{_num(roof.flop / 1e6, '{:.3g}')} MFLOP → {_num(_tera(roof.flop_per_s), '{:.3g}')} TFLOP/s = "
                   f"{_pct(roof.compute_fraction)} of the {_num(_tera(roof.peak_flop_per_s), '{:.1f}')} TFLOP/s "
                   f"FP32 peak")
    else:
        compute = "no FP32/FP64/FP16 FLOP counted"
    compute += f" (SM SOL {_num(kernel.get('sm_pct'), '{:.0f}')} %)"
    return (f"- {side} `{kernel.name}`: {memory}; {compute} → **{roof.bound}-bound**"
            f"{_bound_reason(roof)}")


def _bound_reason(roof: ncu.Roofline) -> str:
    if roof.bound == "latency":
        return (f" (neither roof is near: memory {_pct(roof.memory_signal)}, compute {_pct(roof.compute_signal)}; "
                "look at occupancy, grid size and stalls)")
    if roof.bound == "unknown":
        return " (ncu reported neither bytes nor throughput)"
    return ""


def render_profile_csv(workload: str, sides: list[SideProfile], copy_gbps: float | None) -> str:
    columns = ["side", "workload", "kernel", "launches", "grid", "block", "duration_us", "dram_throughput_pct",
               "dram_bytes", "dram_gbps", "copy_gbps", "pct_of_copy_bandwidth", "memory_sol_pct", "sm_throughput_pct",
               "l1_pct", "l2_pct", "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread",
               "shared_static_bytes", "shared_dynamic_bytes", "l2_hit_pct", "top_stalls", "flop", "tflops",
               "peak_fp32_tflops", "bound", "report_path", "report_bytes", "report_sha256"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for side in sides:
        for k in side.kernels:
            roof = ncu.roofline(k, copy_gbps)
            writer.writerow([
                side.side, workload, k.name, k.launches, k.grid or "", k.block or "", _cell(k.duration_us),
                _cell(k.get("dram_pct")), _cell(k.dram_bytes), _cell(_giga(k.dram_bytes_per_s)), _cell(copy_gbps),
                _cell(roof.memory_fraction * 100 if roof.memory_fraction is not None else None),
                _cell(k.get("memory_sol_pct")), _cell(k.get("sm_pct")), _cell(k.get("l1_pct")),
                _cell(k.get("l2_pct")), _cell(k.get("achieved_occupancy_pct")),
                _cell(k.get("theoretical_occupancy_pct")), _cell(k.get("registers_per_thread")),
                _cell(k.get("shared_static_bytes")), _cell(k.get("shared_dynamic_bytes")), _cell(k.get("l2_hit_pct")),
                ";".join(f"{name}={value:.3g}" for name, value in k.stalls), _cell(k.flop),
                _cell(_tera(roof.flop_per_s)), _cell(_tera(roof.peak_flop_per_s)), roof.bound, str(side.report),
                side.bytes, side.sha256,
            ])
    return out.getvalue()


def _gate_timing(gate: dict[str, Any]) -> str:
    timing = gate.get("timing") or {}
    medians = {side: (timing.get(side) or {}).get("median") for side in ncu.SIDES}
    if not any(medians.values()):
        return "no harness timing"
    speedup = f", speedup {timing['speedup']:.3f}x" if timing.get("speedup") else ""
    return (f"harness timing of this row ({timing.get('mode')}): baseline {_num(medians['baseline'], '{:.2f}')} µs, "
            f"candidate {_num(medians['candidate'], '{:.2f}')} µs (median){speedup}")


def _stalls(stalls: list[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in stalls) or "-"


def _num(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _giga(value: float | None) -> float | None:
    return None if value is None else value / 1e9


def _mega(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def _tera(value: float | None) -> float | None:
    return None if value is None else value / 1e12


# --------------------------------------------------------------------------------------------- the profiled process


def call_side(job: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then make the profiled calls of one side inside the profiler's region."""
    from .taskspec import load_task
    from .worker import _bound_adapter

    spec = load_task(Path(job["task_dir"]))
    workload = next(w for w in spec.workloads if w.id == job["workload"])
    device = "cuda" if job["device"].startswith("cuda") else "cpu"
    adapter = _bound_adapter(spec, job.get("modules") or {})
    params, side = workload.params, job["side"]
    case = adapter.make_case(params, device=device, seed=int(params.get("seed", 0)) + spec.timing.seeds)
    outputs = case.outputs_baseline if side == "baseline" else case.outputs_candidate
    call = getattr(adapter, f"call_{side}")
    for _ in range(job["warmup"]):
        call(params, case.inputs, outputs)
    _synchronize(device)
    _profiler(device, start=True)
    try:
        for _ in range(job["calls"]):
            call(params, case.inputs, outputs)
        _synchronize(device)
    finally:
        _profiler(device, start=False)
    return {"side": side, "workload": workload.id, "warmup": job["warmup"], "calls": job["calls"]}


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _profiler(device: str, *, start: bool) -> None:
    """cudaProfilerStart/Stop: with `--profile-from-start off`, ncu profiles only the launches in between."""
    if device != "cuda":
        return
    from torch.cuda import profiler

    if start:
        profiler.start()
    else:
        profiler.stop()


def call_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.profile call")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        result = call_side(json.loads(args.job.read_text()))
    except Exception:  # noqa: BLE001 - the traceback lands in the ncu log, which the runner quotes
        traceback.print_exc()
        return 1
    write_atomically(args.out, json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------- raw files on request


def raw_file_path(root: Path, task: str, run_id: str, name: str) -> tuple[Path, str]:
    """A regular file under a finished run's raw/ and its name there ('ncu/x.ncu-rep'); links are never followed."""
    run_dir = existing_run_dir(root, task, run_id)
    parts = [part for part in name.split("/") if part]
    if parts[:1] == ["raw"]:
        parts = parts[1:]
    if not parts or any(not SAFE_NAME.fullmatch(p) or p in (".", "..") for p in parts):
        raise BadRequest(f"bad raw file name {name!r}: a path under raw/ of letters, digits, '_', '.', '-'")
    status = current_state(run_dir).get("status")
    if status not in TERMINAL:
        raise NotTerminal(f"run {run_id} is {status}; its raw files are not final yet")
    relative = "/".join(parts)
    path = run_dir / "raw"
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise BadRequest(f"raw/{relative}: {path.name} is a link; links are never followed")
    if not path.is_file():
        raise NotFound(f"run {run_id} of task {task} has no file raw/{relative}")
    return path, relative


def raw_file_stat(root: Path, task: str, run_id: str, name: str) -> dict[str, Any]:
    path, relative = raw_file_path(root, task, run_id, name)
    return {"name": relative, "path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def send_raw_file(root: Path, task: str, run_id: str, name: str, out: BinaryIO) -> None:
    path, _ = raw_file_path(root, task, run_id, name)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            out.write(chunk)
    out.flush()


# --------------------------------------------------------------------------------------------- command line


def parse_profile_args(argv: list[str]) -> tuple[ncu.ProfileRequest | str, Options]:
    """The runner's options, with --mode read as the profile request (or explicit --side/--set/... flags)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--mode")
    parser.add_argument("--side")
    parser.add_argument("--set", dest="section_set")
    parser.add_argument("--kernel")
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--calls", type=int)
    known, rest = parser.parse_known_args(argv)
    try:
        request = ncu.ProfileRequest.from_mode(known.mode) if known.mode else ncu.ProfileRequest()
    except ValueError as exc:
        return str(exc), parse_runner_args(rest)
    overrides = {k: v for k, v in vars(known).items() if k != "mode" and v is not None}
    return replace(request, **overrides), parse_runner_args(rest)


def main(argv: list[str]) -> int:
    if argv[:1] == ["call"]:
        return call_main(argv[1:])
    request, options = parse_profile_args(argv)
    return ProfileRunner(options, [sys.executable, "-m", "kpremote.agent.profile", *argv], request).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
