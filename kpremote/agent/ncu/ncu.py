"""Nsight Compute on this host: find `ncu`, build its command lines, and read its reports back per kernel.

Profiling never touches the card's clocks (`--clock-control none`: the GPU runs at the clocks it would run at
anyway, as in the harness's timing). The profiled process marks its region with cudaProfilerStart/Stop
(`--profile-from-start off`), so warm-up and JIT launches are never profiled.

A report is read back with `ncu --import R --csv --page raw --print-units base`: a header row of metric names, a
row of units, then one row per profiled launch, e.g.

    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",...
    "","","","","","","","","",...,"nsecond","%",...
    "0","4242","python3","host","_kernel","1","7","(256, 1, 1)","(64, 1, 1)",...,"5,216","61.20",...

Numbers may carry thousands separators and unsupported metrics read "n/a". What a profile asks for
(protocol.ProfileRequest) is part of the seam, not of this module.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

NCU_ENV = "KPREMOTE_NCU"
NO_KERNELS_WARNING = "No kernels were profiled"
PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
PERMISSION_HINT = ("no permission to GPU performance counters: run with --cap-add=SYS_ADMIN or set "
                   "NVreg_RestrictProfilingToAdminUsers=0")
# Where Nsight Compute usually lives when it is not on PATH (newest version last after sorting).
FALLBACK_GLOBS = ("/usr/local/cuda/bin/ncu", "/usr/local/cuda/nsight-compute*/ncu", "/opt/nvidia/nsight-compute/*/ncu")
# Named on every command line whatever the set: the basic set lacks stall reasons and memory tables, and with
# --metrics but no --section ncu may collect only the listed metrics; naming the sections keeps them in either way.
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "WarpStateStats")
# Counters the summary and the roofline need whatever the set: DRAM bytes, L2 hit rate, FP instruction counts
# and the FP32 peak (ffma per cycle x SM clock), as the SpeedOfLight roofline charts collect them.
EXTRA_METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
      for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hadd", "hmul", "hfma")),
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",
    "sm__cycles_elapsed.avg.per_second",
)
# The one metric the timing audit collects: a kernel's duration on the GPU.
AUDIT_METRIC = "gpu__time_duration.sum"
# ncu's own rule of thumb (SOLBottleneck): below 60 % of both roofs a kernel is limited by latency, not throughput.
ROOF_NEAR = 0.6
TOP_STALLS = 3


class NcuError(Exception):
    """A profile that cannot be trusted or did not happen: one line saying why and what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------------------------- finding ncu


def find_ncu(env: dict[str, str] | None = None, fallbacks: Iterable[str] = FALLBACK_GLOBS) -> str | None:
    """$KPREMOTE_NCU, else ncu on PATH, else $CUDA_HOME/bin/ncu, else the usual install folders."""
    env = dict(os.environ if env is None else env)
    if env.get(NCU_ENV):
        return env[NCU_ENV] if os.access(env[NCU_ENV], os.X_OK) else None
    found = shutil.which("ncu", path=env.get("PATH"))
    if found:
        return found
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    patterns = ([str(Path(home) / "bin" / "ncu")] if home else []) + list(fallbacks)
    for pattern in patterns:
        matches = [m for m in sorted(glob.glob(pattern), key=_natural) if os.access(m, os.X_OK)]
        if matches:
            return matches[-1]
    return None


