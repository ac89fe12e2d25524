"""Which GPU a run may use, and the lease that keeps every other run off it.

A lease is an flock on ROOT/locks/<uuid>.lock with a holder record (JSON) written inside the file. The lock
lives and dies with the open file: a holder that crashes or is SIGKILLed frees its GPU with no cleanup, and
the record it leaves behind is merely stale (holders() only reports records whose lock is held now).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .nvml import GpuState, Snapshot, snapshot
from .protocol import AgentError, ArchMismatch, BadRequest, GpuNotFound, IdlePolicy, NoIdleGpu  # noqa: F401 - re-exported

POLL_S = 1.0
# How often a failed lock attempt is retried at once: holders() probes locks with a brief shared flock, and
# an acquirer that collides with such a probe must not report the GPU as leased.
LOCK_TRIES = 3


def idle_verdict(gpu: GpuState, policy: IdlePolicy) -> tuple[bool, str]:
    """(idle, why not); the reason is "idle" when it is. A reading NVML could not give counts as busy."""
    reasons = []
    if gpu.processes is None and not policy.allow_processes:
        reasons.append("process list unreadable")
    elif gpu.processes and not policy.allow_processes:
        reasons.append(_describe_processes(gpu.processes))
    if gpu.memory_used_mib > policy.max_memory_mib:
        reasons.append(f"{gpu.memory_used_mib} MiB used > {policy.max_memory_mib} MiB")
    if gpu.util_pct is None:
        reasons.append("utilization unreadable")
    elif gpu.util_pct > policy.max_util_pct:
        reasons.append(f"util {gpu.util_pct}% > {policy.max_util_pct}%")
    return (not reasons, "; ".join(reasons) or "idle")


def _describe_processes(processes: list[dict]) -> str:
    shown = ", ".join(f"pid {p.get('pid')} {p.get('name') or '?'}" for p in processes[:3])
    more = f", +{len(processes) - 3} more" if len(processes) > 3 else ""
    noun = "process" if len(processes) == 1 else "processes"
    return f"{len(processes)} compute {noun} ({shown}{more})"


@dataclass(frozen=True)
class GpuModel:
    """The GPU a task arch names: by NVML's name first, its memory size second, compute capability third."""

    called: str  # as a refusal says it: "an H200"
    name: re.Pattern[str]  # matches NVML's name ("NVIDIA H200", "NVIDIA H200 NVL"); GH200 and GB200 are not these
    memory_gib: tuple[int, int]  # NVML's memory total lies in this range (H200: 143771 MiB)
    cc: tuple[int, int]  # compute capability, the third check


# H100 and H200 are both compute capability 9.0: only the name and the memory tell them apart.
ARCH_MODELS: dict[str, GpuModel] = {
    "b200": GpuModel("a B200", re.compile(r"\bB200\b", re.I), (170, 200), (10, 0)),
    "h200": GpuModel("an H200", re.compile(r"\bH200\b", re.I), (130, 150), (9, 0)),
    "h100": GpuModel("an H100", re.compile(r"\bH100\b", re.I), (70, 100), (9, 0)),
}
ANY_ARCH = {"any", "auto"}


def task_arches(arch: str | Sequence[str]) -> tuple[str, ...]:
    """The arches a task runs on, lower-cased: one name, a comma-separated list, or a list."""
    names = arch.split(",") if isinstance(arch, str) else list(arch)
    arches = tuple(name.strip().lower() for name in names if name.strip())
    unknown = [name for name in arches if name not in ARCH_MODELS and name not in ANY_ARCH]
    if unknown or not arches:
        known = ", ".join([*ARCH_MODELS, *sorted(ANY_ARCH)])
        raise BadRequest(f"unknown arch {(unknown[0] if unknown else arch)!r} (known: {known})")
    return arches


def arch_refusal(arch: str | Sequence[str], gpu: GpuState) -> str | None:
    """Why the task's arch does not run on this GPU ("GPU 0 (NVIDIA H100 80GB HBM3) is not an H200"); None: it does."""
    arches = task_arches(arch)
    if ANY_ARCH.intersection(arches):
        return None
    reasons = [_why_not(ARCH_MODELS[name], gpu) for name in arches]
    if None in reasons:
        return None
    return f"GPU {gpu.index} ({gpu.name}) {' and '.join(dict.fromkeys(reasons))}"


