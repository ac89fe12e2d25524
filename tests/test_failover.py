"""Failover within a group: a host that cannot take a task (down, or failing before the run starts) is skipped
with a line saying so, and the task goes to the next host; only when no host can take it does the command fail.

Real sshd hosts of the rig; the dead one had its sshd stopped (connection refused), the broken one runs the agent
with a Python that has no torch (its start is refused before any lease).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kpremote.agent.lease import holders
from rig import idle_gpu
from test_reliability import SMALL, Workdir, run_dirs
from waiting import wait_for


@pytest.fixture(scope="module")
def hosts(rig, tmp_path_factory):
    live = rig.add_host("fo-live", gpus=[idle_gpu(0), idle_gpu(1)])
    dead = rig.add_host("fo-dead", gpus=[idle_gpu(0)])
    dead.stop()
    broken = rig.add_host("fo-broken", gpus=[idle_gpu(0)])
    bare = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    return {"live": live, "dead": dead, "broken": broken, "bare_python": str(bare / "bin" / "python")}


@pytest.fixture
def work(tmp_path: Path, rig, hosts) -> Workdir:
    work = Workdir.make(tmp_path)
    rig.write_hosts_toml(
        tmp_path / "hosts.toml", [hosts["dead"], hosts["broken"], hosts["live"]], local=False,
        overrides={"fo-dead": {"groups": ["mix", "gone"]}, "fo-live": {"groups": ["mix"]},
                   "fo-broken": {"groups": ["mix", "gone"], "python": hosts["bare_python"]}})
    return work


def test_a_group_with_a_dead_and_a_broken_host_runs_every_task_on_the_live_one(hosts, work) -> None:
    live = hosts["live"]
    before = {r.name for r in run_dirs(live.root, "tiny_rmsnorm")}
    result = work.inv("run", "--hosts", str(work.path / "hosts.toml"), "--host", "mix",
                      "--task", "tiny_rmsnorm,tiny_rmsnorm,tiny_rmsnorm", "--workloads", SMALL, "--json")
    # Three tasks, two GPUs: the third waits for neither, it finds no idle GPU anywhere and says so.
    outcomes = json.loads(result.stdout)["runs"]
    passed = [o for o in outcomes if o["status"] == "passed"]
    assert len(passed) >= 2 and all(o["host"] == "fo-live" for o in passed), (outcomes, result.stderr)
    assert "fo-dead: unreachable" in result.stderr and "trying the next host" in result.stderr, result.stderr
    assert "fo-broken: could not start the run: torch is not installed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (hosts["broken"].root / "tasks" / "tiny_rmsnorm" / "runs").exists() or \
        run_dirs(hosts["broken"].root, "tiny_rmsnorm") == []  # refused before any record
    assert len({r.name for r in run_dirs(live.root, "tiny_rmsnorm")} - before) == len(passed)
    wait_for(lambda: holders(live.root) == {}, 10, "the live host's leases released")


def test_two_tasks_on_a_group_with_one_dead_host_both_pass(hosts, work) -> None:
    """The issue's case: `--host mix --task foo,foo` with one host refusing connections."""
    result = work.inv("run", "--hosts", str(work.path / "hosts.toml"), "--host", "mix",
                      "--task", "tiny_rmsnorm,tiny_rmsnorm", "--workloads", SMALL, "--json")
    assert result.returncode == 0, result.stderr
    assert [o["status"] for o in json.loads(result.stdout)["runs"]] == ["passed", "passed"]


def test_when_no_host_can_take_the_task_the_command_fails_with_every_reason(hosts, work) -> None:
    result = work.inv("run", "--hosts", str(work.path / "hosts.toml"), "--host", "gone",
                      "--task", "tiny_rmsnorm", "--workloads", SMALL, "--json")
    assert result.returncode == 2, result.stderr
    [outcome] = json.loads(result.stdout)["runs"]
    assert outcome["status"] == "not started" and outcome["error"].startswith("no host could take tiny_rmsnorm: ")
    assert "fo-dead: unreachable" in outcome["error"] and "fo-broken: could not start" in outcome["error"]
