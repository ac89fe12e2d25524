"""What a task folder holds, as the sync sees it: every file's sha256 (through a hash cache) and its provenance.

kpremote/runs/sync.py sends the difference between this and what the host holds; agent/provenance.py decides which files
count and how the tree is stamped, for this scan and for the agent's runner alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..agent.atomicfile import write_json_atomically
from ..agent.provenance import IgnoreFileError, file_sha256, task_provenance, walk_task
from ..errors import ConfigError
from .taskdir import TaskDir

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


def scan_task(task: TaskDir) -> LocalTree:
    """Hash every file the sync carries (through the hash cache) and stamp provenance."""
    warnings: list[str] = []
    cache = HashCache(task.path)
    # os.path.join, not Path /: a re-sync of 10,000 files is mostly this loop, and pathlib costs 10 µs a join
    root = str(task.path)
    try:
        files = {rel: cache.local_file(os.path.join(root, rel), rel, st)
                 for rel, st in walk_task(task.path, warnings)}
    except IgnoreFileError as exc:
        raise ConfigError(str(exc)) from None
    cache.save()
    tree = LocalTree(task.name, task.path, files, {}, warnings)
    tree.provenance = provenance(tree)
    return tree


class HashCache:
    """sha256 of files keyed by (path, size, mtime_ns, inode), so a re-sync of a large tree hashes only what changed."""

    def __init__(self, task_dir: Path) -> None:
        key = hashlib.sha256(str(task_dir.resolve()).encode()).hexdigest()[:32]
        self.path = cache_dir() / "hashes" / f"{key}.json"
        self.old = read_json(self.path).get("files", {})
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


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kpremote")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a cache file; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