def _why_not(model: GpuModel, gpu: GpuState, plural: bool = False) -> str | None:
    """The first check the GPU fails ("is not an H200", "has 80 GiB of memory (...)"), or None: it is that model."""
    verb = ("are", "have") if plural else ("is", "has")
    if not model.name.search(gpu.name):
        return f"{verb[0]} not {model.called}"
    low, high = model.memory_gib
    gib = gpu.memory_total_mib / 1024
    if not low <= gib <= high:
        return f"{verb[1]} {gib:.0f} GiB of memory ({model.called} has {low}-{high} GiB)"
    if tuple(gpu.cc) != model.cc:
        needed = ".".join(map(str, model.cc))
        return f"{verb[1]} compute capability {gpu.cc[0]}.{gpu.cc[1]} ({model.called} has {needed})"
    return None


class Lease:
    """An flock'd fd on the GPU's lock file; the holder record is inside that file."""

    def __init__(self, gpu: GpuState, path: Path, fd: int) -> None:
        self.gpu = gpu
        self.path = path
        self.fd = fd

    def record(self) -> dict[str, Any]:
        return _parse_record(os.pread(self.fd, 1 << 16, 0))

    def write_record(self, record: dict[str, Any]) -> None:
        data = json.dumps(record).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Give the GPU back: clear the record, then unlock (for every process sharing this open file)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = -1

    def hand_over(self) -> None:
        """Close only our fd: a child that inherited it holds the lease from now on (flock follows the open file)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_path(root: Path, uuid: str) -> Path:
    return Path(root) / "locks" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', uuid)}.lock"


def holder_record(*, run_id: str, task: str, pid: int | None = None) -> dict[str, Any]:
    import socket  # here, not at the top: a probe (gpu-status) imports this module and writes no lease

    return {
        "pid": pid if pid is not None else os.getpid(),
        "run_id": run_id,
        "task": task,
        "user": _user(),
        "host": socket.gethostname(),
        "since": utc_now_iso(),
    }


def acquire(
    root: Path,
    *,
    policy: IdlePolicy,
    arch: str | Sequence[str],
    run_id: str,
    task: str,
    gpu: str | None = None,
    wait_s: float = 0.0,
    snapshot_fn: Callable[[], Snapshot] = snapshot,
    on_wait: Callable[[Snapshot, dict[str, str]], None] | None = None,
) -> Lease:
    """Lease the best idle GPU (least memory used, then highest index), or the one `gpu` names.

    While it waits, on_wait(snapshot, why each GPU is not free) is called once per poll: the caller tells its
    user what it waits for, and may raise to stop waiting (its client went away, a cancel arrived).
    """
    deadline = time.monotonic() + max(0.0, wait_s)
    record = holder_record(run_id=run_id, task=task)
    while True:
        snap = snapshot_fn()
        candidates = _candidates(snap, arch, gpu)
        lease, verdicts = _lease_first_idle(Path(root), candidates, policy, record, snapshot_fn)
        if lease is not None:
            return lease
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NoIdleGpu(_busy_table(snap, verdicts, wanted=gpu))
        if on_wait is not None:
            on_wait(snap, verdicts)
        time.sleep(min(POLL_S, remaining))


def _candidates(snap: Snapshot, arch: str | Sequence[str], wanted: str | None) -> list[GpuState]:
    if not snap.gpus:
        raise NoIdleGpu(f"no GPUs visible on {snap.hostname}: {snap.error or 'NVML reports none'}")
    gpus = snap.gpus
    if wanted is not None:
        chosen = snap.find(wanted)
        if chosen is None:
            have = ", ".join(f"{g.index} ({g.uuid})" for g in snap.gpus)
            raise GpuNotFound(f"no GPU {wanted!r} on {snap.hostname}; it has {have}")
        gpus = [chosen]
    right_arch = [g for g in gpus if arch_refusal(arch, g) is None]
    if not right_arch:
        raise ArchMismatch(_arch_message(arch, gpus))
    return sorted(right_arch, key=lambda g: (g.memory_used_mib, -g.index))


def _arch_message(arch: str | Sequence[str], gpus: list[GpuState]) -> str:
    """"task arch h200 needs an H200: GPUs 0,1 (NVIDIA H100 80GB HBM3) are not an H200", alike GPUs grouped."""
    arches = task_arches(arch)
    models = [ARCH_MODELS[name] for name in arches]
    groups: dict[tuple[str, tuple[str | None, ...]], list[GpuState]] = {}
    for g in gpus:
        groups.setdefault((g.name, tuple(_why_not(m, g) for m in models)), []).append(g)
    described = "; ".join(_group_refusal(group, models) for group in groups.values())
    wanted = " or ".join(m.called for m in models)
    return f"task arch {','.join(arches)} needs {wanted}: {described}"


def _group_refusal(group: list[GpuState], models: list[GpuModel]) -> str:
    """Alike GPUs (same name, same reasons) in one phrase: "GPUs 0,1 (NVIDIA H200) are not a B200"."""
    plural = len(group) > 1
    reasons = " and ".join(dict.fromkeys(str(_why_not(m, group[0], plural)) for m in models))
    return f"GPU{'s' if plural else ''} {','.join(str(g.index) for g in group)} ({group[0].name}) {reasons}"


def _lease_first_idle(
    root: Path,
    candidates: list[GpuState],
    policy: IdlePolicy,
    record: dict[str, Any],
    snapshot_fn: Callable[[], Snapshot],
) -> tuple[Lease | None, dict[str, str]]:
    """The first candidate that is idle, unleased, and still idle once locked; else why each one was not."""
    verdicts: dict[str, str] = {}
    for gpu in candidates:
        idle, reason = idle_verdict(gpu, policy)
        if not idle:
            verdicts[gpu.uuid] = f"busy: {reason}"
            continue
        lease = _try_lock(root, gpu)
        if lease is None:
            verdicts[gpu.uuid] = f"leased: {describe_holder(_read_record(lock_path(root, gpu.uuid)))}"
            continue
        lease.write_record({**record, "uuid": gpu.uuid})
        # Someone may have started on the GPU between our snapshot and our lock: only a fresh look counts.
        fresh = snapshot_fn().find(gpu.uuid)
        still_idle, reason = idle_verdict(fresh, policy) if fresh else (False, "vanished from NVML")
        if still_idle:
            lease.gpu = fresh
            return lease, verdicts
        lease.release()
        verdicts[gpu.uuid] = f"busy: {reason}"
    return None, verdicts


def _try_lock(root: Path, gpu: GpuState) -> Lease | None:
    path = lock_path(root, gpu.uuid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Lease(gpu, path, fd)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            if attempt + 1 < LOCK_TRIES:
                time.sleep(0.002)
    os.close(fd)
    return None


def _busy_table(snap: Snapshot, verdicts: dict[str, str], wanted: str | None) -> str:
    headline = f"GPU {wanted} on {snap.hostname} is not free" if wanted else f"no idle GPU on {snap.hostname}"
    rows = [
        f"  {g.index:>2}  {g.name:<24} {g.memory_used_mib:>7}/{g.memory_total_mib} MiB  util {_percent(g.util_pct)}  "
        f"{verdicts.get(g.uuid, 'wrong arch')}"
        for g in snap.gpus
        if wanted is None or g.uuid in verdicts
    ]
    return "\n".join([headline, *rows])


def _percent(value: int | None) -> str:
    return "  ?%" if value is None else f"{value:>3}%"


def holders(root: Path) -> dict[str, dict]:
    """uuid -> holder record, for the leases held right now."""
    held = {}
    for path in sorted((Path(root) / "locks").glob("*.lock")):
        record = _held_record(path)
        if record is not None:
            held[record.get("uuid") or path.stem] = record
    return held


def _held_record(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            # A shared lock succeeds only if nobody holds the exclusive one, and never blocks an acquirer long.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _parse_record(os.pread(fd, 1 << 16, 0))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def adopt(fd: int, gpu: GpuState, path: Path) -> Lease:
    """The lease a detached runner inherited from `start`; the record now names this process."""
    lease = Lease(gpu, Path(path), fd)
    record = lease.record()
    record["pid"] = os.getpid()
    lease.write_record(record)
    return lease


def _read_record(path: Path) -> dict[str, Any]:
    try:
        return _parse_record(path.read_bytes())
    except OSError:
        return {}


def _parse_record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data.decode() or "{}")
    except ValueError:  # caught mid-write: the holder is real, its record just unreadable this instant
        return {}
    return record if isinstance(record, dict) else {}


def describe_holder(record: dict[str, Any]) -> str:
    if not record:
        return "by another run"
    since = f" since {record['since']}" if record.get("since") else ""
    return f"run {record.get('run_id')} ({record.get('task')}, pid {record.get('pid')}, {record.get('user')}){since}"


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - containers often run a uid with no passwd entry
        return str(os.getuid())


def utc_now_iso() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
