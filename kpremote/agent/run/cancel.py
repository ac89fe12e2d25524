"""`cancel` of a run on this host, whatever it is doing: a start still waiting or spawning gets SIGTERM (it
records itself cancelled), a running run's whole process group SIGTERM then SIGKILL after the grace, and a run
that does not exist yet (with --pending) a tombstone that its start will refuse.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from ..lease import utc_now_iso
from .liveness import current_state, group_is_run, looks_like_run, signal_group, wait_group_gone
from ..protocol import TERMINAL
from .runpaths import existing_run_dir, tombstone_unless_recorded
from .runstate import mark_cancel_requested, read_state, update_state

CANCEL_GRACE_S = 5.0


def cancel(root: Path, task: str, run_id: str, grace_s: float = CANCEL_GRACE_S,
           pending: bool = False) -> dict[str, Any]:
    """Stop a run, whatever it is doing: still in its start (waiting for a GPU, spawning) or running.

    With pending, a run that does not exist yet (its start is still on the way: syncing, or not arrived) gets a
    tombstone instead, and that start refuses to begin.
    """
    if pending and tombstone_unless_recorded(root, task, run_id):
        return {"cancelled": True, "state": {"run_id": run_id, "task": task, "status": "cancelled",
                                             "phase": "never started"}}
    run_dir = existing_run_dir(root, task, run_id)
    state = current_state(run_dir)
    if state.get("status") in TERMINAL:
        return {"cancelled": False, "state": state}
    # Another look at the run while this one stops it (a second cancel, a follow, a status) finds its process gone
    # before the record below is written: the mark makes that look record "cancelled" too, not "agent process died".
    mark_cancel_requested(run_dir)
    for _ in range(3):  # a start may hand over to its runner while we stop it: then the runner's group goes
        if state.get("status") in TERMINAL:
            break
        if not state.get("pgid"):
            _stop_starter(int(state.get("pid") or 0), run_id, grace_s)
        else:
            pgid = int(state["pgid"])
            if pgid > 1 and pgid != os.getpgrp() and group_is_run(pgid, run_id):
                _terminate_group(pgid, grace_s)
            break
        state = read_state(run_dir)
    state = read_state(run_dir)
    if state.get("status") not in TERMINAL:
        state = update_state(run_dir, status="cancelled", finished=utc_now_iso())
    return {"cancelled": True, "state": state}


def _stop_starter(pid: int, run_id: str, grace_s: float) -> None:
    """SIGTERM a start that has not handed over yet (it records itself cancelled), SIGKILL it if it lingers."""
    if pid <= 1 or pid == os.getpid() or not looks_like_run(pid, run_id):
        return
    for signum, patience in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while looks_like_run(pid, run_id):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        else:
            return


def _terminate_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the run's whole process group, then SIGKILL whatever is left: no worker may outlive a cancel."""
    signal_group(pgid, signal.SIGTERM)
    if wait_group_gone(pgid, grace_s):
        return
    signal_group(pgid, signal.SIGKILL)
    wait_group_gone(pgid, 2.0)
