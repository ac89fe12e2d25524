"""Where runs live under ROOT, and which run ids may still be claimed.

Layout: tasks/<task>/workspace/, tasks/<task>/runs/<run-id>/{state.json, summary/, raw/}, and
tasks/<task>/.cancelled/<run-id>, a tombstone: a cancel that came before its run's start, which then refuses.
One lock per task (tasks/<task>/.claims.lock) makes a claim and the tombstone of an unborn run exclusive.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..filelock import held
from ..lease import utc_now_iso
from ..protocol import NAME_RULE, RUN_ID_RULE, is_name, is_run_id, new_run_id
from ..protocol import BadRequest, NotFound, StartCancelled
from .runstate import update_state

TOMBSTONES = ".cancelled"  # tasks/<task>/.cancelled/<run-id>: cancelled before its start came; it refuses
CLAIMS_LOCK = ".claims.lock"  # tasks/<task>/.claims.lock: a claim and a cancel of an unborn run, one at a time


def validate_task_name(task: str) -> str:
    if not is_name(task):
        raise BadRequest(f"bad task name {task!r}: use {NAME_RULE}")
    return task


def task_dir(root: Path, task: str) -> Path:
    return Path(root) / "tasks" / validate_task_name(task)


def check_run_id(run_id: str) -> str:
    if not is_run_id(run_id):
        raise BadRequest(f"bad run id {run_id!r}: expected {RUN_ID_RULE}")
    return run_id


def existing_run_dir(root: Path, task: str, run_id: str) -> Path:
    check_run_id(run_id)
    run_dir = task_dir(root, task) / "runs" / run_id
    if not (run_dir / "state.json").is_file():
        raise NotFound(f"no run {run_id} of task {task} on this host")
    return run_dir


def recorded_run_dirs(root: Path, task: str | None = None) -> list[Path]:
    """Every run folder with a record, of one task or of all, in run-id (start time) order."""
    tasks = [task_dir(root, task)] if task else sorted(Path(root, "tasks").glob("*"))
    run_dirs = [run for t in tasks for run in (t / "runs").glob("*") if (run / "state.json").is_file()]
    return sorted(run_dirs, key=lambda run: run.name)


def new_run(runs_dir: Path) -> tuple[str, Path]:
    """A fresh run id and its folder; the exclusive mkdir is what makes concurrent ids distinct."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = new_run_id()
        try:
            (runs_dir / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id, runs_dir / run_id


def claim_run(runs_dir: Path, run_id: str | None = None, **fields: Any) -> tuple[str, Path]:
    """Create the run's record, or refuse: a tombstone says a cancel came first, an existing folder that the id
    is taken. One lock per task makes a claim and a cancel of a run that does not exist yet exclusive."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    with held(runs_dir.parent / CLAIMS_LOCK):
        if run_id is None:
            run_id, run_dir = new_run(runs_dir)
        else:
            check_run_id(run_id)
            tombstone = runs_dir.parent / TOMBSTONES / run_id
            if tombstone.exists():
                tombstone.unlink()
                raise StartCancelled(f"run {run_id} was cancelled before its start arrived")
            run_dir = runs_dir / run_id
            try:
                run_dir.mkdir()
            except FileExistsError:
                raise BadRequest(f"run id {run_id} is already taken on this host") from None
        update_state(run_dir, run_id=run_id, **fields, pid=os.getpid(), created=utc_now_iso())
    return run_id, run_dir


def tombstone_unless_recorded(root: Path, task: str, run_id: str) -> bool:
    """Leave a tombstone for run_id unless its record exists; True when it did not exist (the tombstone is left)."""
    runs_dir = task_dir(root, task) / "runs"
    check_run_id(run_id)
    runs_dir.mkdir(parents=True, exist_ok=True)
    with held(runs_dir.parent / CLAIMS_LOCK):
        if (runs_dir / run_id / "state.json").is_file():
            return False
        (runs_dir.parent / TOMBSTONES).mkdir(exist_ok=True)
        (runs_dir.parent / TOMBSTONES / run_id).write_text(utc_now_iso())
        return True
