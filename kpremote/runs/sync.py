"""The sync protocol's client end: kernels/<task>/ to remote_root/tasks/<task>/workspace/, only what changed.

The client remembers the tree it last synced to each (host, remote_root, task) and sends one request: a JSON header
line (the diff against that tree) and an uncompressed tar of just the changed files. When the workspace is not what
the client remembers, the agent says so without touching anything, lists what it has, and the client sends the
exact diff against that. `exchange` is that whole conversation, over whichever channel carries it: `sync-apply`
(`inv sync`), or `start --sync` and `slurm-submit --sync`, which carry the first request in the channel of the run.
kpremote/task/taskscan.py reads the task folder; kpremote/agent/sync.py is the other end.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..agent.atomicfile import write_json_atomically
from ..agent.protocol import SYNC_VERSION, manifest_digest
from ..agent.results import SyncHeader
from ..hosts.agentclient import Agent, error_message
from ..hosts.config import Host
from ..errors import HostError, KpremoteError, RemoteCommandError
from ..task.taskdir import TaskDir
from ..task.taskscan import LocalTree, cache_dir, read_json, read_no_follow, scan_task

Send = Callable[[bytes], dict[str, Any]]
"""Carries one sync request to the agent and returns its answer: what it applied, or {"need_full", "have"}."""


@dataclass
class SyncPlan:
    """One request: the diff between a base tree (what the workspace holds) and the local tree."""

    tree: LocalTree
    base_digest: str
    new_digest: str
    changed: list[str]
    deleted: list[str]
    full: bool

    def syncing_event(self) -> dict[str, Any]:
        """What this request carries, as a start's progress event: files and bytes (kpremote/views/start.py says it);
        retry: the diff against what the agent listed, after it found the workspace not as this client remembered."""
        return {"event": "syncing", "files": len(self.changed),
                "bytes": sum(self.tree.files[path].size for path in self.changed), "retry": self.full}


@dataclass
class Exchange:
    """A finished sync: the plan the agent applied, its answer, and the request bytes sent (both tries)."""

    plan: SyncPlan
    answer: dict[str, Any]
    bytes_sent: int

    @property
    def files_sent(self) -> int:
        return len(self.plan.changed)


@dataclass
class SyncReport:
    task: str
    host: str
    files_sent: int
    bytes_sent: int
    deleted: int
    channels: int
    seconds: float
    digest: str
    full: bool
    warnings: list[str]


def sync_task(agent: Agent, task: TaskDir) -> SyncReport:
    """`inv sync`: kernels/<task> to the host's workspace, one channel, two when the workspace is not as remembered."""
    started = time.monotonic()
    channels_before = agent.transport.channels.opened
    agent.transport.connect_soon()  # the handshake's round trips pass while the task is scanned
    tree = scan_task(task)
    done = exchange(agent.host, tree, over_sync_apply(agent, task.name))
    return SyncReport(
        task=task.name, host=agent.host.name, files_sent=done.files_sent, bytes_sent=done.bytes_sent,
        deleted=int(done.answer.get("deleted", 0)), channels=agent.transport.channels.opened - channels_before,
        seconds=round(time.monotonic() - started, 3), digest=done.plan.new_digest, full=done.plan.full,
        warnings=tree.warnings,
    )


def exchange(host: Host, tree: LocalTree, send: Send, *, resend: Optional[Send] = None,
             on_plan: Callable[[SyncPlan], None] = lambda plan: None) -> Exchange:
    """One sync, retries included: the diff against the tree remembered for host, over send; each need_full answer
    is followed by the exact diff against the agent's listing, over resend. sync-apply (resend, or send when there
    is none) gets two requests, the second for a workspace another sync changed meanwhile; a run's own channel
    (send, with resend given) carries one before them. The tree is remembered only once the agent confirms it.
    on_plan hears each request's plan before it is sent (a start's `syncing` progress: files and bytes)."""
    channels = [send, resend, resend] if resend is not None else [send, send]
    answer: dict[str, Any] = {}
    sent = 0
    for retry, channel in enumerate(channels):
        plan = plan_sync(host, tree, have=have_listing(host, answer) if retry else None)
        request = build_sync_request(plan)
        on_plan(plan)
        answer, sent = channel(request), sent + len(request)
        if not answer.get("need_full"):
            record_synced(host, plan, answer)
            return Exchange(plan, answer, sent)
    raise HostError(host.name, f"the workspace of {tree.task} changed while syncing (another sync at the same "
                               f"time?); run it again")


def over_sync_apply(agent: Agent, task: str) -> Send:
    """Send over a channel of its own: the agent's `sync-apply`."""

    def send(request: bytes) -> dict[str, Any]:
        result = agent.call("sync-apply", "--task", task, stdin=request)
        if not result.ok:
            raise RemoteCommandError(agent.host.name, f"sync of {task} failed: {error_message(result)}",
                                     result.exit_code, result.stderr_tail())
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise HostError(agent.host.name, f"sync-apply answered something that is not JSON: "
                                             f"{result.stdout[:200]!r}")
        return answer

    return send


