"""A run's summary/ as a tar: what `pack-summary` sends, and what `follow --with-summary` sends after its end line.

Only regular files and real folders go in, parents before children; links are never followed.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO, Iterator

from .liveness import current_state
from ..protocol import TERMINAL, NotTerminal
from .runpaths import existing_run_dir


def pack_summary(root: Path, task: str, run_id: str, out: BinaryIO) -> None:
    """Write an uncompressed tar of the run's summary/ (files and folders only) to out."""
    run_dir = existing_run_dir(root, task, run_id)
    status_now = current_state(run_dir).get("status")
    if status_now not in TERMINAL:
        raise NotTerminal(f"run {run_id} is {status_now}; its summary is not final yet")
    write_summary_tar(run_dir / "summary", out)


def write_summary_tar(summary: Path, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _summary_members(summary):
            tar.add(path, arcname=path.relative_to(summary).as_posix(), recursive=False)


def _summary_members(summary: Path) -> Iterator[Path]:
    """Regular files and real folders under summary/, parents before children; links are never followed."""
    if not summary.is_dir() or summary.is_symlink():
        return
    for folder, dirnames, filenames in os.walk(summary):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(folder, d)))
        base = Path(folder)
        if base != summary:
            yield base
        for name in sorted(filenames):
            if stat.S_ISREG(os.lstat(base / name).st_mode):
                yield base / name
