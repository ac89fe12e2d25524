"""Whether a side's call does its work on the current stream, where the timed event pair sees it (side.py's
stream_check command, before a row is timed): work the call leaves on another stream would make its time a fiction.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from . import stats, timing

OFF_STREAM = "implausible: work not on the current stream"
STREAM_CHECK_REPEATS = 11
STREAM_CHECK_TRIES = 2  # measurements of the sync latencies; all must say "elsewhere" for the check to fail
STREAM_CHECK_DELAY_US = 2000.0


def stream_check(call: Callable[[], None], outputs: dict[str, Any], poison: Callable[[dict[str, Any]], None]) -> str | None:
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
    cycles = timing._cycles_per_us(torch) * STREAM_CHECK_DELAY_US
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


def _sync_latencies(call: Callable[[], None], torch: Any) -> tuple[float, float]:
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
