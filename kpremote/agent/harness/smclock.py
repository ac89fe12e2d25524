"""The SM clock around a timed sample (timing.sample_abba): read through NVML before and after, and a sample taken
while it sagged under CLOCK_SAG_FRACTION of its maximum is dropped and counted, not kept."""

from __future__ import annotations

from typing import Callable

CLOCK_SAG_FRACTION = 0.75


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
