"""What a run's start tells while it goes: runs.start_run's progress events (connecting, syncing with files and
bytes, the agent's created) and how kpremote/views/start.py shows them: the run's live line on a terminal, one plain
line per phase elsewhere, nothing with --json."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from unit.helpers import FILES, TASK, gpu

from kpremote.views import terminal
from kpremote.views.run import RunView
from kpremote.hosts.agentclient import Agent
from kpremote.runs.remote import follow_run, start_run
from kpremote.runs.session import RunOptions, RunSession
from kpremote.views.start import StartView, phase_text, size_text
from kpremote.runs.sync import sync_task
from kpremote.task.taskdir import find_task


def started_with_progress(agent: Agent, kernels: Path) -> list[dict]:
    events: list[dict] = []
    session = RunSession(agent)
    run = start_run(session, find_task(kernels, TASK), RunOptions(), on_progress=events.append)
    follow_run(session, TASK, run.run_id, lambda event: None)
    return events


def test_a_start_says_connecting_then_what_it_syncs_then_created(agent, kernels, gpus, standin_runs):
    gpus(gpu(0), gpu(1))  # a GPU a run: the first run's lease may outlive its follow for a moment
    first = started_with_progress(agent, kernels)
    assert [e["event"] for e in first] == ["connecting", "syncing", "created"]
    weight = sum(len((kernels / TASK / rel).read_bytes()) for rel in FILES) + len((kernels / TASK / "standin.json")
                                                                                 .read_bytes())
    assert (first[1]["files"], first[1]["bytes"]) == (len(FILES) + 1, weight)
    again = started_with_progress(agent, kernels)
    assert (again[1]["files"], again[1]["bytes"]) == (0, 0)  # nothing changed: nothing travels


def test_a_start_that_must_sync_the_difference_says_what_that_difference_weighs(agent, kernels, gpus, standin_runs):
    sync_task(agent, find_task(kernels, TASK))
    workspace = Path(agent.host.remote_root) / "tasks" / TASK / "workspace"
    (workspace / "solution" / "kernel.py").write_text("tampered")
    (workspace / ".kpremote" / "manifest.json").unlink()
    events = started_with_progress(agent, kernels)
    assert [e["event"] for e in events] == ["connecting", "syncing", "syncing", "created"]
    assert (events[2]["files"], events[2]["bytes"]) == (1, len(FILES["solution/kernel.py"]))


@pytest.mark.parametrize("size,text", [(0, "0 B"), (812, "812 B"), (6246, "6.1 KiB"), (3565158, "3.4 MiB"),
                                       (1288490189, "1.2 GiB")])
def test_sizes_read_as_people_read_them(size, text):
    assert size_text(size) == text


def test_each_phase_in_words():
    assert phase_text({"event": "connecting"}) == "connecting"
    assert phase_text({"event": "syncing", "files": 12, "bytes": 3565158}) == "syncing 12 files (3.4 MiB)"
    assert phase_text({"event": "syncing", "files": 1, "bytes": 1229}) == "syncing 1 file (1.2 KiB)"
    assert phase_text({"event": "syncing", "files": 0, "bytes": 0}) == "syncing: nothing changed"
    # a retry against the workspace's own listing, after the first request's files were not what it needed
    assert phase_text({"event": "syncing", "files": 0, "bytes": 0, "retry": True}) == \
        "syncing: the workspace had them already (synced from elsewhere)"
    assert phase_text({"event": "syncing", "files": 2, "bytes": 1229, "retry": True}) == \
        "syncing 2 files (1.2 KiB) instead: the workspace was not as this client last left it"
    assert phase_text({"event": "created", "run_id": "x"}) == "starting"
    assert phase_text({"event": "waiting", "gpus": []}) == "waiting for a GPU"
    assert phase_text({"event": "submitted", "job_id": "42"}) == "submitted as Slurm job 42"


@pytest.fixture
def stderr(monkeypatch) -> io.StringIO:
    text = io.StringIO()
    monkeypatch.setattr(terminal, "errors", Console(file=text, width=200, color_system=None))
    return text


PHASES = [{"event": "connecting"}, {"event": "syncing", "files": 2, "bytes": 6246},
          {"event": "syncing", "files": 2, "bytes": 6246}, {"event": "created", "run_id": "x"}]


def test_elsewhere_than_a_terminal_each_phase_is_one_plain_line_on_stderr(stderr):
    with RunView() as live:  # stdout is no terminal here: rich's Live draws nothing
        assert not live.drawing
        on_progress = StartView(live, "0/t", "t", silent=False).on("box-plain")
        for event in PHASES:
            on_progress(event)
        on_progress({"event": "waiting", "gpus": [{"index": 0, "why": "leased: run r1", "since": "12:00:00"}]})
    assert stderr.getvalue().splitlines() == [
        "box-plain: t: connecting", "box-plain: t: syncing 2 files (6.1 KiB)", "box-plain: t: starting",
        "box-plain: waiting for a GPU (Ctrl-C cancels the wait): GPU 0 leased: run r1 (since 12:00:00)"]


def test_with_json_no_phase_is_said(stderr):
    with RunView(quiet=True) as live:
        on_progress = StartView(live, "0/t", "t", silent=True).on("box-json")
        for event in PHASES:
            on_progress(event)
    assert stderr.getvalue() == "" and live.lines == {}


def test_on_a_terminal_the_runs_own_line_says_it_until_the_run_takes_its_place(monkeypatch, stderr):
    drawn = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=drawn, force_terminal=True, width=100, color_system=None))
    with RunView() as live:
        assert live.drawing
        with StartView(live, "0/t", "t", silent=False) as shown:
            for event in PHASES:
                shown.on("box-tty")(event)
            assert live.lines["0/t"]["starting"] == "starting"
            live.add("0/t", "box-tty", "t", "20261123-101010-abcdef", None)
        assert live.lines["0/t"]["run_id"] == "20261123-101010-abcdef"  # in its place, and it stays
        with StartView(live, "1/u", "u", silent=False) as failed:
            failed.on("box-tty")({"event": "connecting"})
        assert list(live.lines) == ["0/t"]  # a start that began no run leaves no line
    assert "connecting …" in drawn.getvalue() and "syncing 2 files (6.1 KiB) …" in drawn.getvalue()
    assert stderr.getvalue() == ""  # nothing beside the live lines to tear them
