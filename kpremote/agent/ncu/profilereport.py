"""A profile run's summary as text: profile.md (facts, reports, per-kernel table, one roofline line per kernel)
and profile.csv / profile.json (one record per kernel, with each report's path, size and sha256: the JSON for agents).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ncu
from ..protocol import PROFILE_SIDES, ProfileRequest

SMOKE_NOTE = ("> **SMOKE PROFILE** — no GPU here: the calls ran on the CPU under whatever `ncu` is on PATH; "
              "every number below is the stand-in's, not a measurement.")


@dataclass
class SideProfile:
    side: str
    report: Path
    bytes: int
    sha256: str
    kernels: list[ncu.KernelSummary]


def render_profile_md(facts: dict[str, Any], request: ProfileRequest, gate: dict[str, Any],
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


PROFILE_COLUMNS = (
    "side", "workload", "kernel", "launches", "grid", "block", "duration_us", "dram_throughput_pct", "dram_bytes",
    "dram_gbps", "copy_gbps", "pct_of_copy_bandwidth", "memory_sol_pct", "sm_throughput_pct", "l1_pct", "l2_pct",
    "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread", "shared_static_bytes",
    "shared_dynamic_bytes", "l2_hit_pct", "top_stalls", "flop", "tflops", "peak_fp32_tflops", "bound", "report_path",
    "report_bytes", "report_sha256",
)


NUMERIC_COLUMNS = frozenset(PROFILE_COLUMNS[6:22]) | {"flop", "tflops", "peak_fp32_tflops"}


def profile_rows(workload: str, sides: list[SideProfile], copy_gbps: float | None) -> list[dict[str, Any]]:
    """One record per profiled kernel: what profile.csv and profile.json both hold (None where ncu had no value)."""
    rows = []
    for side in sides:
        for k in side.kernels:
            roof = ncu.roofline(k, copy_gbps)
            values = [
                side.side, workload, k.name, k.launches, k.grid or None, k.block or None, k.duration_us,
                k.get("dram_pct"), k.dram_bytes, _giga(k.dram_bytes_per_s), copy_gbps,
                roof.memory_fraction * 100 if roof.memory_fraction is not None else None,
                k.get("memory_sol_pct"), k.get("sm_pct"), k.get("l1_pct"), k.get("l2_pct"),
                k.get("achieved_occupancy_pct"), k.get("theoretical_occupancy_pct"), k.get("registers_per_thread"),
                k.get("shared_static_bytes"), k.get("shared_dynamic_bytes"), k.get("l2_hit_pct"),
                ";".join(f"{name}={value:.3g}" for name, value in k.stalls), k.flop, _tera(roof.flop_per_s),
                _tera(roof.peak_flop_per_s), roof.bound, str(side.report), side.bytes, side.sha256,
            ]
            rows.append(dict(zip(PROFILE_COLUMNS, values)))
    return rows


def render_profile_csv(workload: str, sides: list[SideProfile], copy_gbps: float | None) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PROFILE_COLUMNS)
    for row in profile_rows(workload, sides, copy_gbps):
        writer.writerow([_cell(value) if name in NUMERIC_COLUMNS else ("" if value is None else value)
                         for name, value in row.items()])
    return out.getvalue()


def render_profile_json(workload: str, sides: list[SideProfile], copy_gbps: float | None) -> str:
    """profile.json: {"schema": "kpremote.profile-kernels/1", "kernels": [one record per kernel]}, for agents."""
    return json.dumps({"schema": "kpremote.profile-kernels/1", "workload": workload,
                       "kernels": profile_rows(workload, sides, copy_gbps)}, indent=1) + "\n"


def _gate_timing(gate: dict[str, Any]) -> str:
    timing = gate.get("timing") or {}
    medians = {side: (timing.get(side) or {}).get("median") for side in PROFILE_SIDES}
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
