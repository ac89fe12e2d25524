"""known_hosts read the way OpenSSH reads it, and changed on purpose only.

A line paramiko cannot parse (bad base64, an unknown key type, a broken hashed name, a marker such as
@cert-authority) is skipped, as OpenSSH skips it: one bad line must not stop every SSH command. Hashed names
(|1|salt|hash) match as OpenSSH's do. `replace` is the one writer: it drops every key the file holds for one
host entry (in whichever line, hashed or not) and appends the new one, atomically.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import paramiko


def entry_name(hostname: str, port: int) -> str:
    """How OpenSSH (and paramiko) name a host in known_hosts."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


@dataclass
class Line:
    text: str
    names: list[str]
    key: paramiko.PKey | None  # None: a line we keep as is but do not use (comment, marker, malformed)


def read(path: str | os.PathLike) -> list[Line]:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [_parse(line) for line in text.splitlines()]


def _parse(text: str) -> Line:
    stripped = text.strip()
    if not stripped or stripped.startswith(("#", "@")):
        return Line(text, [], None)
    try:
        entry = paramiko.hostkeys.HostKeyEntry.from_line(stripped)
    except Exception:  # noqa: BLE001 - paramiko raises several kinds for a bad line; OpenSSH skips them all
        entry = None
    if entry is None or entry.key is None:
        return Line(text, [], None)
    names = [name for name in entry.hostnames if _usable_name(name)]
    return Line(text, names, entry.key if names else None)


def _usable_name(name: str) -> bool:
    if not name.startswith("|1|"):
        return bool(name)
    try:
        salt, digest = name[3:].split("|", 1)
        base64.b64decode(salt, validate=True)
        base64.b64decode(digest, validate=True)
        return True
    except (ValueError, binascii.Error):
        return False


def matches(name: str, wanted: str) -> bool:
    """Whether a known_hosts name (plain or hashed) stands for the entry `wanted` ("host" or "[host]:port")."""
    if not name.startswith("|1|"):
        return name == wanted
    salt, digest = name[3:].split("|", 1)
    mac = hmac.new(base64.b64decode(salt), wanted.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(base64.b64encode(mac).decode(), digest)


def host_keys(path: str | os.PathLike) -> paramiko.HostKeys:
    """The usable keys of the file, for paramiko's SSHClient (hashed names keep working: paramiko hashes too)."""
    keys = paramiko.HostKeys()
    for line in read(path):
        if line.key is not None:
            for name in line.names:
                keys.add(name, line.key.get_name(), line.key)
    return keys


def keys_for(path: str | os.PathLike, wanted: str) -> list[paramiko.PKey]:
    return [line.key for line in read(path) if line.key is not None and any(matches(n, wanted) for n in line.names)]


def replace(path: str | os.PathLike, wanted: str, key: paramiko.PKey) -> list[paramiko.PKey]:
    """Make `key` the one key of entry `wanted`; returns the keys that were there before (now removed)."""
    removed: list[paramiko.PKey] = []
    kept: list[str] = []
    for line in read(path):
        hits = [n for n in line.names if matches(n, wanted)]
        if not hits or line.key is None:
            kept.append(line.text)
            continue
        removed.append(line.key)
        others = [n for n in line.text.split()[0].split(",") if n not in hits]
        if others:  # a line naming several hosts keeps the others
            kept.append(" ".join([",".join(others), *line.text.split()[1:]]))
    kept.append(f"{wanted} {key.get_name()} {key.get_base64()}")
    _write_atomically(Path(path), "\n".join(kept) + "\n")
    return removed


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".known_hosts-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
