"""A cluster run's follow, status and cancel (`slurm-follow`, `slurm-status`, `slurm-cancel`): the local ones'
twins, with Slurm as the judge of liveness (slurmsettle.py) and `scancel` in place of signals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, BinaryIO, Optional

from ..run.follow import follow_run
from ..lease import utc_now_iso
from ..protocol import TERMINAL
from ..run.runpaths import existing_run_dir, recorded_run_dirs, tombstone_unless_recorded
from ..run.runstate import read_state, update_state
from .slurmjobs import ENDED, SCHEDULER, jobs, slurm
from .slurmsettle import SlurmWatch, append_event, look, look_all, needs_slurm, queued_phase, with_queue

CANCEL_WAIT_S = 30.0


def follow(root: Path, task: str, run_id: str, offset: int = 0, out: Optional[BinaryIO] = None, once: bool = False,
           with_summary: bool = False) -> int:
    """As the local follow, with Slurm as the judge of liveness, and the queue shown while the job waits."""
    run_dir = existing_run_dir(root, task, run_id)
    return follow_run(run_dir, SlurmWatch(run_dir), offset, out, once=once, with_summary=with_summary)


def status(root: Path, task: Optional[str] = None) -> dict[str, Any]:
    return {"runs": [_shown(with_queue(state)) for state in look_all(recorded_run_dirs(root, task))]}


def _shown(state: dict[str, Any]) -> dict[str, Any]:
    """How `inv status` shows a run: the queue while pending; a job Slurm is still ending is not over yet."""
    if state.get("queue"):
        return {**state, "phase": queued_phase(state)}
    if state.get("status") == "cancelled" and needs_slurm(state) and not state.get("cancel_requested"):
        return {**state, "status": "running", "phase": f"stopping: Slurm is ending job {state.get('job_id')}"}
    return state


def cancel(root: Path, task: str, run_id: str, wait_s: float = CANCEL_WAIT_S, pending: bool = False
           ) -> dict[str, Any]:
    """scancel the job; the runner records the cancel (SIGTERM), or we do when the job never started.

    With pending, a run not submitted yet gets a tombstone instead (as the local cancel's), and its submit refuses it.
    """
    if pending and tombstone_unless_recorded(root, task, run_id):
        return {"cancelled": True, "state": {"run_id": run_id, "task": task, "status": "cancelled",
                                             "phase": "never started", "scheduler": SCHEDULER}}
    run_dir = existing_run_dir(root, task, run_id)
    state = look(run_dir)
    if state.get("status") in TERMINAL:
        return {"cancelled": False, "state": state}
    update_state(run_dir, cancel_requested=True)
    if state.get("job_id"):
        slurm("scancel", state["job_id"])
    deadline, job = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        job = jobs([state["job_id"]]).get(state["job_id"]) if state.get("job_id") else None
        if state.get("status") in TERMINAL or (job and job["state"] in ENDED and state.get("status") == "pending"):
            break
        time.sleep(0.2)
    if state.get("status") not in TERMINAL:  # the job never started (or died before its runner could say)
        message = "scancel while queued: the job never started" if state.get("status") == "pending" else \
            "cancelled (scancel)"
        append_event(run_dir, "done", status="cancelled", exit_code=None, message=message)
        state = update_state(run_dir, status="cancelled", phase="done", finished=utc_now_iso(), message=message)
    if job:
        state = update_state(run_dir, slurm={**(state.get("slurm") or {}), **job}, slurm_settled=True)
    return {"cancelled": True, "state": state}
