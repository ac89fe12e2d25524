"""`inv gpu-status` and `inv hosts --check`: ask every host at once (fanout.py), one channel each, and keep going past
failures."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from ..agent.protocol import ProbedGpu, Snapshot
from .agentclient import Agent
from .config import Host
from .fanout import on_every_host
from ..errors import KpremoteError

# Where a host's GPU readings came from (README, gpu-status): NVML, the test fixture, or none at all (`error` says why:
# no NVML there, or the host could not be asked).
SOURCES = ("nvml", "fixture", "none")


class HostAnswer(BaseModel):
    """What every host's answer starts with: which host, whether it answered, why not, and its own name for itself."""

    host: str
    ok: bool
    error: Optional[str] = None
    hostname: Optional[str] = None
    answered: bool = Field(True, exclude=True)
    """False when the host could not be asked at all (unreachable, refused key, no agent or python there): exit 2, as
    for run and sync; a failure the host reports itself (NVML missing, Slurm's check) is an answer. Not in --json."""


class HostReport(HostAnswer):
    driver: Optional[str] = None
    source: Optional[str] = None
    gpus: list[ProbedGpu] = []  # the agent's own record of each GPU (protocol.py)
    seconds: float = 0.0


class ClusterReport(HostReport):
    """A Slurm cluster's gpu-status: its nodes and queue from sinfo / squeue (agent slurm-nodes) instead of GPUs."""

    nodes: list[dict[str, Any]] = []
    pending_jobs: int = 0
    pending_ours: list[dict[str, Any]] = []


class HostInfo(HostAnswer):
    python: Optional[str] = None
    torch: Optional[str] = None
    triton: Optional[str] = None
    pynvml: Optional[str] = None
    tvm_ffi: Optional[str] = None  # apache-tvm-ffi, for build kind "tvm-ffi"
    cutlass_dsl: Optional[str] = None  # nvidia-cutlass-dsl, for build kind "cutedsl"
    cuda: Optional[str] = None
    sandbox: Optional[str] = None  # what the host lets a side's sandbox hold: "sandboxed", "partial: ...", ...
    slurm: Optional[dict[str, Any]] = None  # a cluster's: {"ok", "checks": [{"check", "ok", "detail"}]} (slurm-check)
    seconds: float = 0.0

    @property
    def reachable(self) -> bool:
        """The host answered (a cluster whose Slurm failed its check did, yet is not ok): HostAnswer.answered."""
        return self.answered


NO_NVIDIA_DRIVER = "NVML Shared Library Not Found"
"""pynvml's word for a machine without the NVIDIA driver: on the `local` host, a CPU machine, not a failure."""


def probe_host(host: Host, agent: Agent) -> HostReport:
    if host.is_cluster:  # a Slurm cluster: its nodes, from sinfo / squeue
        return probe_cluster(host, agent)
    started = time.monotonic()
    try:
        answer = agent.call_json("probe", "--idle", host.idle.to_json(), "--arch", host.arch)
    except KpremoteError as exc:
        return HostReport(host=host.name, ok=False, error=str(exc), source="none", seconds=time.monotonic() - started,
                          answered=False)
    try:
        probed = Snapshot.from_json(answer, ProbedGpu)  # each field of its type
    except ValueError as exc:  # a host that answers another shape is a host that could not be asked: exit 2
        return HostReport(host=host.name, ok=False, error=f"a malformed probe answer: {exc}",
                          source="none", seconds=time.monotonic() - started, answered=False)
    error = probed.error
    if error and host.transport == "local" and NO_NVIDIA_DRIVER in error and not probed.gpus:
        error = None  # this machine has no NVIDIA driver: a CPU machine, where runs are smoke runs, not a failure
    return HostReport(
        host=host.name,
        ok=error is None,
        error=error,
        hostname=answer.get("hostname"),  # as sent (Snapshot reads a missing one as "?")
        driver=probed.driver,
        source=probed.source if probed.source in SOURCES else "none",
        gpus=probed.gpus,
        seconds=time.monotonic() - started,
    )


def probe_cluster(host: Host, agent: Agent) -> ClusterReport:
    """gpu-status for a cluster: its nodes from sinfo / squeue, in a HostReport with a `nodes` list added."""
    started = time.monotonic()
    try:
        answer = agent.call_json("slurm-nodes")
    except KpremoteError as exc:
        return ClusterReport(host=host.name, ok=False, error=str(exc), source="slurm",
                             seconds=time.monotonic() - started)
    return ClusterReport(host=host.name, ok=True, hostname=answer.get("hostname"), source="slurm",
                         nodes=answer.get("nodes", []), pending_jobs=answer.get("pending_jobs", 0),
                         pending_ours=answer.get("pending_ours", []), seconds=time.monotonic() - started)


def info_host(host: Host, agent: Agent) -> HostInfo:
    started = time.monotonic()
    try:
        answer = agent.call_json("info", "--fast")
    except KpremoteError as exc:
        return HostInfo(host=host.name, ok=False, error=str(exc), seconds=time.monotonic() - started, answered=False)
    fields = {k: answer.get(k) for k in ("hostname", "python", "torch", "triton", "pynvml", "tvm_ffi", "cutlass_dsl", "cuda",
                                         "sandbox")}
    if host.is_cluster:  # reachable is not enough: what a run needs of Slurm, asked of Slurm (check_cluster)
        slurm, error = check_cluster(host, agent)
        return HostInfo(host=host.name, ok=error is None, error=error, slurm=slurm,
                        seconds=time.monotonic() - started, **fields)
    return HostInfo(host=host.name, ok=True, seconds=time.monotonic() - started, **fields)


def check_cluster(host: Host, agent: Agent) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(slurm-check's answer, the error naming the first check that failed, or None): sinfo answers from the login
    node's non-interactive session, the partition exists, sbatch --test-only takes the host's settings."""
    settings = {key: value for key, value in (host.slurm or {}).items() if value is not None}
    try:
        answer = agent.call_json("slurm-check", "--settings", json.dumps(settings))
    except KpremoteError as exc:
        return None, f"{host.name}: Slurm check: {exc}"
    failed = [c for c in answer.get("checks", []) if not c.get("ok")]
    if failed:
        return answer, f"{host.name}: Slurm: {failed[0]['check']}: {failed[0]['detail']}"
    return answer, None


def gpu_status(hosts: list[Host], waiting_for: Optional[Callable[[list[str]], None]] = None) -> list[HostReport]:
    return on_every_host(hosts, probe_host, waiting_for)


def gpu_status_body(reports: list[HostReport]) -> dict[str, Any]:
    """The documented, stable --json fields (README: gpu-status; docs/schemas/gpu-status.json)."""
    # l2_bytes is a run's reading (the device probe's), never a probe's: not in the document
    return {"hosts": [r.model_dump(exclude={"seconds": True, "gpus": {"__all__": {"l2_bytes"}}}) for r in reports]}
