"""What the client does with the agent's answers, through an agent answered in this process: placement, the retries
(ship, need-full sync), sync and the fetch refusals. Seconds, not the minutes of the real-sshd rig."""

from __future__ import annotations

import io
import hashlib
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from unit.helpers import TASK, TASK_TOML, gpu, write

from kpremote.agent.protocol import TERMINAL, ExitCode
from kpremote.agent.run.records import seal_summary
from kpremote.hosts.agentclient import Agent
from kpremote.errors import KpremoteError
from kpremote.errors import FetchRefused, HostBusy, UnsafeArchive
from kpremote.runs.fetch import fetch_results, fetch_run
from kpremote.hosts.inprocessagent import InProcessTransport
from kpremote.runs.remote import cancel_run, follow_run, list_runs, start_run
from kpremote.runs.session import RunOptions, RunSession, open_session
from kpremote.runs.sync import sync_task
from kpremote.task.taskdir import find_task

RUN_ID = "20260101-120000-abcdef"


def workspace(agent: Agent) -> Path:
    return Path(agent.host.remote_root) / "tasks" / TASK / "workspace"


# ---------------------------------------------------------------- the session


def test_a_session_talks_only_through_the_agent_it_is_given(agent, host):
    session = RunSession(agent)
    assert session.host is agent.host and list_runs(session) == []
    assert session.channels == agent.transport.channels.opened == 1  # the call went through the given transport
    real = open_session(host)
    assert real.agent is not agent and type(real.agent.transport).__name__ == "LocalTransport"  # hosts.toml's kind


# ---------------------------------------------------------------- placement


def test_a_run_goes_to_the_idle_gpu_with_least_memory_used_and_leased_ones_are_skipped(agent, kernels, gpus,
                                                                                       standin_runs):
    gpus(gpu(0, memory_used_mib=9000), gpu(1, memory_used_mib=100), gpu(2, memory_used_mib=0))
    standin_runs(events=1, hold_s=30)
    session = RunSession(agent)
    first = start_run(session, find_task(kernels, TASK), RunOptions())
    second = start_run(session, find_task(kernels, TASK), RunOptions())
    try:
        assert (first.gpu["index"], second.gpu["index"]) == (2, 1)
        with pytest.raises(HostBusy) as refused:
            start_run(session, find_task(kernels, TASK), RunOptions())
        text = str(refused.value)
        assert "no idle GPU" in text and "9000 MiB used > 2048 MiB" in text
        assert f"leased: run {first.run_id}" in text and f"leased: run {second.run_id}" in text
    finally:
        for run in (first, second):
            cancel_run(session, TASK, run.run_id)


def test_a_task_for_another_arch_is_refused_with_what_the_host_has(agent, kernels, gpus, standin_runs):
    write(kernels / TASK / "task.toml", TASK_TOML.format(arch="b200"))
    with pytest.raises(KpremoteError, match=r"task arch b200 needs a B200: GPU 0 \(NVIDIA H200\) is not a B200"):
        start_run(RunSession(agent), find_task(kernels, TASK), RunOptions())
    assert not list((workspace(agent).parent / "runs").iterdir())  # the refused run left no folder


def test_a_task_of_two_arches_runs_on_either_and_an_h100_is_refused_by_model(agent, kernels, gpus, standin_runs):
    write(kernels / TASK / "task.toml", TASK_TOML.replace("arch = '{arch}'", 'arch = ["h200", "b200"]'))
    session = RunSession(agent)
    gpus(gpu(0, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559))  # compute capability 9.0, as an H200
    with pytest.raises(KpremoteError, match=r"task arch h200,b200 needs an H200 or a B200: GPU 0 \(NVIDIA H100 80GB "
                                            r"HBM3\) is not an H200 and is not a B200"):
        start_run(session, find_task(kernels, TASK), RunOptions())
    gpus(gpu(0, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559),
         gpu(1, name="NVIDIA B200", cc=[10, 0], memory_total_mib=183359))
    run = start_run(session, find_task(kernels, TASK), RunOptions())
    try:
        assert run.gpu["name"] == "NVIDIA B200"
    finally:
        cancel_run(session, TASK, run.run_id)


