"""state.json of one run: the single record of what a run is doing (results.RunState), updated atomically."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Callable

from ..atomicfile import write_json_atomically
from ..filelock import held
from ..protocol import TERMINAL, RunExit  # noqa: F401 - re-exported
from ..results import RunState

DISK_FULL_EXIT = RunExit.DISK_FULL
"""A worker's exit code when the disk was too full to write its result (28 = ENOSPC)."""


def state_path(run_dir: Path) -> Path:
    return Path(run_dir) / "state.json"


CANCEL_MARK = "cancel_requested"
"""runs/<id>/cancel_requested: a cancel is stopping this run. Apart from state.json, so no state write drops it."""


def mark_cancel_requested(run_dir: Path) -> None:
    """Before a cancel stops a run: whoever then finds its process gone records it cancelled, not failed."""
    (Path(run_dir) / CANCEL_MARK).touch()


def cancel_requested(run_dir: Path) -> bool:
    return (Path(run_dir) / CANCEL_MARK).is_file()


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(state_path(run_dir).read_text())
    except FileNotFoundError:
        return {}


def update_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into state.json through a rename, so readers never see a torn file."""
    return update_state_if(run_dir, lambda _state: True, **fields)


def update_state_if(run_dir: Path, still: Callable[[dict[str, Any]], bool], **fields: Any) -> dict[str, Any]:
    """Merge fields into state.json only if still(state) holds for the state as it is now; the state either way.

    Every writer reads, merges and renames under one lock (state.lock beside state.json): a run's state has more
    than one writer (the runner, a Slurm job's step, a client's look that settles it with Slurm), and a writer that
    decided on a state read earlier must not undo what another wrote since (a pending run's queue record written
    over the step's record of the GPUs it was allocated)."""
    lock = state_path(run_dir).with_name("state.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)  # as the first write of state.json makes its folder
    RunState.check_written(fields)  # an undeclared key or a value of another type: the writer's bug, said here
    with held(lock):
        state = read_state(run_dir)
        if not still(state):
            return state
        state.update(fields)
        write_json_atomically(state_path(run_dir), state, indent=1)
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
