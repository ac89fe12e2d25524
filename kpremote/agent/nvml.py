"""GPU state of this host: one NVML snapshot, or the fixture file that stands in for NVML in tests.

KPREMOTE_NVML_FIXTURE (format: docs/nvml-fixture.md) is the project's only test double, and reader() is its one
seam: at the first reading a process decides once whether its readings come from NVML or from the file the variable
names; the file is then re-read on every call, so a test can change the "hardware" while a run is going on.
Nothing here raises: a host without NVML is a host with no GPUs and a one-line error saying why. A reading that
decides whether a GPU is idle (utilization, compute processes) is None when NVML could not give it, never 0 or
[]: the lease treats unreadable as busy (lease.idle_verdict).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .protocol import GpuState, Snapshot

FIXTURE_ENV = "KPREMOTE_NVML_FIXTURE"

# NVML clock-event (formerly "throttle") reason bits; the values are stable across driver versions.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def snapshot() -> Snapshot:
    return reader().snapshot()


def sm_clock_mhz(uuid: str) -> int | None:
    """The GPU's current SM clock, cheap enough to read between timed samples."""
    return reader().sm_clock_mhz(uuid)


@functools.lru_cache(maxsize=1)
def reader() -> NvmlReader | FixtureReader:
    """Where this process's GPU readings come from, decided once: the fixture file KPREMOTE_NVML_FIXTURE names (a
    host without a GPU, in tests), else NVML itself (also when the variable is empty)."""
    fixture = os.environ.get(FIXTURE_ENV)
    return FixtureReader(Path(fixture)) if fixture else NvmlReader()


def resolve_device(device: str, snapshot_fn: Callable[[], Snapshot] | None = None) -> str:
    """The device a run uses: any but "auto" as asked; "auto" is cuda only where NVML itself shows a GPU (a fixture
    host's GPUs are not real: it leases one and still runs on the CPU), and cpu where NVML cannot be read at all."""
    if device != "auto":
        return device
    try:
        snap = (snapshot_fn or snapshot)()
    except Exception:  # noqa: BLE001 - no NVML: no GPU
        return "cpu"
    return "cuda" if snap.source == "nvml" and snap.gpus else "cpu"


def decode_clock_event_reasons(mask: int) -> list[str]:
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


# ---------------------------------------------------------------------------------------------- fixture


@dataclass(frozen=True)
class FixtureReader:
    """Readings from the fixture file, re-read on every call (docs/nvml-fixture.md)."""

    path: Path

    def snapshot(self) -> Snapshot:
        return _snapshot_from_fixture(self.path)

    def sm_clock_mhz(self, uuid: str) -> int | None:
        gpu = self.snapshot().find(uuid)
        return gpu.sm_clock_mhz if gpu else None


def _hostname() -> str:
    """This machine's name, as socket.gethostname() says it (both read uname's nodename) without importing socket:
    a probe runs on every host at every gpu-status."""
    return os.uname().nodename


def _snapshot_from_fixture(path: Path) -> Snapshot:
    hostname = _hostname()
    try:
        data = json.loads(path.read_text())
        gpus = [GpuState.from_json(record) for record in data.get("gpus", [])]
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return Snapshot(hostname, None, "fixture", [], f"NVML fixture {path}: {_one_line(exc)}")
    return Snapshot(
        hostname=str(data.get("hostname") or hostname),
        driver=data.get("driver"),
        source="fixture",
        gpus=gpus,
        error=data.get("error"),
    )


# ---------------------------------------------------------------------------------------------- NVML


class NvmlReader:
    """Readings from NVML itself (pynvml, initialised at the first one)."""

    def snapshot(self) -> Snapshot:
        return _snapshot_from_nvml()

    def sm_clock_mhz(self, uuid: str) -> int | None:
        try:
            pynvml = _nvml()
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - a missing clock reading must never disturb timing
            return None


_nvml_module = None


def _nvml():
    """pynvml, initialised once per process (nvmlInit costs milliseconds; the timing loop reads clocks often)."""
    global _nvml_module
    if _nvml_module is None:
        import pynvml

        pynvml.nvmlInit()
        _nvml_module = pynvml
    return _nvml_module


def _snapshot_from_nvml() -> Snapshot:
    hostname = _hostname()
    try:
        pynvml = _nvml()
    except ImportError:
        return Snapshot(hostname, None, "none", [], "pynvml is not installed (pip package nvidia-ml-py)")
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses: no driver, no library, no permission
        return Snapshot(hostname, None, "none", [], f"NVML init failed: {_one_line(exc)}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        count = pynvml.nvmlDeviceGetCount()
        gpus = [_read_gpu(pynvml, index) for index in range(count)]
    except Exception as exc:  # noqa: BLE001
        return Snapshot(hostname, None, "none", [], f"NVML query failed: {_one_line(exc)}")
    return Snapshot(hostname, driver, "nvml", gpus)


def _read_gpu(pynvml: Any, index: int) -> GpuState:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    utilization = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
    power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
    return GpuState(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        cc=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
        memory_used_mib=int(memory.used) // (1024 * 1024),
        memory_total_mib=int(memory.total) // (1024 * 1024),
        util_pct=int(utilization.gpu) if utilization is not None else None,
        temperature_c=_optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
        sm_clock_mhz=_optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        sm_clock_max_mhz=_optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
        clock_event_reasons=_clock_event_reasons(pynvml, handle),
        processes=_compute_processes(pynvml, handle),
    )


def _clock_event_reasons(pynvml: Any, handle: Any) -> list[str]:
    # Newer drivers renamed "throttle reasons" to "clock event reasons"; older bindings only have the old name.
    read = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    mask = _optional(read, handle) if read else None
    if mask is None:
        mask = _optional(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    return decode_clock_event_reasons(int(mask)) if mask is not None else []


def _compute_processes(pynvml: Any, handle: Any) -> list[dict[str, Any]] | None:
    running = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if running is None:
        return None
    return [
        {
            "pid": int(proc.pid),
            "name": _process_name(int(proc.pid)),
            "used_mib": int(proc.usedGpuMemory) // (1024 * 1024) if proc.usedGpuMemory is not None else None,
        }
        for proc in running
    ]


def _process_name(pid: int) -> str | None:
    # Inside a container NVML reports host pids, which this /proc may not show: the name is then unknown.
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def _optional(read: Callable[..., Any] | None, *args: Any) -> Any:
    """One NVML reading, or None where this GPU or driver could not give it (not supported, no permission, lost)."""
    if read is None:
        return None
    try:
        return read(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"