def test_a_run_follows_to_its_end_and_its_summary_comes_on_the_same_channel(agent, kernels, gpus, standin_runs,
                                                                           tmp_path):
    standin_runs(events=2)
    session = RunSession(agent)
    run = start_run(session, find_task(kernels, TASK), RunOptions())
    events, parts = [], []
    final = follow_run(session, TASK, run.run_id, events.append, summary_sink=parts.append)
    assert final["status"] == "passed" and [e["n"] for e in events if e["event"] == "tick"] == [0, 1]
    report = fetch_run(agent, find_task(kernels, TASK), final, agent.host.name, b"".join(parts))
    assert report.outcome == "fetched" and (report.path / "results.json").read_text() == '{"headline": 1.0}'
    assert not (report.path / "passwd-link").exists()  # the link in summary/ never leaves the host
    assert agent.transport.channels.opened == 2  # start (with the sync) and follow (with the summary)


# ---------------------------------------------------------------- retries


def test_an_agent_the_host_lacks_is_shipped_once_and_the_call_made_again(host):
    agent = Agent(host, InProcessTransport(host.name, shipped=False))
    assert agent.call_json("status") == {"runs": []}
    assert agent.call_json("status") == {"runs": []}
    assert agent.shipped == 1
    assert [call[0] for call in agent.transport.calls] == ["status", "ship", "status", "status"]


def test_start_on_a_workspace_changed_behind_the_clients_back_syncs_the_difference_then_starts(agent, kernels, gpus,
                                                                                             standin_runs):
    sync_task(agent, find_task(kernels, TASK))
    (workspace(agent) / "solution" / "kernel.py").write_text("tampered")
    (workspace(agent) / ".kpremote" / "manifest.json").unlink()
    session = RunSession(agent)
    run = start_run(session, find_task(kernels, TASK), RunOptions())
    assert [call[0] for call in agent.transport.calls[-3:]] == ["start", "sync-apply", "start"]
    assert run.synced_files == 1
    assert (workspace(agent) / "solution" / "kernel.py").read_text() == "def kernel(): return 'solution'\n"
    follow_run(session, TASK, run.run_id, lambda event: None)


def test_the_need_full_answer_is_exit_7_with_a_listing_and_starts_nothing(agent, kernels, gpus, standin_runs):
    sync_task(agent, find_task(kernels, TASK))
    (workspace(agent) / ".kpremote" / "manifest.json").unlink()
    (workspace(agent) / "task.toml").write_text("changed")
    from kpremote.runs.sync import build_sync_request, plan_sync
    from kpremote.task.taskscan import scan_task

    request = build_sync_request(plan_sync(agent.host, scan_task(find_task(kernels, TASK))))
    result = agent.call("start", "--task", TASK, "--sync", stdin=request)
    answer = json.loads(result.stdout)
    assert result.exit_code == ExitCode.NEED_FULL_SYNC and answer["need_full"] is True
    assert set(answer["have"]) >= {"task.toml", "solution/kernel.py"}
    assert not (workspace(agent).parent / "runs").exists()


# ---------------------------------------------------------------- sync


def test_sync_sends_only_what_changed_over_one_channel(agent, kernels):
    first = sync_task(agent, find_task(kernels, TASK))
    write(kernels / TASK / "solution" / "kernel.py", "def kernel(): return 'faster'\n")
    (kernels / TASK / "bench" / "adapter.py").unlink()
    second = sync_task(agent, find_task(kernels, TASK))
    assert (first.files_sent, first.channels) == (5, 1)
    assert (second.files_sent, second.deleted, second.channels) == (1, 1, 1)
    assert not (workspace(agent) / "bench" / "adapter.py").exists()


def test_a_sync_stream_with_an_unannounced_member_is_refused_and_nothing_applied(agent, kernels):
    sync_task(agent, find_task(kernels, TASK))
    header = {"version": 1, "base_digest": "x", "new_digest": "y", "changed": [], "deleted": [], "sizes": {},
              "full": False, "provenance": {}}
    result = agent.call("sync-apply", "--task", "../escape", stdin=json.dumps(header).encode() + b"\n")
    assert result.exit_code == 1 and json.loads(result.stdout) == {
        "error": "sync", "message": "invalid task name '../escape': letters, digits, '.', '_' and '-' only, "
                                    "starting with a letter or digit"}


