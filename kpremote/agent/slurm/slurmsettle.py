"""A cluster run's state reconciled with Slurm's: what Slurm says wins over state.json only when the run could not
say it itself (a job ended by its time limit, preemption or a node failure reads as such; the runner saw only a
SIGTERM), and a job that died without a record is marked from Slurm's. SlurmWatch is `follow`'s state source for
such a run: the queue shown while the job waits, the end held briefly until Slurm says why a run stopped.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Optional

from ..run.events import EventLog
from ..lease import utc_now_iso
from ..protocol import TERMINAL, RunExit
from ..run.runstate import read_state, update_state, update_state_if
from .slurmjobs import ENDED, KILLED_BY_SLURM, SCHEDULER, jobs, node_reason, queue_position

SLURM_POLL_S = 1.0  # how often a follower asks Slurm (one squeue call) while the run has not ended
SETTLE_S = 3.0  # a job Slurm calls ended, whose state.json is not terminal this long after, died without a record

# (a node failure's line goes on: "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")
STEPD_MARKER = re.compile(rb"\*\*\* JOB (\d+) ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?)(?:, [A-Z ]+)?)? \*\*\*")
STEPD_CAUSES = {b"TIME LIMIT": "TIMEOUT", b"PREEMPTION": "PREEMPTED", b"NODE FAILURE": "NODE_FAIL"}


def stepd_verdict(run_dir: Path, job_id: Optional[str]) -> Optional[str]:
    """Why slurmstepd signalled the job, from the line it writes to the job's output before it does:
    `*** JOB 12 ON node CANCELLED AT ... DUE TO TIME LIMIT ***`. Slurm's own state says so only once the job
    has finished COMPLETING, which waits for this very step."""
    try:
        with open(run_dir / "raw" / f"slurm-{job_id}.out", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            tail = f.read()
    except OSError:
        return None
    found = [m for m in STEPD_MARKER.finditer(tail) if m.group(1).decode() == str(job_id)]
    if not found:
        return None
    cause = found[-1].group(2)
    return STEPD_CAUSES.get(cause.strip(), "CANCELLED") if cause else "CANCELLED"


def settle(run_dir: Path, state: dict[str, Any], job: Optional[dict[str, Any]], in_job: bool = False
           ) -> dict[str, Any]:
    """state.json brought in line with what Slurm says of the job, written back when that changes it."""
    if not state or state.get("scheduler") != SCHEDULER or state.get("slurm_settled"):
        return state
    if job is None:
        return state
    if job["state"] not in ENDED and state.get("status") == "cancelled":
        verdict = stepd_verdict(run_dir, job.get("job_id"))
        job = {**job, "state": verdict} if verdict else job
    slurm_state = job["state"]
    status = state.get("status")
    record = {**(state.get("slurm") or {}), **{k: v for k, v in job.items() if v is not None}}
    if status in TERMINAL:
        if status == "cancelled" and not state.get("cancel_requested") and slurm_state in ENDED:
            return _killed_by_slurm(run_dir, state, record)
        if status == "cancelled" and not state.get("cancel_requested") and not in_job:
            return state  # Slurm has not said yet why the job stopped: ask again on the next look
        return update_state(run_dir, slurm=record, slurm_settled=True) if slurm_state in ENDED else state
    if slurm_state in ENDED:
        if not _ended_long_enough(state, job):
            return state
        return _died_without_record(run_dir, state, record)
    # Squeue's word on a pending run, written only while it is still pending: the job's step may have started it
    # since this state was read, and its own record (node, allocated GPUs, phase) is the newer one.
    if slurm_state == "PENDING" and status == "pending":
        if record != state.get("slurm"):
            return update_state_if(run_dir, _still_pending, slurm=record)
    if slurm_state in ("RUNNING", "COMPLETING") and status == "pending":
        return update_state_if(run_dir, _still_pending, phase="starting", slurm=record)
    return state


def _still_pending(state: dict[str, Any]) -> bool:
    return state.get("status") == "pending"


def _ended_long_enough(state: dict[str, Any], job: dict[str, Any]) -> bool:
    seen = state.get("slurm_ended_seen")
    return seen is not None and time.time() - float(seen) > SETTLE_S


def stopped_by_slurm(run_dir: Path, job_id: Optional[str]) -> Optional[dict[str, Any]]:
    """The runner's question when a signal stops it inside a job (slurmstep hands it over): did Slurm stop the job
    on its own account (time limit, preemption, node failure)? Then the run ended failed, and every record the
    runner writes says so: {status, exit_code, ended_by, message}. None for a cancel (scancel, Ctrl-C)."""
    verdict = stepd_verdict(run_dir, job_id) if job_id else None
    if verdict not in KILLED_BY_SLURM:
        return None
    record = {"job_id": job_id, "state": verdict, "node": os.environ.get("SLURMD_NODENAME")}
    return {"status": "failed", "exit_code": int(RunExit.FAILED), "ended_by": verdict,
            "message": killed_message(record)}


def killed_message(record: dict[str, Any]) -> str:
    """`Slurm job 12 TIMEOUT: the job reached its time limit; what the run wrote is kept`: one wording for the
    runner's own record and for one settled afterwards."""
    slurm_state = record["state"]
    why = ENDED.get(slurm_state, slurm_state)
    return f"Slurm job {record.get('job_id')} {slurm_state}: {why}{_reason_text(record)}; what the run wrote is kept"


