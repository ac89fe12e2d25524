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

Whether a measured time is physically possible at all is floors.py's question.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import stats
from ..task.taskspec import TimingSettings

OFF_STREAM = "implausible: work not on the current stream"
CLOCK_SAG_FRACTION = 0.75
FALLBACK_L2_BYTES = 60 * 1024 * 1024
GRAPH_TARGET_US = 1000.0
GRAPH_MAX_CALLS = 4096
SMOKE_SAMPLES = 4  # two ABBA rounds: enough to exercise the path on a slow interpreter
HEAD_START_MAX_US = 2000.0
STREAM_CHECK_REPEATS = 11
STREAM_CHECK_TRIES = 2  # measurements of the sync latencies; all must say "elsewhere" for the check to fail
STREAM_CHECK_DELAY_US = 2000.0
PROBE_REPEATS = 5
FLUSH_PROBE_MIN_RATIO = 1.1  # a flushed copy must be this much slower than a warm one (H200: 1.16-1.31, docs/trust.md)
PROBE_RAMP_S = 0.1  # copies before the probe: on the H200 one run's probe read 17.5 us warm (8 us as a rule)
EMPTY_WINDOW_SAMPLES = 200  # event pairs with nothing between them: what an empty call costs (empty_window)
PROBE_HEAD_START_US = 20.0  # the sleep queued before each probe copy, so its launch stays out of the window
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


# --------------------------------------------------------------------------------------------- SM clock


class ClockGuard:
    """Reads the SM clock around samples through NVML; a sample taken while it sagged is not kept."""

    def __init__(self, read: Callable[[], int | None], max_mhz: int) -> None:
        self._read = read
        self.max_mhz = max_mhz

    @classmethod
    def for_gpu(cls, uuid: str | None, max_mhz: int | None) -> tuple["ClockGuard | None", str]:
        """The guard, or None and why the clock cannot be watched."""
        if not uuid:
            return None, "unavailable: GPU UUID unknown"
        try:
            from .. import nvml
        except ImportError as exc:
            return None, f"unavailable: {exc}"
        if not max_mhz:
            gpu = nvml.snapshot().find(uuid)
            max_mhz = gpu.sm_clock_max_mhz if gpu else None
        if not max_mhz or nvml.sm_clock_mhz(uuid) is None:
            return None, "unavailable: NVML gives no SM clock for this GPU"
        return cls(lambda: nvml.sm_clock_mhz(uuid), int(max_mhz)), f"on: samples under {CLOCK_SAG_FRACTION:.0%} of {max_mhz} MHz dropped"

    def read(self) -> int | None:
        return self._read()

    def sagged(self, *readings: int | None) -> bool:
        floor = CLOCK_SAG_FRACTION * self.max_mhz
        return any(r is not None and r < floor for r in readings)


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


