"""`inv sync`: kernels/<task>/ to remote_root/tasks/<task>/workspace/, only what changed, over one channel.

The client remembers the tree it last synced to each (host, remote_root, task) and sends one request: a JSON header
line (the diff against that tree) and an uncompressed tar of just the changed files. When the workspace is not what
the client remembers, the agent says so without touching anything, lists what it has, and the client sends the
exact diff against that (a second channel, only then). kpremote/agent/sync.py is the other end.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import socket
import stat
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from .agent.atomicfile import write_json_atomically
from .agent.protocol import NAME_RULE, SYNC_VERSION, is_name, manifest_digest
from .agent.provenance import IgnoreFileError, file_sha256, task_provenance, walk_task
from .agentclient import Agent, error_message
from .config import Host
from .errors import ConfigError, HostError, KpremoteError, RemoteCommandError

CACHE_ENV = "KPREMOTE_CACHE"
RACY_NS = 2_000_000_000
"""Files modified this recently are not cached: a same-size rewrite within the mtime tick would look unchanged."""


KEPT_BYTES_LIMIT = 256 * 1024 * 1024
"""Bytes a scan keeps of the files it reads, so the request is built without reading them a second time."""
KEPT_FILE_LIMIT = 4 * 1024 * 1024
"""Larger files are hashed in chunks and read again when sent: they are few, and memory matters more there."""


@dataclass(frozen=True)
class LocalFile:
    size: int
    sha256: str
    executable: bool
    content: Optional[bytes] = field(default=None, repr=False, compare=False)
    """The bytes that were hashed, when the scan read the file and kept them (see KEPT_BYTES_LIMIT)."""


@dataclass
class LocalTree:
    """What kernels/<task>/ holds, as the sync sees it."""

    task: str
    task_dir: Path
    files: dict[str, LocalFile]
    provenance: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def hashes(self) -> dict[str, str]:
        return {path: f.sha256 for path, f in self.files.items()}


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
        """What this request carries, as a start's progress event: files and bytes (kpremote/views/start.py says it)."""
        return {"event": "syncing", "files": len(self.changed),
                "bytes": sum(self.tree.files[path].size for path in self.changed)}


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


# ---------------------------------------------------------------- the task folder


def resolve_task_dir(kernels_dir: Path, task: str) -> Path:
    """kernels/<task>, refusing names that could point anywhere else; unknown names suggest the closest task."""
    if not is_name(task):
        raise ConfigError(f"invalid task name {task!r}: {NAME_RULE}")
    task_dir = Path(kernels_dir) / task
    if task_dir.is_symlink() or not task_dir.is_dir():
        known = sorted(p.name for p in Path(kernels_dir).glob("*") if p.is_dir() and not p.is_symlink())
        close = difflib.get_close_matches(task, known, n=1, cutoff=0.4)
        hint = f" — did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown task {task!r}: no folder {task_dir}{hint}")
    return task_dir


def scan_task(kernels_dir: Path, task: str) -> LocalTree:
    """Hash every file the sync carries (through the hash cache) and stamp provenance."""
    task_dir = resolve_task_dir(kernels_dir, task)
    warnings: list[str] = []
    cache = HashCache(task_dir)
    # os.path.join, not Path /: a re-sync of 10,000 files is mostly this loop, and pathlib costs 10 µs a join
    root = str(task_dir)
    try:
        files = {rel: cache.local_file(os.path.join(root, rel), rel, st)
                 for rel, st in walk_task(task_dir, warnings)}
    except IgnoreFileError as exc:
        raise ConfigError(str(exc)) from None
    cache.save()
    tree = LocalTree(task, task_dir, files, {}, warnings)
    tree.provenance = provenance(tree)
    return tree


class HashCache:
    """sha256 of files keyed by (path, size, mtime_ns, inode), so a re-sync of a large tree hashes only what changed."""

    def __init__(self, task_dir: Path) -> None:
        key = hashlib.sha256(str(task_dir.resolve()).encode()).hexdigest()[:32]
        self.path = cache_dir() / "hashes" / f"{key}.json"
        self.old = _read_json(self.path).get("files", {})
        self.new: dict[str, list[Any]] = {}
        self.hashed = 0  # files read this time (tests assert unchanged files are not)
        self.kept_bytes = 0

    def local_file(self, path: str | Path, rel: str, st: os.stat_result) -> LocalFile:
        signature = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.old.get(rel)
        content = None
        if isinstance(cached, list) and cached[:3] == signature:
            sha = cached[3]
        elif st.st_size <= KEPT_FILE_LIMIT and self.kept_bytes + st.st_size <= KEPT_BYTES_LIMIT:
            content = read_no_follow(path, st.st_size)
            self.kept_bytes += len(content)
            sha = hashlib.sha256(content).hexdigest()
            self.hashed += 1
        else:
            sha = file_sha256(path)
            self.hashed += 1
        if time.time_ns() - st.st_mtime_ns > RACY_NS:
            self.new[rel] = [*signature, sha]
        return LocalFile(st.st_size, sha, bool(st.st_mode & stat.S_IXUSR), content)

    def save(self) -> None:
        if self.new != self.old:
            write_json_atomically(self.path, {"files": self.new})


