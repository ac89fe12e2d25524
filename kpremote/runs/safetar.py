"""Tar archives that came from a host: checked whole before anything is written, refused whole if one member is bad."""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import UnsafeArchive


@dataclass(frozen=True)
class Member:
    path: str  # relative POSIX path, checked
    data: Optional[bytes]  # None for a folder


def read_members(data: bytes, *, refused_tops: Sequence[str] = ()) -> list[Member]:
    """Every member of an uncompressed tar, or UnsafeArchive naming the first one that is not a plain file or
    folder at a relative path without '..' (or that lies under one of refused_tops)."""
    members: dict[str, Member] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar.getmembers():
                path = checked_path(info, refused_tops)
                if path is None:
                    continue
                if path in members:
                    raise UnsafeArchive(f"archive member {info.name!r} appears twice; nothing was written")
                members[path] = Member(path, tar.extractfile(info).read() if info.isreg() else None)
    except (tarfile.TarError, EOFError) as exc:
        raise UnsafeArchive(f"not a readable (uncompressed) tar archive: {exc}; nothing was written") from None
    refuse_files_used_as_folders(members)
    return list(members.values())


def checked_path(info: tarfile.TarInfo, refused_tops: Sequence[str]) -> Optional[str]:
    """The member's relative path; None for the archive's own root folder ('.')."""
    name = info.name
    if not (info.isreg() or info.isdir()):
        raise UnsafeArchive(f"archive member {name!r} is a link, device or fifo; nothing was written")
    if name.startswith("/"):
        raise UnsafeArchive(f"archive member {name!r} has an absolute path; nothing was written")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"archive member {name!r} climbs out with '..'; nothing was written")
    if parts and parts[0] in refused_tops:
        raise UnsafeArchive(f"archive member {name!r} lies under {parts[0]}/, which never travels; "
                            f"nothing was written")
    if not parts and info.isdir():
        return None
    if not parts:
        raise UnsafeArchive(f"archive member {name!r} has no file name; nothing was written")
    return "/".join(parts)


def refuse_files_used_as_folders(members: dict[str, Member]) -> None:
    for path in members:
        parent = path.rpartition("/")[0]
        while parent:
            if parent in members and members[parent].data is not None:
                raise UnsafeArchive(f"archive member {path!r} lies under {parent!r}, which is a file; "
                                    f"nothing was written")
            parent = parent.rpartition("/")[0]


def write_members(members: Sequence[Member], folder: Path) -> None:
    """Write checked members into an empty folder we created (no link in it can redirect a write)."""
    for member in sorted(members, key=lambda m: m.path):
        target = folder.joinpath(*member.path.split("/"))
        if member.data is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(member.data)


def read_tree(folder: Path) -> dict[str, bytes]:
    """Regular files under folder (links and special files are not followed, and count as differences)."""
    found: dict[str, bytes] = {}
    for current, dirs, files in os.walk(folder):
        base = Path(current)
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            path = base / name
            rel = path.relative_to(folder).as_posix()
            found[rel] = path.read_bytes() if path.is_file() and not path.is_symlink() else b"\0not a regular file"
    return found
