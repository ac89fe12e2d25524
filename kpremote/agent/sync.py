"""`sync-apply`: apply one sync stream to ROOT/tasks/<task>/workspace/ (standard library only).

The stream is one JSON header line, then an uncompressed tar of exactly the files the header announces:

    {"version": 1, "base_digest": ..., "new_digest": ..., "changed": [path...], "deleted": [path...],
     "sizes": {path: size}, "full": false, "provenance": {...}}\\n
    <tar of the changed files>

The header is checked against what the workspace holds now (its manifest; the files themselves when there is no
manifest or the client asked for "full"). A mismatch answers {"need_full": true, "have": {path: sha256}} and touches
nothing. Otherwise the whole stream is received into a staging folder first, every member checked, and only then
moved into place, so a cut connection leaves the previous workspace and manifest as they were. The task's sync lock
is held to check and to install, never while reading the network: a sync stalled on a dead link blocks no other.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from .atomicfile import write_json_atomically
from .filelock import held
from .protocol import NAME_RULE, SYNC_VERSION, SyncError, is_name, manifest_digest
from .provenance import file_sha256
from .record import RecordError
from .results import SyncHeader
from .tarstream import Member, TarStream, TarStreamError

PROTOCOL_VERSION = SYNC_VERSION
STATE_DIR = ".kpremote"
MANIFEST_NAME = "manifest.json"
PROVENANCE_NAME = "provenance.json"
STAGING_PREFIX = ".sync-staging-"
HEADER_LIMIT = 64 * 1024 * 1024
SKIPPED_DIRS = {STATE_DIR, "__pycache__"}
NOT_A_FILE = "!not-a-regular-file"
"""What a symlink or special file counts as in "have": it never equals a content hash, so the client replaces it."""


@dataclass(frozen=True)
class FileState:
    size: int
    sha256: str


def check_task_name(task: str) -> str:
    if not is_name(task):
        raise SyncError(f"invalid task name {task!r}: {NAME_RULE}")
    return task


def check_relpath(path: Any) -> str:
    """A path the client may name: relative, POSIX, no '.'/'..'/empty parts, never inside .kpremote/."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SyncError(f"refused path {path!r}: not a usable file name")
    if path.startswith("/"):
        raise SyncError(f"refused path {path!r}: absolute")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise SyncError(f"refused path {path!r}: empty, '.' or '..' component")
    if parts[0] == STATE_DIR:
        raise SyncError(f"refused path {path!r}: {STATE_DIR}/ belongs to kpremote")
    return path


def workspace_of(root: Path, task: str) -> Path:
    return Path(root) / "tasks" / check_task_name(task) / "workspace"


def snapshot_of(run_dir: Path, task: str) -> Path:
    """Where a run's own copy of its task lives: RUN/task/<task> (the folder is named as the task must be)."""
    return Path(run_dir) / "task" / check_task_name(task)