# ---------------------------------------------------------------- fetch refusals


def finished_run(agent: Agent, run_id: str = RUN_ID, status: str = "passed", **summary: bytes) -> Path:
    """A run on the in-process host as the runner leaves it: summary/ files, sealed as the runner seals them
    (records.seal_summary), and state.json."""
    run_dir = Path(agent.host.remote_root) / "tasks" / TASK / "runs" / run_id
    for name, data in {"results.json": b'{"headline": 2.0}', **summary}.items():
        write(run_dir / "summary" / name, data)
    sealed = seal_summary(run_dir) if status in TERMINAL else {}
    write(run_dir / "state.json", json.dumps({"run_id": run_id, "task": TASK, "status": status, **sealed}))
    return run_dir


def test_fetch_refuses_a_run_that_has_not_finished(agent, kernels):
    finished_run(agent, status="running")
    with pytest.raises(FetchRefused, match=f"run {RUN_ID} is running; its summary is not final yet"):
        fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)


def test_fetch_keeps_a_different_summary_already_there(agent, kernels):
    run_dir = finished_run(agent)
    assert fetch_results(agent, TASK, "latest", kernels, agent.host.name)[0].outcome == "fetched"
    assert fetch_results(agent, TASK, "latest", kernels, agent.host.name)[0].outcome == "unchanged"
    fetched = kernels / TASK / "results" / agent.host.name / RUN_ID / "notes.md"
    fetched.write_text("mine")  # the folder at home is no longer what the host holds
    with pytest.raises(FetchRefused, match="already holds a different summary"):
        fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)
    assert fetched.read_text() == "mine" and fetched.with_name("results.json").read_text() == '{"headline": 2.0}'


def test_fetch_refuses_a_summary_larger_than_the_hosts_cap(agent, kernels):
    finished_run(agent, **{"big.bin": bytes(64 * 1024)})
    agent = Agent(replace(agent.host, max_summary_mb=0.01), agent.transport)
    with pytest.raises(FetchRefused, match="larger than 0.01 MB; stopped reading, nothing was written"):
        fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)
    assert not (kernels / TASK / "results").exists() or not any((kernels / TASK / "results").rglob("*.bin"))


def test_fetch_refuses_an_archive_with_raw_files_or_escaping_paths(agent, kernels):
    for name in ("raw/samples.txt", "../outside.txt"):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        state = {"run_id": RUN_ID, "status": "passed"}
        with pytest.raises(UnsafeArchive):
            fetch_run(agent, find_task(kernels, TASK), state, agent.host.name, buffer.getvalue())
    assert not (kernels / TASK / "results" / agent.host.name / RUN_ID).exists()
    assert not (kernels / "outside.txt").exists() and not (kernels / TASK / "outside.txt").exists()


def test_fetch_refuses_a_run_id_the_host_made_up(agent, kernels):
    with pytest.raises(FetchRefused, match="invalid run id '../x'"):
        fetch_results(agent, TASK, "../x", kernels, agent.host.name)


def test_fetch_takes_only_the_summary_its_runner_recorded(agent, kernels):
    """The runner seals results.json's sha256 with the host's key (records.py): a summary rewritten afterwards is
    refused by the host before it is sent, and nothing lands."""
    run_dir = finished_run(agent)
    sealed = hashlib.sha256(b'{"headline": 2.0}').hexdigest()
    (run_dir / "summary" / "results.json").write_text('{"headline": 3.2}')
    with pytest.raises(FetchRefused, match=f"but its runner sealed {sealed}; its summary is not sent"):
        fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)
    assert not (kernels / TASK / "results" / agent.host.name / RUN_ID).exists()
    (run_dir / "summary" / "results.json").write_text('{"headline": 2.0}')
    assert fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)[0].outcome == "fetched"


FORGED = b'{"headline": 9.9}'


def forge_state(run_dir: Path, **fields: object) -> None:
    """A later process of the same user rewrites state.json (a None drops the field)."""
    state = {**json.loads((run_dir / "state.json").read_text()), **fields}
    (run_dir / "state.json").write_text(json.dumps({k: v for k, v in state.items() if v is not None}))


