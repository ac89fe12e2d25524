"""What a run's prepare worker measures of its GPU before any task code is imported (run/worker.py, the device
probe): whether the L2 flush really evicts (flush_probe: a copy warm and after the flush) and what an empty call's
event pair reads (empty_window, the audit's floor for a cold row starts from its least)."""

from __future__ import annotations

import time
from typing import Any

from . import stats, timing
from .timing import L2Flusher, l2_bytes_of_device, reset_persisting_l2

PROBE_REPEATS = 5
FLUSH_PROBE_MIN_RATIO = 1.1  # a flushed copy must be this much slower than a warm one (H200: 1.16-1.31, docs/trust.md)
PROBE_RAMP_S = 0.1  # copies before the probe: on the H200 one run's probe read 17.5 us warm (8 us as a rule)
EMPTY_WINDOW_SAMPLES = 200  # event pairs with nothing between them: what an empty call costs (empty_window)
PROBE_HEAD_START_US = 20.0  # the sleep queued before each probe copy, so its launch stays out of the window


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
    head_start = int(PROBE_HEAD_START_US * timing._cycles_per_us(torch))

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
    head_start = int(PROBE_HEAD_START_US * timing._cycles_per_us(torch))
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
