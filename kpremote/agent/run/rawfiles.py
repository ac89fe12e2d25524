"""One raw file of a finished run, on request (`raw-file`): found under the run's raw/ by a checked name, links never
followed, then described (`--stat`: name, bytes, sha256) or sent as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from ..protocol import TERMINAL, BadRequest, NotFound, NotTerminal, is_name
from ..provenance import file_sha256
from .liveness import current_state
from .runpaths import existing_run_dir

CHUNK = 1 << 20


def raw_file_path(root: Path, task: str, run_id: str, name: str) -> tuple[Path, str]:
    """A regular file under a finished run's raw/ and its name there ('ncu/x.ncu-rep'); links are never followed."""
    run_dir = existing_run_dir(root, task, run_id)
    parts = [part for part in name.split("/") if part]
    if parts[:1] == ["raw"]:
        parts = parts[1:]
    if not parts or not all(is_name(p) for p in parts):
        raise BadRequest(f"bad raw file name {name!r}: a path under raw/ of letters, digits, '_', '.', '-'")
    status = current_state(run_dir).get("status")
    if status not in TERMINAL:
        raise NotTerminal(f"run {run_id} is {status}; its raw files are not final yet")
    relative = "/".join(parts)
    path = run_dir / "raw"
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise BadRequest(f"raw/{relative}: {path.name} is a link; links are never followed")
    if not path.is_file():
        raise NotFound(f"run {run_id} of task {task} has no file raw/{relative}")
    return path, relative


def raw_file_stat(root: Path, task: str, run_id: str, name: str) -> dict[str, Any]:
    path, relative = raw_file_path(root, task, run_id, name)
    return {"name": relative, "path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def send_raw_file(root: Path, task: str, run_id: str, name: str, out: BinaryIO) -> None:
    path, _ = raw_file_path(root, task, run_id, name)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            out.write(chunk)
    out.flush()