@pytest.mark.parametrize("attack, refusal", [
    ("hash deleted", "its runner recorded no summary hash"),
    ("hash and MAC deleted", "its runner recorded no summary hash"),
    ("hash rewritten", "the summary MAC in its state.json does not verify with this host's key"),
    ("another run's seal", "the summary MAC in its state.json does not verify with this host's key"),
    ("index line dropped", "has no line for it"),
])
def test_a_forged_summary_is_refused_whatever_the_state_says(agent, kernels, attack, refusal):
    """Issue 43: on main, deleting summary_sha256 from state.json made a forged results.json "an old run", fetched as
    it was; rewriting the hash beside it was taken too. Now the host's sealed record must vouch for it."""
    run_dir = finished_run(agent)
    other = finished_run(agent, "20260101-130000-bbbbbb", **{"results.json": FORGED})
    (run_dir / "summary" / "results.json").write_bytes(FORGED)
    forged_sha = hashlib.sha256(FORGED).hexdigest()
    if attack == "hash deleted":
        forge_state(run_dir, summary_sha256=None)
    elif attack == "hash and MAC deleted":
        forge_state(run_dir, summary_sha256=None, summary_mac=None)
    elif attack == "hash rewritten":
        forge_state(run_dir, summary_sha256=forged_sha)
    elif attack == "another run's seal":  # a MAC the host made, for another run with these very bytes
        forge_state(run_dir, **{k: json.loads((other / "state.json").read_text())[k]
                                for k in ("summary_sha256", "summary_mac")})
    else:
        index = Path(agent.host.remote_root) / "index" / f"{TASK}.jsonl"
        index.write_text("".join(line + "\n" for line in index.read_text().splitlines() if RUN_ID not in line))
        (run_dir / "summary" / "results.json").write_bytes(b'{"headline": 2.0}')
    with pytest.raises(FetchRefused, match=f"run {RUN_ID}.*{refusal}") as refused:
        fetch_results(agent, TASK, RUN_ID, kernels, agent.host.name)
    assert len(str(refused.value).splitlines()) == 1
    assert not (kernels / TASK / "results" / agent.host.name / RUN_ID).exists()
    assert not (kernels / TASK / "ledger.jsonl").exists()


def test_follow_with_summary_sends_no_summary_its_record_does_not_vouch_for(agent, kernels):
    """inv run's own path: the summary after the follow's end line is checked on the host the same way; the end line
    says why none follows, and the fetch that comes next is refused."""
    run_dir = finished_run(agent)
    (run_dir / "summary" / "results.json").write_bytes(FORGED)
    session = RunSession(agent)
    received: list[bytes] = []
    state = follow_run(session, TASK, RUN_ID, lambda event: None, summary_sink=received.append)
    assert state["status"] == "passed" and received == []
    with pytest.raises(FetchRefused, match=f"run {RUN_ID} of {TASK}: its summary/results.json has sha256"):
        fetch_run(agent, find_task(kernels, TASK), state, agent.host.name)


def test_logs_json_without_follow_of_a_running_run_ends_with_an_end_that_says_it_goes_on(agent, kernels, gpus,
                                                                                        standin_runs, monkeypatch):
    import kpremote.runs.placement as placement
    from kpremote.runs.eventstream import EventStream

    monkeypatch.setattr(placement, "open_session", lambda host: RunSession(agent))
    standin_runs(events=1, hold_s=30)
    run = start_run(RunSession(agent), find_task(kernels, TASK), RunOptions())
    try:
        out = io.StringIO()
        assert placement.show_logs(agent.host, run.run_id, TASK, False, EventStream(out=out))  # not a failure: 0
        end = json.loads(out.getvalue().splitlines()[-1])
        assert (end["event"], end["status"], end["ended"], end["exit_code"]) == ("end", "running", False, None)
    finally:
        cancel_run(RunSession(agent), TASK, run.run_id)
    out = io.StringIO()
    assert not placement.show_logs(agent.host, run.run_id, TASK, False, EventStream(out=out))  # cancelled: not 0
    end = json.loads(out.getvalue().splitlines()[-1])
    assert (end["event"], end["status"], end["ended"]) == ("end", "cancelled", True)
