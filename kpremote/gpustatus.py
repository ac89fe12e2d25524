"""`inv gpu-status` and `inv hosts --check`: ask every host at once, one channel each, and keep going past failures."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar

from pydantic import BaseModel

from .agentcall import Agent
from .config import Host
from .errors import KpremoteError
from .transport import open_transport

GPU_STATUS_SCHEMA = "kpremote.gpu-status/1"
T = TypeVar("T")


class Process(BaseModel):
    pid: int
    name: Optional[str] = None
    used_mib: Optional[int] = None


class GpuReport(BaseModel):
    index: int
    uuid: str
    name: str
    cc: tuple[int, int]
    memory_used_mib: int
    memory_total_mib: int
    util_pct: int
    temperature_c: Optional[int] = None
    power_w: Optional[float] = None
    sm_clock_mhz: Optional[int] = None
    sm_clock_max_mhz: Optional[int] = None
    clock_event_reasons: list[str] = []
    processes: list[Process] = []
    lease: Optional[dict[str, Any]] = None
    idle: bool
    reason: Optional[str] = None
    arch_ok: bool = True


class HostReport(BaseModel):
    host: str
    ok: bool
    error: Optional[str] = None
    hostname: Optional[str] = None
    driver: Optional[str] = None
    source: Optional[str] = None
    gpus: list[GpuReport] = []
    seconds: float = 0.0


class HostInfo(BaseModel):
    host: str
    ok: bool
    error: Optional[str] = None
    hostname: Optional[str] = None
    python: Optional[str] = None
    torch: Optional[str] = None
    triton: Optional[str] = None
    pynvml: Optional[str] = None
    cuda: Optional[str] = None
    seconds: float = 0.0


def on_every_host(hosts: list[Host], ask: Callable[[Host, Agent], T]) -> list[T]:
    """Run ask(host, agent) on all hosts in parallel, one connection each; results in host order."""

    def one(host: Host) -> T:
        transport = open_transport(host)
        try:
            return ask(host, Agent(host, transport))
        finally:
            transport.close()

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def probe_host(host: Host, agent: Agent) -> HostReport:
    if host.is_cluster:  # a Slurm cluster: its nodes, from sinfo / squeue (kpremote/slurm.py)
        from .slurm import probe_cluster

        return probe_cluster(host, agent)
    started = time.monotonic()
    try:
        answer = agent.call_json("probe", "--idle", host.idle.model_dump_json(), "--arch", host.arch)
    except KpremoteError as exc:
        return HostReport(host=host.name, ok=False, error=str(exc), seconds=time.monotonic() - started)
    error = answer.get("error")
    return HostReport(
        host=host.name,
        ok=error is None,
        error=error,
        hostname=answer.get("hostname"),
        driver=answer.get("driver"),
        source=answer.get("source"),
        gpus=[GpuReport.model_validate(gpu) for gpu in answer.get("gpus", [])],
        seconds=time.monotonic() - started,
    )


def info_host(host: Host, agent: Agent) -> HostInfo:
    started = time.monotonic()
    try:
        answer = agent.call_json("info", "--fast")
    except KpremoteError as exc:
        return HostInfo(host=host.name, ok=False, error=str(exc), seconds=time.monotonic() - started)
    fields = {k: answer.get(k) for k in ("hostname", "python", "torch", "triton", "pynvml", "cuda")}
    return HostInfo(host=host.name, ok=True, seconds=time.monotonic() - started, **fields)


def gpu_status(hosts: list[Host]) -> list[HostReport]:
    return on_every_host(hosts, probe_host)


def gpu_status_json(reports: list[HostReport]) -> str:
    """The documented, stable --json shape (README: gpu-status)."""
    return json.dumps(
        {"schema": GPU_STATUS_SCHEMA, "hosts": [r.model_dump(exclude={"seconds"}) for r in reports]}, indent=1
    )
