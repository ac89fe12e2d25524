"""A run's summary/ as a tar: what `pack-summary` sends, and what `follow --with-summary` sends after its end line.

Only regular files and real folders go in, parents before children; links are never followed. results.json goes in
as the bytes records.verified_results vouched for, never read a second time.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO, Iterator

from .liveness import current_state
from ..protocol import TERMINAL, NotTerminal
from .records import verified_results
from .runpaths import existing_run_dir


def pack_summary(root: Path, task: str, run_id: str, out: BinaryIO) -> None:
    """Write an uncompressed tar of the run's summary/ (files and folders only) to out, once its host's sealed record
    vouches for it (SummaryUnverified otherwise, before anything is written)."""
    run_dir = existing_run_dir(root, task, run_id)
    state = current_state(run_dir)
    if state.get("status") not in TERMINAL:
        raise NotTerminal(f"run {run_id} is {state.get('status')}; its summary is not final yet")
    write_summary_tar(run_dir / "summary", out, verified_results(run_dir, state))


def write_summary_tar(summary: Path, out: BinaryIO, results: bytes) -> None:
    """summary/ as a tar, its results.json being results (the verified bytes)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in _summary_members(summary):
            name = path.relative_to(summary).as_posix()
            if name == "results.json":
                info = tar.gettarinfo(path, arcname=name)
                info.size = len(results)
                tar.addfile(info, io.BytesIO(results))
            else:
                tar.add(path, arcname=name, recursive=False)


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