def snapshot_workspace(workspace: Path, into: Path) -> Path:
    """The workspace as it is now, taken under the task's sync lock into `into`: a run builds and times this copy,
    so a sync from another pane (another candidate of the same task) during the run changes nothing it reads, and
    what it records is what it ran. Files are hard links where the file system allows (a sync never writes a file
    in place: it renames a new one over it), copies elsewhere."""
    def link_or_copy(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    with held(workspace.parent / ".sync.lock"):
        shutil.copytree(workspace, into, symlinks=True, copy_function=link_or_copy,
                        ignore=shutil.ignore_patterns("__pycache__", STAGING_PREFIX + "*"))
    return into


def read_header(stream: BinaryIO) -> SyncHeader:
    """The stream's header line as its record (results.SyncHeader, every field of its type), each path checked and
    every changed file with its size; SyncError saying what is wrong otherwise."""
    line = stream.readline(HEADER_LIMIT)
    if not line.endswith(b"\n"):
        raise SyncError("sync stream ended inside its header (connection cut?); nothing was applied")
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise SyncError(f"sync header is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != PROTOCOL_VERSION:
        raise SyncError(f"sync header is not protocol version {PROTOCOL_VERSION} (client and agent disagree?)")
    try:
        header = SyncHeader.from_json(data, "sync header")
    except RecordError as exc:
        raise SyncError(f"{exc}; nothing was applied") from None
    lacking = sorted({"base_digest", "new_digest", "changed", "deleted", "sizes"} & header.absent)
    if lacking:
        raise SyncError(f"sync header lacks {', '.join(lacking)}; nothing was applied")
    changed = [check_relpath(p) for p in header.changed]
    deleted = [check_relpath(p) for p in header.deleted]
    if len(set(changed)) != len(changed) or set(changed) & set(deleted):
        raise SyncError("sync header lists a path twice, or as both changed and deleted")
    if any(header.sizes.get(p, -1) < 0 for p in changed):
        raise SyncError("sync header has no valid size for every changed file")
    return replace(header, changed=changed, deleted=deleted, sizes={p: header.sizes[p] for p in changed},
                   provenance=header.provenance or {})


def apply_sync_stream(root: Path, task: str, stream: BinaryIO) -> dict[str, Any]:
    """Apply a sync stream; returns the answer for the client (need_full, or what was applied). Raises SyncError."""
    workspace = workspace_of(Path(root).expanduser(), task)
    header = read_header(stream)
    workspace.parent.mkdir(parents=True, exist_ok=True)
    lock = workspace.parent / ".sync.lock"
    with ExitStack() as stack:
        with held(lock):
            remove_stale_staging(workspace.parent)
            refusal = need_full_answer(workspace, header)
            if refusal:
                return refusal
            staging = stack.enter_context(claimed_staging(workspace.parent))
        try:
            # Received holding no lock: the stream comes over the network, and on a dead link its reader can stay
            # blocked for hours (until the host's sshd notices); such a stalled sync must not block the next one.
            received = receive_files(stream, header, staging) if header.changed else {}
            with held(lock):
                refusal = need_full_answer(workspace, header)  # another sync may have landed meanwhile
                if refusal:
                    return refusal
                current = base_tree(workspace, header)
                gone = set(header.deleted)
                new = {p: s for p, s in current.items() if p not in gone}
                new.update({p: state for p, (_, state) in received.items()})
                digest = manifest_digest(_hashes(new))
                if digest != header.new_digest:
                    raise SyncError("the received files do not give the tree the client announced (a file changed "
                                    "while it was being sent?); nothing was applied, sync again")
                deleted = install(workspace, received, header.deleted)
                write_state(workspace, new, {**header.provenance, "manifest_digest": digest})
        except OSError as exc:
            raise SyncError(f"cannot apply the sync in {workspace}: {exc.strerror or exc}") from None
    return {
        "need_full": False,
        "received_files": len(received),
        "deleted": deleted,
        "bytes": sum(state.size for _, state in received.values()),
        "manifest_digest": digest,
    }


def base_tree(workspace: Path, header: SyncHeader) -> dict[str, FileState]:
    """What the header's base is compared with: the manifest, or the files themselves (none, or "full" asked)."""
    current = load_manifest(workspace) if not header.full else None
    return current if current is not None else hash_workspace(workspace)


def need_full_answer(workspace: Path, header: SyncHeader) -> dict[str, Any] | None:
    """None when the workspace is the header's base; else the answer listing what it really holds."""
    current = base_tree(workspace, header)
    if manifest_digest(_hashes(current)) == header.base_digest:
        return None
    have = current if header.full else hash_workspace(workspace)
    return {"need_full": True, "have": _hashes(have)}


def _hashes(files: Mapping[str, FileState]) -> dict[str, str]:
    return {path: state.sha256 for path, state in files.items()}


@contextmanager
def claimed_staging(task_dir: Path) -> Iterator[Path]:
    """A fresh staging folder, flock'd while this sync lives: remove_stale_staging leaves it alone until then."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=task_dir))
    with held(staging, os.O_RDONLY | os.O_DIRECTORY):
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def remove_stale_staging(task_dir: Path) -> None:
    """Staging left by a killed sync (its flock died with it); called holding the task's sync lock."""
    for leftover in task_dir.glob(STAGING_PREFIX + "*"):
        if abandoned(leftover):
            shutil.rmtree(leftover, ignore_errors=True)


def abandoned(folder: Path) -> bool:
    """Whether no live sync holds the folder's flock."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def load_manifest(workspace: Path) -> dict[str, FileState] | None:
    """The manifest, or None when it is missing or unreadable (then the files themselves are the truth)."""
    try:
        data = json.loads((workspace / STATE_DIR / MANIFEST_NAME).read_text())
        return {path: FileState(int(entry["size"]), str(entry["sha256"])) for path, entry in data.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def hash_workspace(workspace: Path) -> dict[str, FileState]:
    """What the workspace really holds; links and special files are listed (so they get replaced), never followed."""
    found: dict[str, FileState] = {}
    pending = [""]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(workspace / folder if folder else workspace))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = f"{folder}/{entry.name}" if folder else entry.name
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIPPED_DIRS:
                    pending.append(rel)
            elif entry.is_file(follow_symlinks=False):
                found[rel] = FileState(entry.stat(follow_symlinks=False).st_size, file_sha256(Path(entry.path)))
            else:
                found[rel] = FileState(0, NOT_A_FILE)
    return found


def receive_files(stream: BinaryIO, header: SyncHeader, staging: Path) -> dict[str, tuple[str, FileState]]:
    """Every announced file, into staging under a numbered name (member names never become paths here)."""
    expected = set(header.changed)
    received: dict[str, tuple[str, FileState]] = {}
    tar = TarStream(stream)
    folder = str(staging)  # plain strings: pathlib's joins cost more than the write of a small file
    try:
        for member in tar.members():
            check_member(member, expected, received, header.sizes)
            staged = f"{folder}/{len(received)}"
            received[member.name] = (staged, stage_file(tar, member, staged))
            if len(received) == len(expected):
                break
    except TarStreamError as exc:
        raise SyncError(f"sync stream is cut or corrupt after {len(received)} of {len(expected)} files "
                        f"({exc}); nothing was applied") from None
    if len(received) != len(expected):
        raise SyncError(f"sync stream ended after {len(received)} of {len(expected)} files (connection cut?); "
                        f"nothing was applied")
    return received


def check_member(member: Member, expected: set[str], received: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
    if member.name not in expected:
        raise SyncError(f"refused tar member {member.name!r}: not a file the header announced; nothing was applied")
    if not member.regular:
        raise SyncError(f"refused tar member {member.name!r}: not a regular file (link or device); "
                        f"nothing was applied")
    if member.name in received:
        raise SyncError(f"refused tar member {member.name!r}: sent twice; nothing was applied")
    if member.size != sizes[member.name]:
        raise SyncError(f"refused tar member {member.name!r}: {member.size} bytes, header said "
                        f"{sizes[member.name]}; nothing was applied")


def stage_file(tar: TarStream, member: Member, staged: str) -> FileState:
    """Write and hash one member. Plain os calls: a file object would add three syscalls a file (fstat, ioctl,
    lseek), and syscalls are most of what a first sync of 10,000 small files costs the host."""
    digest = hashlib.sha256()
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755 if member.mode & 0o111 else 0o644)
    try:
        def write(piece: memoryview) -> None:
            digest.update(piece)
            while piece:
                piece = piece[os.write(fd, piece):]

        tar.copy_data(member, write)
    finally:
        os.close(fd)
    return FileState(member.size, digest.hexdigest())


def install(workspace: Path, received: Mapping[str, tuple[str, FileState]], deleted: list[str]) -> int:
    """Deletions, then moves into place. Returns how many files were deleted."""
    workspace.mkdir(parents=True, exist_ok=True)
    state_dir = real_directory(workspace / STATE_DIR)
    # From here on the workspace is between two states: without a manifest the next sync hashes the files
    # themselves instead of trusting a manifest that no longer describes them.
    (state_dir / MANIFEST_NAME).unlink(missing_ok=True)
    count = sum(remove_inside(workspace, path) for path in deleted)
    checked: dict[str, Path] = {}
    for path, (staged, _) in received.items():
        target = place_inside(workspace, path, checked)
        try:
            os.replace(staged, target)
        except OSError:
            if target.is_symlink() or not target.is_dir():
                raise
            # the client has a file where this workspace kept a folder of leftovers; asked only after a refused
            # rename, because a stat per file is a tenth of a first sync's cost on a slow kernel
            shutil.rmtree(target)
            os.replace(staged, target)
    return count


def real_directory(path: Path) -> Path:
    """path as a real directory: a symlink or file in its place is removed first, so nothing is written through it."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(exist_ok=True)
    return path


ROOT_KEY = "\0"


def place_inside(workspace: Path, path: str, checked: dict[str, Path] | None = None) -> Path:
    """The target of path, with every parent a real directory inside the workspace (links in the way removed).

    `checked` remembers the folders this install already made real and verified (a sync of 10,000 files
    otherwise resolves the same few folders' real paths, one lstat per component, 20,000 times).
    """
    checked = {} if checked is None else checked
    parts = path.split("/")
    parent = "/".join(parts[:-1])
    folder = checked.get(parent)
    if folder is None:
        folder = workspace
        for part in parts[:-1]:
            folder = real_directory(folder / part)
        if ROOT_KEY not in checked:  # no path can contain NUL: this key never names a folder
            checked[ROOT_KEY] = Path(os.path.realpath(workspace))
        if os.path.realpath(folder) != os.path.join(checked[ROOT_KEY], *parts[:-1]):
            raise SyncError(f"refused path {path!r}: would land outside the workspace")
        checked[parent] = folder
    return folder / parts[-1]


def remove_inside(workspace: Path, path: str) -> int:
    """Delete one file (or link, never its target) if it really lies inside the workspace; prune empty parents."""
    parts = path.split("/")
    folder = workspace
    for part in parts[:-1]:
        folder = folder / part
        if folder.is_symlink() or not folder.is_dir():
            return 0
    target = folder / parts[-1]
    if not target.is_symlink() and (target.is_dir() or not target.exists()):
        return 0
    target.unlink()
    while folder != workspace:
        try:
            folder.rmdir()
        except OSError:
            break
        folder = folder.parent
    return 1


def write_state(workspace: Path, files: Mapping[str, FileState], provenance: dict[str, Any]) -> None:
    """Provenance first, the manifest last: a manifest on disk means the sync before it completed."""
    state_dir = workspace / STATE_DIR
    provenance = {**provenance, "applied_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json_atomically(state_dir / PROVENANCE_NAME, provenance)
    manifest = {path: {"size": s.size, "sha256": s.sha256} for path, s in sorted(files.items())}
    write_json_atomically(state_dir / MANIFEST_NAME, manifest)


def answer_sync_request(root: Path, task: str, stream: BinaryIO) -> tuple[dict[str, Any], int]:
    """What `sync-apply` prints and its exit code: the applied sync or need_full (0), or the error, named on stderr
    too. `start --sync` and `slurm-submit --sync` answer their sync with it."""
    try:
        return apply_sync_stream(root, task, stream), 0
    except SyncError as exc:
        print(f"sync-apply: {exc}", file=sys.stderr)
        return {"error": exc.kind, "message": str(exc)}, exc.exit_code


def sync_answer(root: Path, task: str, stream: BinaryIO) -> dict[str, Any]:
    """The answer to a sync request as `start --sync` and `slurm-submit --sync` print it: an error carries its exit
    code."""
    answer, exit_code = answer_sync_request(root, task, stream)
    return {**answer, "exit_code": exit_code} if exit_code else answer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sync-apply", description="apply a sync stream read from stdin")
    parser.add_argument("--task", required=True)
    parser.add_argument("--root", required=True)
    args = parser.parse_args(argv)
    answer, exit_code = answer_sync_request(Path(args.root), args.task, sys.stdin.buffer)
    print(json.dumps(answer))
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