def _natural(path: str) -> list[Any]:
    """'2025.10.0' after '2025.9.1': numbers compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def require_ncu(env: dict[str, str] | None = None, fallbacks: Iterable[str] = FALLBACK_GLOBS) -> str:
    found = find_ncu(env, fallbacks)
    if found:
        return found
    wanted = (env if env is not None else os.environ).get(NCU_ENV)
    if wanted:
        raise NcuError("ncu_missing", f"{NCU_ENV}={wanted} is not an executable ncu: point it at Nsight Compute's "
                                      "ncu or unset it")
    raise NcuError("ncu_missing", "ncu (Nsight Compute) not found on this host (PATH, $CUDA_HOME/bin, "
                                  "/usr/local/cuda/bin, /opt/nvidia/nsight-compute): install Nsight Compute there, "
                                  f"or set {NCU_ENV}=/path/to/ncu in the host's environment")


def ncu_version(ncu: str) -> str | None:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


# --------------------------------------------------------------------------------------------- command lines


def profile_command(ncu: str, *, section_set: str, kernel_regex: str | None, report: Path,
                    target: list[str]) -> list[str]:
    """ncu around target: clocks untouched, only the marked region profiled, one report written (replaced)."""
    command = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--set", section_set]
    for section in SECTIONS:
        command += ["--section", section]
    command += ["--metrics", ",".join(EXTRA_METRICS)]
    if kernel_regex:
        command += ["--kernel-name", f"regex:{kernel_regex}"]
    return command + ["--export", str(report), "--force-overwrite", *target]


def audit_command(ncu: str, *, report: Path, target: list[str], cache_control: str = "all") -> list[str]:
    """ncu for the timing audit (audit.py): clocks untouched, caches flushed before each kernel, only the marked
    region, one metric (gpu__time_duration), one report written (replaced)."""
    return [ncu, "--clock-control", "none", "--cache-control", cache_control, "--profile-from-start", "off",
            "--metrics", AUDIT_METRIC, "--export", str(report), "--force-overwrite", *target]


def import_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


def check_profile(output: str, returncode: int, report: Path, *, target_finished: bool,
                  kernel_regex: str | None) -> None:
    """NcuError unless ncu wrote a usable report; the most specific cause first."""
    if PERMISSION_ERROR in output:
        raise NcuError("counter_permission", f"{PERMISSION_HINT} (ncu: {PERMISSION_ERROR})")
    missing_metric = re.search(r"Failed to find metric[^\n]*", output)
    if missing_metric:
        raise NcuError("ncu_failed", f"ncu on this host does not know a requested metric ({missing_metric.group(0)})")
    if not target_finished:
        raise NcuError("target_failed", "the profiled process did not finish its calls; its output: "
                                        + _tail(output))
    if NO_KERNELS_WARNING in output or (returncode == 0 and not report.is_file()):
        if kernel_regex:
            raise NcuError("no_kernels", f"the kernel regex {kernel_regex!r} matched no kernel launched in the "
                                         "profiled calls: run without --kernel to see the kernel names")
        raise NcuError("no_kernels", "no kernel was launched in the profiled calls (ncu profiled nothing)")
    if returncode != 0 or not report.is_file():
        errors = [line for line in output.splitlines() if "==ERROR==" in line]
        why = errors[-1].strip() if errors else f"exit code {returncode}, no report"
        raise NcuError("ncu_failed", f"ncu failed: {why}")


def _tail(output: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:]) or "(nothing)"


def import_report(ncu: str, report: Path, timeout_s: float = 600.0) -> str:
    """The report's raw page as CSV text."""
    try:
        done = subprocess.run(import_command(ncu, report), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise NcuError("ncu_failed", f"ncu --import {report.name} took longer than {timeout_s:g} s") from None
    if done.returncode != 0 or '"ID"' not in done.stdout:
        raise NcuError("ncu_failed", f"ncu --import {report.name} failed (exit code {done.returncode}): "
                                     + _tail(done.stderr or done.stdout))
    return done.stdout


# --------------------------------------------------------------------------------------------- reading the CSV


@dataclass
class Launch:
    """One profiled kernel launch: identity columns as text, metrics as numbers in base units (or None)."""

    kernel: str
    identity: dict[str, str]
    metrics: dict[str, float | None]
    units: dict[str, str]


def parse_raw_csv(text: str) -> list[Launch]:
    """Launches from `--page raw --csv` output; lines before the header (==PROF== ...) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = body.pop(0) if body and not body[0][0].strip() else [""] * len(header)
    first_metric = _first_metric_column(header)
    launches = []
    for row in body:
        if len(row) != len(header) or not row[0].strip().isdigit():
            continue
        identity = dict(zip(header[:first_metric], row[:first_metric]))
        metrics, metric_units = {}, {}
        for name, unit, value in zip(header[first_metric:], units[first_metric:], row[first_metric:]):
            metrics[name] = _number(value, unit)
            metric_units[name] = unit
        launches.append(Launch(identity.get("Kernel Name", "?"), identity, metrics, metric_units))
    return launches


def _first_metric_column(header: list[str]) -> int:
    """Metric names carry '__' (unit__counter.rollup); the identity columns before them do not."""
    return next((i for i, name in enumerate(header) if "__" in name), len(header))


THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?([eE][-+]?\d+)?")
PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
SUBSECOND = {"msecond": 1e-3, "usecond": 1e-6, "nsecond": 1e-9, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _number(value: str, unit: str) -> float | None:
    text = value.strip()
    if THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        number = float(text)
    except ValueError:
        return None
    return number * unit_scale(unit)


def unit_scale(unit: str) -> float:
    """Factor to ncu's base units: 'Kbyte' -> 1e3, 'usecond' -> 1e-6, 'Gbyte/second' -> 1e9, 'byte/usecond' -> 1e6."""
    numerator, _, denominator = unit.strip().partition("/")
    scale = _prefix_scale(numerator)
    return scale / _prefix_scale(denominator) if denominator else scale


def _prefix_scale(unit: str) -> float:
    if unit in SUBSECOND:
        return SUBSECOND[unit]
    if len(unit) > 1 and unit[0] in PREFIX and unit[1:] in ("byte", "hz", "second", "cycle", "inst", "sector", "B"):
        return PREFIX[unit[0]]
    return 1.0


# --------------------------------------------------------------------------------------------- per kernel

# Each figure of the summary, with the metric names that carry it (newer ncu first).
FIGURES: dict[str, tuple[str, ...]] = {
    "duration_s": ("gpu__time_duration.sum",),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "dram_bytes_per_s": ("dram__bytes.sum.per_second",),
    "dram_read_bytes": ("dram__bytes_read.sum",),
    "dram_write_bytes": ("dram__bytes_write.sum",),
    "memory_sol_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers_per_thread": ("launch__registers_per_thread",),
    "shared_static_bytes": ("launch__shared_mem_per_block_static",),
    "shared_dynamic_bytes": ("launch__shared_mem_per_block_dynamic",),
    "grid_size": ("launch__grid_size",),
    "block_size": ("launch__block_size",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    "sm_hz": ("sm__cycles_elapsed.avg.per_second",),
    "ffma_peak_per_cycle": ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained",),
}
# FLOPs per thread instruction: an FMA is two.
FLOP_PER_INST = {f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": (2 if op == "fma" else 1)
                 for p in "dfh" for op in ("add", "mul", "fma")}
STALL = re.compile(r"smsp__average_warps?_(?:latency_)?issue_stalled_([a-z0-9_]+?)(?:_per_issue_active)?\.ratio")
NOT_A_STALL = {"selected"}  # 'selected' is the cycle a warp issues


@dataclass
class KernelSummary:
    """One kernel (by name) of one side: the median over its profiled launches of every figure."""

    name: str
    launches: int
    grid: str | None
    block: str | None
    figures: dict[str, float | None] = field(default_factory=dict)
    stalls: list[tuple[str, float]] = field(default_factory=list)  # top stall reasons, cycles per issued inst
    flop: float | None = None

    def get(self, name: str) -> float | None:
        return self.figures.get(name)

    @property
    def duration_us(self) -> float | None:
        seconds = self.get("duration_s")
        return seconds * 1e6 if seconds is not None else None

    @property
    def dram_bytes(self) -> float | None:
        read, write = self.get("dram_read_bytes"), self.get("dram_write_bytes")
        return read + write if read is not None and write is not None else None

    @property
    def dram_bytes_per_s(self) -> float | None:
        if self.get("dram_bytes_per_s") is not None:
            return self.get("dram_bytes_per_s")
        seconds = self.get("duration_s")
        return self.dram_bytes / seconds if self.dram_bytes is not None and seconds else None

    @property
    def peak_fp32_flop_per_s(self) -> float | None:
        per_cycle, hz = self.get("ffma_peak_per_cycle"), self.get("sm_hz")
        return 2 * per_cycle * hz if per_cycle and hz else None


def summarize(launches: list[Launch]) -> list[KernelSummary]:
    """Launches grouped by kernel name (first appearance order), each figure the median over the group."""
    groups: dict[str, list[Launch]] = {}
    for launch in launches:
        groups.setdefault(launch.kernel, []).append(launch)
    return [_summary(name, group) for name, group in groups.items()]


def _summary(name: str, group: list[Launch]) -> KernelSummary:
    figures = {figure: _median(group, names) for figure, names in FIGURES.items()}
    flop_parts = [(_median(group, (metric,)), per_inst) for metric, per_inst in FLOP_PER_INST.items()]
    counted = [value * per_inst for value, per_inst in flop_parts if value is not None]
    stalls = []
    for metric in group[0].metrics:
        match = STALL.fullmatch(metric)
        if match and match.group(1) not in NOT_A_STALL:
            value = _median(group, (metric,))
            if value:
                stalls.append((match.group(1), value))
    stalls.sort(key=lambda item: -item[1])
    first = group[0].identity
    return KernelSummary(
        name=name,
        launches=len(group),
        grid=first.get("Grid Size") or _whole(figures.get("grid_size")),
        block=first.get("Block Size") or _whole(figures.get("block_size")),
        figures=figures,
        stalls=stalls[:TOP_STALLS],
        flop=sum(counted) if counted else None,
    )


def _median(group: list[Launch], names: tuple[str, ...]) -> float | None:
    for name in names:
        values = [launch.metrics.get(name) for launch in group]
        present = [v for v in values if v is not None]
        if present:
            return statistics.median(present)
    return None


def _whole(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}"


# --------------------------------------------------------------------------------------------- roofline


@dataclass
class Roofline:
    """Where one kernel sits against the memory roof (the copy bandwidth) and the FP32 roof, and which one binds.

    The bound takes the larger of each side's signals: the copy-bandwidth and FP32-peak fractions, and ncu's own
    speed-of-light percentages (DRAM / memory hierarchy; SM, which also sees tensor and other pipes).
    """

    bytes: float | None
    seconds: float | None
    bytes_per_s: float | None
    copy_bytes_per_s: float | None
    memory_fraction: float | None  # of the copy bandwidth
    flop: float | None
    flop_per_s: float | None
    peak_flop_per_s: float | None
    compute_fraction: float | None  # of the FP32 peak
    bound: str  # "memory" | "compute" | "latency" | "unknown"
    memory_signal: float | None = None
    compute_signal: float | None = None


def roofline(kernel: KernelSummary, copy_gbps: float | None) -> Roofline:
    seconds = kernel.get("duration_s")
    copy = copy_gbps * 1e9 if copy_gbps else None
    moved = kernel.dram_bytes_per_s
    memory = moved / copy if moved is not None and copy else None
    flop_per_s = kernel.flop / seconds if kernel.flop is not None and seconds else None
    peak = kernel.peak_fp32_flop_per_s
    compute = flop_per_s / peak if flop_per_s is not None and peak else None
    memory_signal = _largest(memory, _fraction(kernel.get("dram_pct")), _fraction(kernel.get("memory_sol_pct")))
    compute_signal = _largest(compute, _fraction(kernel.get("sm_pct")))
    return Roofline(bytes=kernel.dram_bytes, seconds=seconds, bytes_per_s=moved, copy_bytes_per_s=copy,
                    memory_fraction=memory, flop=kernel.flop, flop_per_s=flop_per_s, peak_flop_per_s=peak,
                    compute_fraction=compute, bound=_bound(memory_signal, compute_signal),
                    memory_signal=memory_signal, compute_signal=compute_signal)


def _fraction(pct: float | None) -> float | None:
    return pct / 100.0 if pct is not None else None


def _largest(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _bound(memory: float | None, compute: float | None) -> str:
    if memory is None and compute is None:
        return "unknown"
    memory, compute = memory or 0.0, compute or 0.0
    if max(memory, compute) < ROOF_NEAR:
        return "latency"
    return "memory" if memory >= compute else "compute"
