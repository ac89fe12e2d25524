"""Timing both sides of one workload, the same way, interleaved.

The loop (sample_abba) is driven by the row's judge (judge.py); every timed call runs in a side process
(side.py) and only its raw time comes back. CUDA ("cold" mode), per sample: the judge poisons the side's
outputs, resets the persisting L2 and flushes the L2 (a read of 2 x L2) in its own process, then the side
gives the GPU a head start (torch.cuda._sleep) so the timed call is already queued when its start event
runs, and one event pair on the current stream brackets the call. Baseline and candidate alternate ABBA so
drift hits both. Sampling stops once each side has min_samples and min_time_s and the relative standard
error of its median is under target_rse, or at max_samples / max_time_s. Samples taken while the SM clock
was under 75 % of its maximum are dropped and counted. "graph" mode captures N back-to-back calls in a CUDA
graph (one replay >= ~1 ms) and reports replay / N; an empty capture is an error. On the CPU (smoke runs
through Triton's interpreter) a few perf_counter samples are taken and labelled as meaningless.

The SM clock is watched by smclock.py's ClockGuard, a side's work checked to be on its stream by streamcheck.py; the
device probe a run takes before any task code runs (the L2 flush's, an empty call's window) is deviceprobe.py's.
Whether a measured time is physically possible at all is floors.py's question.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import stats
from .smclock import ClockGuard
from ..task.taskspec import TimingSettings

FALLBACK_L2_BYTES = 60 * 1024 * 1024
GRAPH_TARGET_US = 1000.0
GRAPH_MAX_CALLS = 4096
SMOKE_SAMPLES = 4  # two ABBA rounds: enough to exercise the path on a slow interpreter
HEAD_START_MAX_US = 2000.0
TRANSLATION_STRIDE = 64 * 1024  # a side reads one byte per 64 KiB of its case's memory before each sample
# Process pairs per side that time a cold GPU row (harness 2.9). Each process reads one kernel with an offset of its
# own, constant for its life and alike on 5, 16 and 227 us rows (the dial's A/A rows on the H200: -160 to +224 ns
# from one pair to the next, benchmarks/README.md "What the harness can see"); the row's samples, pooled over
# SIDE_PAIRS pairs, carry their mean offset, half as large as one pair's.
SIDE_PAIRS = 4
SIDE_PAIRS_ENV = "KPREMOTE_SIDE_PAIRS"

Call = Callable[[], None]


@dataclass
class SideSamples:
    name: str
    call: Call | None = None
    times_us: list[float] = field(default_factory=list)
    dropped_clock: int = 0
    late: int = 0  # samples dropped and taken again: the window opened before the call was queued
    host_bound: bool = False  # its calls wait on the host: late samples kept from then on (sampling.Sampler._timed)
    wall_s: float = 0.0
    _summary: tuple[int, stats.Summary] | None = field(default=None, repr=False, compare=False)

    def summary(self) -> stats.Summary:
        """The side's statistics (stats.summarize), computed once for the samples it holds: the row's timing, its
        speedup, its GB/s, its floor check and its verdict all read these."""
        if self._summary is None or self._summary[0] != len(self.times_us):
            self._summary = (len(self.times_us), stats.summarize(self.times_us))
        return self._summary[1]

    def to_json(self) -> dict[str, Any]:
        summary = self.summary().to_json() if self.times_us else {"n": 0}
        return {
            **summary,
            "dropped_clock": self.dropped_clock,
            "dropped_late": self.late,
            "host_bound": self.host_bound,
            "wall_s": round(self.wall_s, 4),
            "rse": _finite_or_none(stats.median_rse(self.times_us)) if self.times_us else None,
        }


@dataclass
class PairTiming:
    mode: str  # "cold" | "graph" | "smoke"
    calls_per_sample: int
    baseline: SideSamples
    candidate: SideSamples
    stop_reason: str
    clock_check: str
    head_start_us: float = 0.0
    process_pairs: list[dict[str, Any]] = field(default_factory=list)  # each pair's medians, when pooled

    @property
    def speedup(self) -> float | None:
        if not self.baseline.times_us or not self.candidate.times_us:
            return None
        return stats.speedup(self.baseline.summary().median, self.candidate.summary().median)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "calls_per_sample": self.calls_per_sample,
            "stop_reason": self.stop_reason,
            "clock_check": self.clock_check,
            "head_start_us": round(self.head_start_us, 2),
            "unit": "us",
            "baseline": self.baseline.to_json(),
            "candidate": self.candidate.to_json(),
            "speedup": self.speedup,
            "process_pairs": self.process_pairs,
        }


def side_pairs(device: str, mode: str) -> int:
    """How many process pairs time a row: SIDE_PAIRS for a cold GPU row, else one ($KPREMOTE_SIDE_PAIRS: any)."""
    import os

    wanted = os.environ.get(SIDE_PAIRS_ENV, "").strip()
    if wanted.isdigit() and int(wanted) >= 1:
        return int(wanted)
    return SIDE_PAIRS if device == "cuda" and mode == "cold" else 1


def share_of(settings: TimingSettings, pairs: int) -> TimingSettings:
    """One pair's share of a row's sampling: the time and sample caps divided, the target spread widened so the
    pooled samples meet the row's own."""
    if pairs <= 1:
        return settings
    import dataclasses

    return dataclasses.replace(settings, min_time_s=settings.min_time_s / pairs, max_time_s=settings.max_time_s / pairs,
                               max_samples=max(settings.min_samples, settings.max_samples // pairs),
                               target_rse=settings.target_rse * math.sqrt(pairs))


def pooled(pairs: list[PairTiming]) -> PairTiming:
    """One row's timing from its process pairs' timings: samples pooled, counts summed, each pair's medians kept."""
    if len(pairs) == 1:
        return pairs[0]

    def merged(name: str) -> SideSamples:
        parts = [getattr(pair, name) for pair in pairs]
        return SideSamples(name, times_us=[t for part in parts for t in part.times_us],
                           dropped_clock=sum(p.dropped_clock for p in parts), late=sum(p.late for p in parts),
                           host_bound=any(p.host_bound for p in parts), wall_s=sum(p.wall_s for p in parts))

    first = pairs[0]
    medians = [{"baseline": round(p.baseline.summary().median, 4) if p.baseline.times_us else None,
                "candidate": round(p.candidate.summary().median, 4) if p.candidate.times_us else None,
                "n": min(len(p.baseline.times_us), len(p.candidate.times_us))} for p in pairs]
    return PairTiming(first.mode, first.calls_per_sample, merged("baseline"), merged("candidate"),
                      "; ".join(dict.fromkeys(p.stop_reason for p in pairs)), first.clock_check,
                      max(p.head_start_us for p in pairs), medians)


# --------------------------------------------------------------------------------------------- the loop


def _stop_reason(sides: tuple[SideSamples, SideSamples], settings: TimingSettings) -> str | None:
    def converged(side: SideSamples) -> bool:
        return (
            len(side.times_us) >= settings.min_samples
            and side.wall_s >= settings.min_time_s
            and stats.median_rse(side.times_us) <= settings.target_rse
        )

    if all(converged(side) for side in sides):
        return "converged"
    if any(len(side.times_us) >= settings.max_samples for side in sides):
        return "max_samples"
    if any(side.wall_s >= settings.max_time_s for side in sides):
        return "max_time_s"
    return None


def sample_abba(
    sides: tuple[SideSamples, SideSamples],
    measure: Callable[[SideSamples], float],
    settings: TimingSettings,
    clock: ClockGuard | None = None,
) -> str:
    """Alternate A B B A until both sides have converged or one hits a cap; returns why it stopped."""
    order = (sides[0], sides[1], sides[1], sides[0])
    while True:
        for side in order:
            before = clock.read() if clock else None
            started = time.perf_counter()
            elapsed_us = measure(side)
            side.wall_s += time.perf_counter() - started
            after = clock.read() if clock else None
            if clock is not None and clock.sagged(before, after):
                side.dropped_clock += 1
            else:
                side.times_us.append(elapsed_us)
        reason = _stop_reason(sides, settings)
        if reason:
            return reason


# --------------------------------------------------------------------------------------------- CUDA


def l2_bytes_of_device() -> int:
    import torch

    size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    return int(size) if size else FALLBACK_L2_BYTES


class L2Flusher:
    """The judge's cold-cache step before every sample: persisting lines reset, then 2 x L2 read.

    It runs in the judge's process, so a side cannot skip it. Reading 2 x L2 evicts whatever the previous
    call left there and leaves only CLEAN lines behind. A write (fill_) left 2 x L2 of dirty lines, whose
    write-back then landed inside the next timed call: on an H200 that added ~4 us to a 15 us kernel against
    Nsight Compute's cold-cache figure.
    """

    def __init__(self, l2_bytes: int | None = None) -> None:
        import torch

        self.torch = torch
        self.flush_buffer = torch.zeros(2 * (l2_bytes or FALLBACK_L2_BYTES), dtype=torch.uint8, device="cuda")

    def flush(self) -> None:
        reset_persisting_l2()
        self.flush_buffer.max()


class TranslationReads:
    """A side's reads of one byte per 64 KiB of each of a case's tensors, queued before each sample's head start.

    Address translations belong to a process (its CUDA context). After the judge's flush, how cold a side's
    translations of its case's memory were depended on the process: on an H200, one 4 us kernel read 5.86 us in
    one process and 6.59 us in the next, alternately from one process pair to the next and steadily for a run,
    on whichever of its tensors it ran (benchmarks/gpu/context_cost.py). With these reads first, every process
    read it 5.86 us. They bring at most one 32-byte sector per 64 KiB of each tensor into the L2.
    """

    def __init__(self, tensors: list[Any]) -> None:
        import torch

        self.torch = torch
        self.reads: list[tuple[Any, Any, Any]] = []
        seen: set[int] = set()
        for tensor in tensors:
            if not torch.is_tensor(tensor) or tensor.device.type != "cuda":
                continue
            storage = tensor.untyped_storage()
            size, address = storage.nbytes(), storage.data_ptr()
            if not size or address in seen:
                continue
            seen.add(address)
            offsets = sorted({*range(0, size, TRANSLATION_STRIDE), size - 1})
            whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            index = torch.tensor(offsets, dtype=torch.int64, device=tensor.device)
            self.reads.append((whole, index, torch.empty(len(offsets), dtype=torch.uint8, device=tensor.device)))

    def queue(self) -> None:
        for whole, index, into in self.reads:
            self.torch.index_select(whole, 0, index, out=into)


def calls_per_graph(single_call_us: float) -> int:
    """Smallest power of two N with N calls >= ~1 ms, at most 4096."""
    if single_call_us <= 0:
        return GRAPH_MAX_CALLS
    wanted = math.ceil(GRAPH_TARGET_US / single_call_us)
    return min(GRAPH_MAX_CALLS, 1 << max(0, wanted - 1).bit_length())


def capture_graph(call: Call, n_calls: int) -> tuple[Any, bool]:
    """A CUDA graph of n_calls back-to-back calls, and whether the capture came out empty."""
    import warnings

    import torch

    side_stream = torch.cuda.Stream()
    side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side_stream):  # warm-up off the capture, as torch recommends
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side_stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            for _ in range(n_calls):
                call()
    torch.cuda.synchronize()
    empty = any("empty" in str(w.message).lower() for w in caught)
    return graph, empty


