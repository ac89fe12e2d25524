"""A start says which kind of run it asks for: `--mode` for a timing run, `--profile JSON` for a profile run; the
agent picks the runner from the kind and accepts no other way to choose one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unit.helpers import TASK

from kpremote.agent import protocol
from kpremote.agent.protocol import ExitCode, ProfileRequest
from kpremote.agent.run.runoptions import parse_profile_args
from kpremote.runs.remote import follow_run, start_run
from kpremote.runs.session import RunOptions, RunSession
from kpremote.runs.sync import sync_task
from kpremote.task.taskdir import find_task


def test_a_profile_start_spawns_the_profile_runner_with_the_request_and_records_its_mode(
        agent, kernels, gpus, standin_runs, monkeypatch):
    monkeypatch.setitem(protocol.RUNNERS, protocol.TIMING, "no_such_runner")  # a timing runner would die at once
    monkeypatch.setitem(protocol.RUNNERS, protocol.PROFILE, "kp_standin_runner")
    request = ProfileRequest(side="candidate", calls=2).to_json()
    session = RunSession(agent)
    run = start_run(session, find_task(kernels, TASK), RunOptions(workloads="w1", profile=request))
    final = follow_run(session, TASK, run.run_id, lambda event: None)
    run_dir = Path(agent.host.remote_root) / "tasks" / TASK / "runs" / run.run_id
    argv = json.loads((run_dir / "raw" / "standin.json").read_text())["argv"]
    assert argv[argv.index("--profile") + 1] == request and "--mode" not in argv
    assert final["status"] == "passed" and final["mode"] == protocol.PROFILE_MODE_PREFIX + request


@pytest.mark.parametrize("words", [["--profile", "{}", "--mode", "graph"], ["--runner-module", "kp_standin_runner"]])
def test_a_start_that_names_its_runner_another_way_is_a_usage_error(agent, kernels, gpus, words):
    result = agent.call("start", "--task", TASK, *words)
    assert result.exit_code == ExitCode.BAD_REQUEST
    assert json.loads(result.stdout)["error"] == "usage"


def test_the_profile_runner_reads_its_request_and_refuses_one_it_cannot_read(tmp_path):
    common = ["--task-dir", str(tmp_path), "--run-dir", str(tmp_path / "run"), "--workloads", "w1"]
    request, options = parse_profile_args(["--profile", '{"side": "baseline"}', *common])
    assert request == ProfileRequest(side="baseline") and options.workloads == ["w1"]
    refused, _ = parse_profile_args(["--profile", "profile:{}", *common])
    assert "is not a profile request" in refused


def test_a_profile_request_in_the_mode_is_no_longer_a_profile_but_a_bad_mode(agent, kernels, gpus):
    sync_task(agent, find_task(kernels, TASK))
    refused = agent.call("start", "--task", TASK, "--mode", 'profile:{"side":"both"}')
    assert refused.exit_code == ExitCode.BAD_REQUEST
    answer = json.loads(refused.stdout)
    assert answer["error"] == "task_refused" and "--mode" in answer["message"]
    runs = Path(agent.host.remote_root) / "tasks" / TASK / "runs"
    assert not runs.exists() or not list(runs.iterdir())  # refused before any run record


def test_a_start_checks_the_task_whichever_runner_it_would_spawn(agent, kernels, gpus, standin_runs):
    """The task check has no exception for a stand-in runner: with one configured, a bad task is refused all the
    same, before any run record."""
    sync_task(agent, find_task(kernels, TASK))
    refused = agent.call("start", "--task", TASK, "--workloads", "nope")
    assert refused.exit_code == ExitCode.BAD_REQUEST
    answer = json.loads(refused.stdout)
    assert answer["error"] == "task_refused" and f"kernels/{TASK}/bench/workloads.toml: no workload 'nope'" in \
        answer["message"]
    runs = Path(agent.host.remote_root) / "tasks" / TASK / "runs"
    assert not runs.exists() or not list(runs.iterdir())
