"""Whether a run on this host is still alive: state.json as it really is, a run whose process vanished marked
failed (and its leftover workers ended) by whoever looks next, so no run stays "running" forever; `status`.

A run's process group is told apart from a reused pid or pgid by its command line (procfs.py reads /proc).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from ..lease import utc_now_iso
from ..procfs import command_line, group_members, is_alive, pid_exists
from ..protocol import TERMINAL
from .runpaths import recorded_run_dirs
from .runstate import cancel_requested, read_state, update_state


def status(root: Path, task: str | None = None) -> dict[str, Any]:
    return {"runs": [current_state(run) for run in recorded_run_dirs(root, task)]}


def current_state(run_dir: Path) -> dict[str, Any]:
    """state.json, with a run whose process vanished mid-run marked failed."""
    state = read_state(run_dir)
    if not state or state.get("status") in TERMINAL or not state.get("pid"):
        return state
    if state.get("scheduler") == "slurm":  # its pid is on a compute node: Slurm judges it (slurmsettle.py)
        return state
    run_id = state.get("run_id") or Path(run_dir).name
    if looks_like_run(int(state["pid"]), run_id):
        return state
    state = read_state(run_dir)  # it may have finished between our two looks
    if state.get("status") in TERMINAL:
        return state
    _end_leftovers(state, run_id)
    if cancel_requested(run_dir):  # a cancel is stopping it: it ended because it was asked to
        return update_state(run_dir, status="cancelled", finished=utc_now_iso())
    died = "agent process died" if state.get("pgid") else "its start process died before the run began"
    return update_state(run_dir, status="failed", error=died, finished=utc_now_iso())


def _end_leftovers(state: dict[str, Any], run_id: str) -> None:
    """A dead runner's workers would go on using a GPU its lease no longer holds: they end with it."""
    pgid = int(state.get("pgid") or 0)
    if pgid > 1 and pgid != os.getpgrp() and group_is_run(pgid, run_id):
        signal_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, 2.0)


def looks_like_run(pid: int, run_id: str) -> bool:
    """Whether pid is alive and still ours: a pid reused by an unrelated process does not count.

    An empty command line on a live process means it is between fork and exec (our launcher execs the
    runner): still ours. Only a missing process, a zombie, or a different program counts as dead.
    """
    if not is_alive(pid):
        return False
    text = command_line(pid)
    if text is None:  # unreadable (another user's pid: alive is all we can know) or gone since
        return pid_exists(pid)
    return not text.strip() or run_id in text or "kpremote" in text


def group_is_run(pgid: int, run_id: str) -> bool:
    return any(looks_like_run(pid, run_id) for pid in group_members(pgid))


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
