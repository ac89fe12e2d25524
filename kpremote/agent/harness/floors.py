"""The physical floors a timing must respect: whether a measured time can be the bytes a row moves.

A side whose median is below bytes_moved / (1.1 x the device-to-device copy bandwidth) cannot be moving its
bytes through DRAM and is "implausible"; the copy bandwidth is measured before any task code is imported
(worker.py prepare), and a row is held to the fastest of its repeats (reachable_gbps): what a copy can reach. In graph mode a working set that fits in the L2 is held to the L2-resident copy
bandwidth instead, since back-to-back calls legitimately find their data there. The judge (judge.py) applies
the floor to the medians it recomputed itself. On the CPU no floor applies: there the copy bandwidth is a memcpy of
the standard library's, for the record only, and a CPU run's prepare step never imports torch for it.
"""

from __future__ import annotations

import time
from typing import Any

from . import stats

IMPLAUSIBLE_PREFIX = "implausible"
# Achieved bandwidth above this multiple of the measured copy bandwidth cannot be the bytes the row moves.
FLOOR_FACTOR = 1.1
DRAM_COPY = "device-to-device copy bandwidth (the probe's fastest copy)"
L2_COPY = "L2-resident copy bandwidth (the probe's fastest; graph mode, working set fits in the L2)"


def reachable_gbps(probe: dict[str, Any] | None) -> float | None:
    """The bandwidth a row is held to from one copy probe's record: its fastest repeat (since harness 2.16), else its
    median (a record from before 2.15 has no repeats). Torch's copy is not the fastest way to move bytes (a fused
    kernel reached 4410 GB/s on a four-GPU H200 whose probe medians read 4000-4190), and a probe whose every repeat
    ran slow made such honest rows implausible against its median in 4 of 54 runs there; their fastest repeats
    (4047-4116 GB/s) would have passed them."""
    if not probe:
        return None
    return probe.get("best_gbps") or probe.get("gbps")


def floor_bandwidth(mode: str, bytes_moved: int, l2_bytes: int, copy_gbps: float | None,
                    l2_copy_gbps: float | None) -> tuple[float | None, str]:
    """The copy bandwidth a row is held to, and its name: the L2-resident one only for a graph-mode working set
    that fits in the L2 (and only where it exceeds DRAM's)."""
    if mode == "graph" and l2_copy_gbps and copy_gbps and l2_copy_gbps > copy_gbps and bytes_moved <= l2_bytes:
        return l2_copy_gbps, L2_COPY
    return copy_gbps, DRAM_COPY


def floor_check(bytes_moved: int | None, median_us: float | None, copy_gbps: float | None,
                what: str = DRAM_COPY) -> str | None:
    """Why `median_us` is faster than moving `bytes_moved` can be (FLOOR_FACTOR x the copy bandwidth), or None."""
    achieved = achieved_gbps(bytes_moved, median_us)
    if achieved is None or not copy_gbps:
        return None
    if achieved > FLOOR_FACTOR * copy_gbps:
        floor_us = bytes_moved / (FLOOR_FACTOR * copy_gbps * 1e3)
        return (
            f"{IMPLAUSIBLE_PREFIX}: {median_us:.3g} us is under the physical floor of {floor_us:.3g} us "
            f"({achieved:.0f} GB/s for {bytes_moved} bytes moved, more than {FLOOR_FACTOR} x the {copy_gbps:.0f} GB/s "
            f"{what}; or bytes_moved is wrong)"
        )
    return None


def achieved_gbps(bytes_moved: int | None, median_us: float | None) -> float | None:
    if not bytes_moved or not median_us or median_us <= 0:
        return None
    return bytes_moved / (median_us * 1e-6) / 1e9


# --------------------------------------------------------------------------------------------- copy bandwidth


def measure_copy_bandwidth(device: str, *, max_bytes: int = 1 << 30, repeats: int = 10, copies: int = 1) -> dict[str, Any]:
    """Device-to-device copy bandwidth (bytes read + written per second): the roofline for memory-bound rows.

    `copies` back-to-back copies per event pair: a buffer that fits in the L2 copies in a few microseconds,
    too short for one event pair to time without its own overhead dominating. On the CPU: one memcpy of 32 MiB
    (a memoryview's slice copy, no torch), timed by the host clock.
    """
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info()
        nbytes = int(min(max_bytes, free // 4))
        src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        spent_us = []
        for _ in range(repeats):
            start.record()
            for _ in range(copies):
                dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            spent_us.append(start.elapsed_time(end) * 1000.0 / copies)
    else:
        nbytes = 32 * 1024 * 1024
        src = memoryview(b"\x01" * nbytes)
        dst = memoryview(bytearray(nbytes))
        dst[:] = src
        spent_us = []
        for _ in range(repeats):
            started = time.perf_counter()
            dst[:] = src
            spent_us.append((time.perf_counter() - started) * 1e6)
    median_us = stats.median(spent_us)
    return {
        "gbps": round(2 * nbytes / (median_us * 1e-6) / 1e9, 1),
        "bytes": nbytes,
        "median_us": round(median_us, 2),
        "repeats": repeats,
        # the spread of the repeats, for the record: whether a low probe (one four-GPU host's read 4008 GB/s where
        # its others read 4031-4196) was every copy slow or a few
        "best_gbps": round(2 * nbytes / (min(spent_us) * 1e-6) / 1e9, 1),
        "worst_gbps": round(2 * nbytes / (max(spent_us) * 1e-6) / 1e9, 1),
        "device": device,
    }