# --------------------------------------------------------------------------------------------- persisting L2


_cudart: Any = None
CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cudaLimitPersistingL2CacheSize


def cudart() -> Any:
    """libcudart through ctypes, from torch's own lib folder first (the runtime torch itself loaded)."""
    global _cudart
    if _cudart is None:
        import ctypes
        import glob
        import os

        import torch

        folder = os.path.join(os.path.dirname(torch.__file__), "lib")
        names = sorted(glob.glob(os.path.join(folder, "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(os.path.dirname(folder), "..", "nvidia", "cuda_runtime", "lib",
                                               "libcudart.so*")))
        names += ["libcudart.so", "libcudart.so.12", "libcudart.so.13"]
        for name in names:
            try:
                _cudart = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            _cudart = False
    return _cudart or None


def reset_persisting_l2() -> str | None:
    """Persisting-L2 set-aside to 0 and every persisting line back to normal; None when done, else why not."""
    lib = cudart()
    if lib is None:
        return "libcudart not found"
    import ctypes

    first = lib.cudaDeviceSetLimit(ctypes.c_int(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(0))
    second = lib.cudaCtxResetPersistingL2Cache()
    if first or second:
        return f"cudaDeviceSetLimit -> {first}, cudaCtxResetPersistingL2Cache -> {second}"
    return None


def persisting_l2_limit() -> int | None:
    """This context's persisting-L2 set-aside in bytes (a host-side query: no GPU work), or None if unreadable."""
    lib = cudart()
    if lib is None:
        return None
    import ctypes

    size = ctypes.c_size_t(0)
    if lib.cudaDeviceGetLimit(ctypes.byref(size), ctypes.c_int(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE)):
        return None
    return int(size.value)


# --------------------------------------------------------------------------------------------- host and launch


_sleep_rate: float | None = None


def _cycles_per_us(torch: Any) -> float:
    global _sleep_rate
    if _sleep_rate is None:
        if not hasattr(torch.cuda, "_sleep"):
            _sleep_rate = 0.0
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(100_000)
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            torch.cuda.synchronize()
            _sleep_rate = 1_000_000 / max(start.elapsed_time(end) * 1000.0, 1e-3)
    return _sleep_rate


def head_start_us(host_launch_us: float) -> float:
    """Delay the GPU by ~2x the host's launch time, so the start event never waits for the launch."""
    return min(HEAD_START_MAX_US, 2.0 * host_launch_us + 20.0)


def _median_host_launch_us(call: Call, torch: Any, repeats: int = 5) -> float:
    spent = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        call()
        spent.append((time.perf_counter() - started) * 1e6)
    torch.cuda.synchronize()
    return stats.median(spent)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