def flush_probe(l2_bytes: int | None = None) -> dict[str, Any]:
    """Shows the flush really evicts: one copy of a quarter-L2 buffer, warm (just copied) vs after the flush.

    A copy is bound by memory alone, so where its source sits (L2 or HBM) sets its time; a reduction (the first
    probe, `max`) was bound by its own arithmetic and read the same either way. Each copy is timed behind a sleep
    kernel, so the window holds the copy and not its launch.
    """
    import torch

    l2 = l2_bytes or l2_bytes_of_device()
    source = torch.ones(max(1, l2 // 4), dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    flusher = L2Flusher(l2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    head_start = int(PROBE_HEAD_START_US * _cycles_per_us(torch))

    def copy_time() -> float:
        torch.cuda._sleep(head_start)
        start.record()
        target.copy_(source)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0

    ramp_until = time.perf_counter() + PROBE_RAMP_S  # an idle GPU's clocks come up before anything is timed
    while time.perf_counter() < ramp_until:
        for _ in range(20):
            target.copy_(source)
        torch.cuda.synchronize()
    warm, cold = [], []
    for _ in range(PROBE_REPEATS):
        target.copy_(source)
        torch.cuda.synchronize()
        warm.append(copy_time())
        flusher.flush()
        torch.cuda.synchronize()
        cold.append(copy_time())
    warm_us, cold_us = stats.median(warm), stats.median(cold)
    return {"warm_us": round(warm_us, 2), "flushed_us": round(cold_us, 2), "buffer_bytes": source.numel(),
            "ratio": round(cold_us / warm_us, 2) if warm_us > 0 else None, "method": "copy",
            "evicts": cold_us > FLUSH_PROBE_MIN_RATIO * warm_us, "persisting_reset": reset_persisting_l2() or "ok"}


def empty_window(samples: int = EMPTY_WINDOW_SAMPLES) -> dict[str, Any]:
    """What an empty call costs on this GPU now: the event pair of a timed sample, behind the same kind of head
    start, with nothing between its events (min, median, p10, p90 in us). The audit's floor for a cold row
    (audit.py) starts from its minimum: a window holds its kernels and about this much more, and a host that stalls
    between the two records for longer than the head start lengthens a window, never shortens one (on the H200 one
    run's probe read a median of 1.92 us, p10 1.44, p90 2.85, where the others read 1.28-1.34). Taken by the device
    probe, before any task code is imported in that process, so no side can shape it."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    head_start = int(PROBE_HEAD_START_US * _cycles_per_us(torch))
    windows = []
    for _ in range(samples):
        torch.cuda._sleep(head_start)
        start.record()
        end.record()
        torch.cuda.synchronize()
        windows.append(start.elapsed_time(end) * 1000.0)
    ordered = sorted(windows)
    return {"min_us": round(ordered[0], 4), "median_us": round(stats.median(windows), 4),
            "p10_us": round(ordered[len(ordered) // 10], 4), "p90_us": round(ordered[(9 * len(ordered)) // 10], 4),
            "samples": samples}


# --------------------------------------------------------------------------------------------- honesty checks


def stream_check(call: Call, outputs: dict[str, Any], poison: Callable[[dict[str, Any]], None]) -> str | None:
    """Why the call's work is evidently not ordered on the current stream, or None.

    1. With the current stream held back by a 2 ms sleep, the outputs are copied on the current stream right
       after the call: work the call left on another stream is not finished then, so the copy differs from the
       outputs read after a device-wide sync.
    2. The host waits for the current stream, then for the whole device: if the device still has far more to
       do than the current stream had, the call's work runs elsewhere and its event time would be a fiction.
    """
    import torch

    from .correctness import same_bits

    poison(outputs)
    torch.cuda.synchronize()
    cycles = _cycles_per_us(torch) * STREAM_CHECK_DELAY_US
    if cycles:
        torch.cuda._sleep(int(cycles))
    call()
    snapshot = {name: t.clone() for name, t in outputs.items() if torch.is_tensor(t)}
    torch.cuda.synchronize()
    late = [name for name, copy in snapshot.items() if not same_bits(copy, outputs[name])]
    if late:
        return (
            f"{OFF_STREAM}: output {late[0]!r} was still being written after the current stream's work "
            f"had finished (complete only after a device-wide sync)"
        )
    return off_stream_by_latency(lambda: _sync_latencies(call, torch))


def off_stream_by_latency(measure: Callable[[], tuple[float, float]]) -> str | None:
    """Why the sync latencies say the call's work runs elsewhere, or None. Work left on another stream is there every
    time; a host busy during one measurement (a row's nine processes share its cores) is not: every one of
    STREAM_CHECK_TRIES measurements must say so (harness 2.9; 2.8 took one: on the H200 one of 80 checks, five runs of
    two rows by four pairs, failed an honest baseline)."""
    readings = []
    for _ in range(STREAM_CHECK_TRIES):
        stream_us, device_us = measure()
        if device_us - stream_us <= max(20.0, 0.25 * device_us):
            return None
        readings.append(f"{stream_us:.1f} / {device_us:.1f} us")
    return (f"{OFF_STREAM}: the current stream was done sooner after the launch than the device, "
            f"{STREAM_CHECK_TRIES} times in a row (stream / device: {'; '.join(readings)})")


def _sync_latencies(call: Call, torch: Any) -> tuple[float, float]:
    stream_wait, device_wait = [], []
    for _ in range(STREAM_CHECK_REPEATS):
        for waits, wait in ((stream_wait, torch.cuda.current_stream().synchronize), (device_wait, torch.cuda.synchronize)):
            torch.cuda.synchronize()
            started = time.perf_counter()
            call()
            wait()
            waits.append((time.perf_counter() - started) * 1e6)
    torch.cuda.synchronize()
    return stats.median(stream_wait), stats.median(device_wait)


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