def _killed_by_slurm(run_dir: Path, state: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    slurm_state = record["state"]
    if slurm_state not in KILLED_BY_SLURM:  # scancel by hand, or a signal from outside Slurm: still a cancel
        message = f"Slurm job {record.get('job_id')} {slurm_state}: {ENDED.get(slurm_state, slurm_state)}" \
                  f"{_reason_text(record)}"
        return update_state(run_dir, message=message, slurm=record, slurm_settled=True)
    message = killed_message(record)
    append_event(run_dir, "slurm", state=slurm_state, reason=record.get("reason"), message=message)
    return update_state(run_dir, status="failed", message=message, slurm=record, slurm_settled=True,
                        ended_by=slurm_state)


def _reason_text(record: dict[str, Any]) -> str:
    """Slurm's reason for the job, and for a node failure the node's own (`scontrol update ... reason=...`)."""
    reasons = [record["reason"]] if record.get("reason") else []
    why_down = node_reason(record["node"]) if record.get("state") == "NODE_FAIL" and record.get("node") else None
    if why_down:
        reasons.append(f"node {record['node']}: {why_down}")
    return f" ({'; '.join(reasons)})" if reasons else ""


def _died_without_record(run_dir: Path, state: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    slurm_state = record["state"]
    why = ENDED.get(slurm_state, slurm_state)
    reason = _reason_text(record)
    was = "before it started" if state.get("status") == "pending" else "without recording an end"
    message = f"Slurm job {record.get('job_id')} {slurm_state}: {why}{reason}, {was}; see raw/slurm-*.out"
    status = "cancelled" if slurm_state == "CANCELLED" else "failed" if slurm_state in KILLED_BY_SLURM else "error"
    append_event(run_dir, "done", status=status, exit_code=None, message=message)
    return update_state(run_dir, status=status, phase="done", message=message, slurm=record, slurm_settled=True,
                        ended_by=slurm_state, finished=utc_now_iso())


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    log = EventLog(run_dir / "raw" / "events.jsonl")
    try:
        log.emit(event, **fields)
    finally:
        log.close()


def look(run_dir: Path) -> dict[str, Any]:
    """The run's state, reconciled with Slurm now (one squeue call)."""
    return look_all([run_dir])[0]


def look_all(run_dirs: list[Path]) -> list[dict[str, Any]]:
    states = [read_state(d) for d in run_dirs]
    asking = [s["job_id"] for s in states if s.get("job_id") and needs_slurm(s)]
    known = jobs(asking) if asking else {}
    settled = []
    for run_dir, state in zip(run_dirs, states):
        job = known.get(state.get("job_id") or "")
        if job and job["state"] in ENDED and state.get("status") not in TERMINAL and not state.get("slurm_ended_seen"):
            state = update_state(run_dir, slurm_ended_seen=time.time())
        settled.append(settle(run_dir, state, job))
    return settled


def needs_slurm(state: dict[str, Any]) -> bool:
    return state.get("scheduler") == SCHEDULER and not state.get("slurm_settled") and (
        state.get("status") not in TERMINAL or state.get("status") == "cancelled")


def with_queue(state: dict[str, Any]) -> dict[str, Any]:
    """A pending run's state with its place in the queue (Slurm's reason is already in state["slurm"])."""
    job = state.get("slurm") or {}
    if state.get("status") != "pending" or not state.get("job_id"):
        return state
    position, pending = queue_position(state["job_id"], job.get("partition"))
    return {**state, "queue": {"reason": job.get("reason"), "position": position, "pending": pending}}


def queued_phase(state: dict[str, Any]) -> str:
    queue = state.get("queue") or {}
    where = f", {queue['position']} of {queue['pending']} pending" if queue.get("position") else ""
    return f"queued: {queue.get('reason') or 'waiting'}{where}"


class SlurmWatch:
    """`follow`'s state source for a cluster run: Slurm is asked at most every SLURM_POLL_S while it may still say
    something; a pending job's place in the queue goes out as a phase line when it changes, and where it started
    once it leaves the queue; a run that stopped on a signal is over once Slurm said why (or 2 * SETTLE_S)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.last_asked = 0.0
        self.last_phase: Optional[str] = None
        self.ended_at: Optional[float] = None

    def look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        if time.monotonic() - self.last_asked < SLURM_POLL_S or not needs_slurm(read_state(self.run_dir)):
            return read_state(self.run_dir), []
        state = with_queue(look(self.run_dir))
        self.last_asked = time.monotonic()
        return state, self._phase_lines(state)

    def _phase_lines(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        if state.get("status") == "pending" and queued_phase(state) != self.last_phase:
            self.last_phase = queued_phase(state)
            return [{"t": round(time.time(), 6), "event": "phase", "phase": self.last_phase,
                     "queue": state.get("queue"), "job_id": state.get("job_id")}]
        if self.last_phase and state.get("status") != "pending":  # out of the queue: say where it went
            job = state.get("slurm") or {}
            self.last_phase = None
            return [{"t": round(time.time(), 6), "event": "phase", "phase": "started on "
                     f"{job.get('node') or state.get('node') or '?'} (Slurm job {state.get('job_id')})",
                     "job_id": state.get("job_id")}]
        return []

    def over(self, state: dict[str, Any]) -> bool:
        if state.get("status") in TERMINAL and self.ended_at is None:
            self.ended_at = time.monotonic()
        # A run that stopped on a signal waits (briefly) for Slurm to say why: time limit, preemption, node.
        return self.ended_at is not None and (
            not needs_slurm(state) or time.monotonic() - self.ended_at > 2 * SETTLE_S)