def read_no_follow(path: str | Path, expected_size: int = 0) -> bytes:
    """A file's bytes, refusing a link swapped in since the scan (it could point outside the task).

    Plain os calls, sized by what stat said: a small file costs open, one read, close (a file object adds fstat,
    ioctl and lseek, and a first sync of 10,000 files is mostly syscalls).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        first = os.read(fd, expected_size + 1)
        if len(first) <= expected_size:  # a short read of a regular file is its end
            return first
        parts = [first]
        while chunk := os.read(fd, 1024 * 1024):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def provenance(tree: LocalTree) -> dict[str, Any]:
    """What the harness stamps into results (agent/provenance.py's definition, which the agent uses too), and when
    and from where it was synced."""
    return {
        **task_provenance(tree.task_dir, tree.hashes),
        "synced_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "client_hostname": socket.gethostname(),
    }


# ---------------------------------------------------------------- what the host holds


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kpremote")


def _synced_path(host: Host, task: str) -> Path:
    key = "\0".join([host.name, host.ssh or "", host.container or "", host.remote_root, task])
    return cache_dir() / "synced" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def remembered_tree(host: Host, task: str) -> dict[str, str]:
    """The tree last synced to this host's workspace of task ({} when unknown: the agent corrects us if wrong)."""
    data = _read_json(_synced_path(host, task))
    files = data.get("files")
    if isinstance(files, dict) and manifest_digest(files) == data.get("digest"):
        return files
    return {}


def remember_tree(host: Host, task: str, hashes: dict[str, str]) -> None:
    write_json_atomically(_synced_path(host, task), {"host": host.name, "remote_root": host.remote_root,
                                                     "task": task, "digest": manifest_digest(hashes), "files": hashes})


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
    header = {
        "version": SYNC_VERSION,
        "base_digest": plan.base_digest,
        "new_digest": plan.new_digest,
        "changed": plan.changed,
        "deleted": plan.deleted,
        "sizes": {p: files[p].size for p in plan.changed},
        "full": plan.full,
        "provenance": plan.tree.provenance,
    }
    out = io.BytesIO()
    out.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
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


def sync_task(agent: Agent, task: str, kernels_dir: Path, *, have: Optional[dict[str, str]] = None) -> SyncReport:
    """Sync kernels/<task> to the host's workspace: one channel, two when the workspace is not what we remember.

    `have` is the agent's own listing from an earlier need_full answer (e.g. from `start`), to skip the guess.
    """
    started = time.monotonic()
    channels_before = agent.transport.channels.opened
    agent.transport.connect_soon()  # the handshake's round trips pass while the task is scanned
    tree = scan_task(kernels_dir, task)
    plan = plan_sync(agent.host, tree, have=have)
    answer, sent = send_plan(agent, plan)
    if answer.get("need_full"):
        plan = plan_sync(agent.host, tree, have=have_listing(agent.host, answer))
        answer, more = send_plan(agent, plan)
        sent += more
        if answer.get("need_full"):
            raise HostError(agent.host.name, f"the workspace of {task} changed while syncing (another sync at "
                                             f"the same time?); run it again")
    record_synced(agent.host, plan, answer)
    return SyncReport(
        task=task, host=agent.host.name, files_sent=len(plan.changed), bytes_sent=sent,
        deleted=int(answer.get("deleted", 0)), channels=agent.transport.channels.opened - channels_before,
        seconds=round(time.monotonic() - started, 3), digest=plan.new_digest, full=plan.full, warnings=tree.warnings,
    )


def send_plan(agent: Agent, plan: SyncPlan) -> tuple[dict[str, Any], int]:
    request = build_sync_request(plan)
    result = agent.call("sync-apply", "--task", plan.tree.task, stdin=request)
    if not result.ok:
        raise RemoteCommandError(agent.host.name, f"sync of {plan.tree.task} failed: {error_message(result)}",
                                 result.exit_code, result.stderr_tail())
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise HostError(agent.host.name, f"sync-apply answered something that is not JSON: {result.stdout[:200]!r}")
    return answer, len(request)


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


# ---------------------------------------------------------------- small helpers


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
