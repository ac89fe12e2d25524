"""The agent's run bookkeeping: one follow loop for this host's runs and Slurm's (a watch says where the state comes
from) and one parser for squeue's and sacct's job lines. (No module imports another's private names: test_one_place.py.)"""

from __future__ import annotations

import io
import re
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from kpremote.agent.run.follow import follow_run
from kpremote.agent.run.records import seal_summary
from kpremote.agent.run.runstate import read_state, update_state
from kpremote.agent.slurm import slurmjobs, slurmsettle


class ScriptedWatch:
    """A watch that gives the states it was handed, one per look, with a line to say at the first."""

    def __init__(self, *states: dict[str, Any]) -> None:
        self.states = list(states)
        self.looks = 0

    def look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        self.looks += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return state, [{"event": "phase", "phase": "queued"}] if self.looks == 1 else []

    def over(self, state: dict[str, Any]) -> bool:
        return state["status"] == "passed"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "tasks" / "t" / "runs" / "20260101-000000-abcdef"  # under a root: its host's key seals it
    (run_dir / "raw").mkdir(parents=True)
    (run_dir / "summary").mkdir()
    (run_dir / "summary" / "results.json").write_text("{}")
    (run_dir / "raw" / "events.jsonl").write_bytes(b'{"event": "row"}\n{"event": "half')
    return run_dir


def test_follow_says_the_watchs_lines_then_the_events_then_one_end_and_the_summary(run_dir):
    out = io.BytesIO()
    passed = {"status": "passed", **seal_summary(run_dir)}
    watch = ScriptedWatch({"status": "running"}, passed)
    assert follow_run(run_dir, watch, out=out, with_summary=True) == 0
    head, _, tar_bytes = out.getvalue().partition(b'{"event": "end"')
    lines = [json.loads(line) for line in head.splitlines()]
    assert lines == [{"event": "phase", "phase": "queued"}, {"event": "row"}]  # a half-written line waits
    end = json.loads(b'{"event": "end"' + tar_bytes.split(b"\n", 1)[0])
    assert end == {"event": "end", "state": passed, "offset": 17, "summary": True}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes.split(b"\n", 1)[1])) as tar:
        assert tar.getnames() == ["results.json"]


def test_follow_sends_no_summary_that_its_seal_does_not_vouch_for(run_dir):
    """The end line says why no tar follows: here results.json was rewritten after the runner sealed it."""
    passed = {"status": "passed", **seal_summary(run_dir)}
    (run_dir / "summary" / "results.json").write_text('{"headline": 9.9}')
    out = io.BytesIO()
    follow_run(run_dir, ScriptedWatch(passed), out=out, with_summary=True)
    end = json.loads(out.getvalue().splitlines()[-1])
    assert "summary" not in end and out.getvalue().endswith(b"}\n")
    assert end["summary_refused"].startswith("run 20260101-000000-abcdef of t: its summary/results.json has sha256 ")


def test_follow_once_ends_with_the_state_as_it_is_and_no_summary(run_dir):
    out = io.BytesIO()
    follow_run(run_dir, ScriptedWatch({"status": "running"}), out=out, once=True, with_summary=True)
    end = json.loads(out.getvalue().splitlines()[-1])
    assert end == {"event": "end", "state": {"status": "running"}, "offset": 17}


def test_the_slurm_watch_shows_the_queue_then_where_the_job_started(run_dir, monkeypatch):
    update_state(run_dir, scheduler="slurm", status="pending", job_id="12")
    states = iter([
        {"status": "pending", "job_id": "12", "slurm": {"reason": "Priority", "partition": "gpu"}},
        {"status": "pending", "job_id": "12", "slurm": {"reason": "Priority", "partition": "gpu"}},
        {"status": "running", "job_id": "12", "slurm": {"node": "gpu07"}},
    ])
    monkeypatch.setattr(slurmsettle, "look", lambda _run_dir: next(states))
    monkeypatch.setattr(slurmsettle, "queue_position", lambda job_id, partition: (2, 5))
    monkeypatch.setattr(slurmsettle, "SLURM_POLL_S", 0.0)
    watch = slurmsettle.SlurmWatch(run_dir)
    said = [watch.look()[1] for _ in range(3)]
    assert [[line["phase"] for line in lines] for lines in said] == [
        ["queued: Priority, 2 of 5 pending"], [], ["started on gpu07 (Slurm job 12)"]]
    assert not watch.over({"status": "running"})


