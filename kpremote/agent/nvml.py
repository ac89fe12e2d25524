"""GPU state of this host: one NVML snapshot, or the fixture file that stands in for NVML in tests.

KPREMOTE_NVML_FIXTURE (format: docs/nvml-fixture.md) is the project's only test double: hosts without a GPU
answer from it, re-read on every call so a test can change the "hardware" while a run is going on.
Nothing here raises: a host without NVML is a host with no GPUs and a one-line error saying why. A reading that
decides whether a GPU is idle (utilization, compute processes) is None when NVML could not give it, never 0 or
[]: the lease treats unreadable as busy (lease.idle_verdict).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

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


@dataclass
class GpuState:
    index: int
    uuid: str
    name: str
    cc: tuple[int, int]
    memory_used_mib: int
    memory_total_mib: int
    util_pct: int | None  # None: NVML could not read it
    temperature_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    clock_event_reasons: list[str]
    processes: list[dict] | None  # None: NVML could not read the list
    l2_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["cc"] = list(self.cc)
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "GpuState":
        """The inverse of to_json; optional fields may be left out (see docs/nvml-fixture.md)."""
        required = ("index", "uuid", "name", "cc", "memory_used_mib", "memory_total_mib")
        missing = [key for key in required if key not in record]
        if missing:
            raise ValueError(f"GPU record {record.get('index', '?')} lacks {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(f"GPU record {record['index']} has unknown keys {', '.join(unknown)}")
        major, minor = record["cc"]
        return cls(
            index=int(record["index"]),
            uuid=str(record["uuid"]),
            name=str(record["name"]),
            cc=(int(major), int(minor)),
            memory_used_mib=int(record["memory_used_mib"]),
            memory_total_mib=int(record["memory_total_mib"]),
            util_pct=_optional_int(record.get("util_pct", 0)),
            temperature_c=record.get("temperature_c"),
            power_w=record.get("power_w"),
            sm_clock_mhz=record.get("sm_clock_mhz"),
            sm_clock_max_mhz=record.get("sm_clock_max_mhz"),
            clock_event_reasons=list(record.get("clock_event_reasons", [])),
            processes=_process_records(record.get("processes", [])),
            l2_bytes=record.get("l2_bytes"),
        )


@dataclass
class Snapshot:
    hostname: str
    driver: str | None
    source: str  # "nvml" | "fixture" | "none"
    gpus: list[GpuState] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "driver": self.driver,
            "source": self.source,
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "error": self.error,
        }

    def find(self, key: str) -> GpuState | None:
        """The GPU named by its index ("0") or its UUID."""
        key = str(key).strip()
        for gpu in self.gpus:
            if key == str(gpu.index) or key.lower() == gpu.uuid.lower():
                return gpu
        return None


def snapshot() -> Snapshot:
    fixture = os.environ.get(FIXTURE_ENV)
    if fixture:
        return _snapshot_from_fixture(Path(fixture))
    return _snapshot_from_nvml()


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


def sm_clock_mhz(uuid: str) -> int | None:
    """The GPU's current SM clock, cheap enough to read between timed samples."""
    fixture = os.environ.get(FIXTURE_ENV)
    if fixture:
        gpu = _snapshot_from_fixture(Path(fixture)).find(uuid)
        return gpu.sm_clock_mhz if gpu else None
    try:
        pynvml = _nvml()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - a missing clock reading must never disturb timing
        return None


def decode_clock_event_reasons(mask: int) -> list[str]:
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


# ---------------------------------------------------------------------------------------------- fixture


def _snapshot_from_fixture(path: Path) -> Snapshot:
    hostname = socket.gethostname()
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


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _process_records(processes: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The fixture's process list; null says NVML could not read it."""
    return None if processes is None else [_process_record(p) for p in processes]


def _process_record(process: dict[str, Any]) -> dict[str, Any]:
    return {"pid": process.get("pid"), "name": process.get("name"), "used_mib": process.get("used_mib")}


# ---------------------------------------------------------------------------------------------- NVML

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
    hostname = socket.gethostname()
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