# ---------------------------------------------------------------- what the host holds


def _synced_path(host: Host, task: str) -> Path:
    """Where the tree last synced to this workspace is remembered: one per place (login, container, remote_root,
    task), not per host alias, so two aliases of one place (a cluster's partitions, say) share what was synced."""
    key = "\0".join([host.ssh or "", host.container or "", host.remote_root, task])
    return cache_dir() / "synced" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def remembered_tree(host: Host, task: str) -> dict[str, str]:
    """The tree last synced to this host's workspace of task ({} when unknown: the agent corrects us if wrong)."""
    data = read_json(_synced_path(host, task))
    files = data.get("files")
    if isinstance(files, dict) and manifest_digest(files) == data.get("digest"):
        return files
    return {}


def remember_tree(host: Host, task: str, hashes: dict[str, str]) -> None:
    write_json_atomically(_synced_path(host, task), {"host": host.name, "remote_root": host.remote_root,
                                                     "task": task, "digest": manifest_digest(hashes), "files": hashes})


def have_listing(host: Host, answer: dict[str, Any]) -> dict[str, str]:
    have = answer.get("have")
    if not isinstance(have, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in have.items()):
        raise HostError(host.name, "sync-apply asked for a full sync without a valid listing of the workspace")
    return have


def record_synced(host: Host, plan: SyncPlan, answer: dict[str, Any]) -> None:
    """Remember the tree only when the agent confirms it holds exactly that tree now."""
    if answer.get("manifest_digest") != plan.new_digest:
        raise HostError(host.name, f"sync-apply reports tree {answer.get('manifest_digest')}, expected "
                                   f"{plan.new_digest}")
    remember_tree(host, plan.tree.task, plan.tree.hashes)


# ---------------------------------------------------------------- the request


def plan_sync(host: Host, tree: LocalTree, *, have: Optional[dict[str, str]] = None) -> SyncPlan:
    """The diff against `have` (what the agent said it holds) or else against the tree remembered for this host."""
    base = have if have is not None else remembered_tree(host, tree.task)
    local = tree.hashes
    return SyncPlan(
        tree=tree,
        base_digest=manifest_digest(base),
        new_digest=manifest_digest(local),
        changed=sorted(p for p, sha in local.items() if base.get(p) != sha),
        deleted=sorted(p for p in base if p not in local),
        full=have is not None,
    )


def build_sync_request(plan: SyncPlan) -> bytes:
    """The stdin of `sync-apply` (or of `start`): header line, then a tar of the changed files only."""
    files = plan.tree.files
    header = SyncHeader(version=SYNC_VERSION, base_digest=plan.base_digest, new_digest=plan.new_digest,
                        changed=plan.changed, deleted=plan.deleted, sizes={p: files[p].size for p in plan.changed},
                        full=plan.full, provenance=plan.tree.provenance)
    out = io.BytesIO()
    out.write(json.dumps(header.to_json(), separators=(",", ":")).encode() + b"\n")
    for path in plan.changed:
        write_tar_member(out, path, read_as_scanned(plan.tree, path), files[path].executable)
    if plan.changed:
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    return out.getvalue()


def read_as_scanned(tree: LocalTree, path: str) -> bytes:
    scanned = tree.files[path]
    if scanned.content is not None:
        return scanned.content  # exactly the bytes that were hashed
    data = read_no_follow(tree.task_dir / path, scanned.size)
    if hashlib.sha256(data).hexdigest() != scanned.sha256:
        raise KpremoteError(f"{tree.task_dir / path} changed while syncing; run the sync again")
    return data


def write_tar_member(out: io.BytesIO, path: str, data: bytes, executable: bool) -> None:
    """One member, padded to the block size only (tarfile would pad the archive to 10 KiB records)."""
    mode = 0o755 if executable else 0o644
    out.write(ustar_header(path, len(data), mode) or _pax_header(path, len(data), mode))
    out.write(data)
    out.write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))


USTAR_EMPTY = tarfile.TarInfo().tobuf(format=tarfile.USTAR_FORMAT)


def ustar_header(path: str, size: int, mode: int) -> Optional[bytes]:
    """The 512-byte header tarfile writes for a short ASCII name, built directly: TarInfo.tobuf costs ~80 µs a
    member, a second of CPU for a 10,000-file sync. None when the name needs PAX (long or non-ASCII)."""
    if not path.isascii() or len(path) > 100 or size >= 8 ** 11:
        return None
    block = bytearray(USTAR_EMPTY)
    block[0:100] = path.encode("ascii").ljust(100, b"\0")
    block[100:108] = b"%07o\0" % mode
    block[124:136] = b"%011o\0" % size
    block[148:156] = b" " * 8  # the checksum is computed with its own field as spaces
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _pax_header(path: str, size: int, mode: int) -> bytes:
    info = tarfile.TarInfo(path)
    info.size = size
    info.mode = mode
    return info.tobuf(format=tarfile.PAX_FORMAT)