def test_squeue_and_sacct_lines_read_alike_and_a_forgotten_job_says_so(monkeypatch):
    answers = {
        "squeue": "12|RUNNING|gpu07|2026-01-01T00:00:00|1:00|10:00|gpu|None\n99|PENDING||N/A|0:00|10:00|gpu|x\n",
        "sacct": "13|CANCELLED by 0|gpu08|2026-01-01T00:00:00|0:30|10:00|gpu|a|b\n",
    }
    monkeypatch.setattr(slurmjobs, "slurm", lambda *argv, check=True: subprocess.CompletedProcess(
        argv, 0, answers[argv[0]], ""))
    found = slurmjobs.jobs(["12", "13", "14"])
    assert found["12"] == {"job_id": "12", "state": "RUNNING", "node": "gpu07", "start": "2026-01-01T00:00:00",
                           "elapsed": "1:00", "time_limit": "10:00", "partition": "gpu", "reason": None}
    assert found["13"]["state"] == "CANCELLED" and found["13"]["reason"] == "a|b" and found["13"]["source"] == "sacct"
    assert found["14"]["state"] == slurmjobs.FORGOTTEN and "99" not in found


def test_a_look_that_read_a_run_pending_never_undoes_the_step_that_started_it(run_dir):
    # A client's look reads the run pending, its job queued; before it writes, the job's step starts the run (its
    # node, the GPUs Slurm allocated) and the runner moves on. What the look then learns from squeue (the job is
    # RUNNING, or, asked a moment earlier, still PENDING) must not be written over the step's record.
    update_state(run_dir, scheduler=slurmjobs.SCHEDULER, status="pending", phase="queued", job_id="7",
                 slurm={"job_id": "7", "state": "PENDING", "reason": "Priority", "partition": "gpu"})
    seen = read_state(run_dir)
    step = {"job_id": "7", "state": "RUNNING", "node": "n1", "allocated_gpus": ["gpu:0"]}
    update_state(run_dir, status="running", phase="starting", node="n1", slurm=step)
    update_state(run_dir, phase="workloads")
    running = {"job_id": "7", "state": "RUNNING", "node": "n1", "partition": "gpu", "reason": "None"}
    queued = {"job_id": "7", "state": "PENDING", "node": None, "partition": "gpu", "reason": "Resources"}
    for squeue in (running, queued):
        slurmsettle.settle(run_dir, seen, squeue)
        now = read_state(run_dir)
        assert (now["status"], now["phase"], now["slurm"]) == ("running", "workloads", step), squeue
    # while the run is still pending, squeue's word is written as before
    update_state(run_dir, status="pending", phase="queued", slurm=seen["slurm"])
    assert slurmsettle.settle(run_dir, read_state(run_dir), queued)["slurm"]["reason"] == "Resources"
    assert slurmsettle.settle(run_dir, read_state(run_dir), running)["phase"] == "starting"


def test_state_json_takes_only_the_keys_its_record_declares_of_their_types(tmp_path):
    """results.RunState: a writer that sets an undeclared key or a value of another type is refused in one line,
    and state.json is left as it was."""
    run_dir = tmp_path / "r1"
    update_state(run_dir, run_id="r1", status="running", pid=12, workloads="a,b", slurm={"job_id": "7"})
    for bad, said in (({"speedup": 1.2}, "state.json: speedup: not a field of RunState"),
                      ({"pid": "12"}, "state.json.pid: expected an integer or null, got '12'"),
                      ({"cancel_requested": 1}, "state.json.cancel_requested: expected true or false or null, got 1")):
        with pytest.raises(ValueError, match=f"^{re.escape(said)}"):
            update_state(run_dir, **bad)
    assert read_state(run_dir) == {"run_id": "r1", "status": "running", "pid": 12, "workloads": "a,b",
                                   "slurm": {"job_id": "7"}}
