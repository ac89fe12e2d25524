"""state.json of one run: the single record of what a run is doing, updated atomically."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TERMINAL = {"passed", "failed", "error", "cancelled"}
"""Statuses after which nothing changes any more."""
DISK_FULL_EXIT = 28
"""A worker's exit code when the disk was too full to write its result (28 = ENOSPC)."""


def state_path(run_dir: Path) -> Path:
    return Path(run_dir) / "state.json"


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(state_path(run_dir).read_text())
    except FileNotFoundError:
        return {}


def update_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into state.json through a rename, so readers never see a torn file."""
    state = read_state(run_dir)
    state.update(fields)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".state.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=1, default=str)
    os.replace(tmp, state_path(run_dir))
    return state


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(path: Path) -> str:
    """One line naming the filesystem that filled up (its mount point) and what was being written."""
    mount = Path(os.path.abspath(path))
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    writing = f" (writing {path})" if Path(path) != mount else ""
    return f"disk full on {mount}{writing}; free space there and run again"
