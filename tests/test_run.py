"""`inv run`, `logs`, `status`, `cancel`, `fetch-results` end to end: real SSH hosts, CPU smoke mode, fixture GPUs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rig import REPO, idle_gpu, run_inv
from waiting import processes_mentioning, state_of, wait_for

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
SLOW_CANDIDATE = '''
import time as _time

_fast_rmsnorm = rmsnorm


def rmsnorm(*args, **kwargs):  # a candidate that takes its time: runs stay in flight long enough to act on them
    _time.sleep(float(open(__file__ + ".sleep").read()))
    return _fast_rmsnorm(*args, **kwargs)
'''


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """A checkout-like folder with kernels/ holding the tiny task (and a slow twin), as a user's cwd."""
    kernels = tmp_path / "kernels"
    shutil.copytree(TINY, kernels / "tiny_rmsnorm")
    slow = kernels / "slow_rmsnorm"
    shutil.copytree(TINY, slow)
    (slow / "task.toml").write_text((slow / "task.toml").read_text().replace('name = "tiny_rmsnorm"',
                                                                             'name = "slow_rmsnorm"'))
    with open(slow / "solution" / "kernel.py", "a") as f:
        f.write(SLOW_CANDIDATE)
    (slow / "solution" / "kernel.py.sleep").write_text("30")
    return tmp_path


def inv(workdir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_inv(*args, cwd=workdir, env={"KPREMOTE_CACHE": str(workdir / ".cache")}, **kwargs)


def inv_background(workdir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "KPREMOTE_CACHE": str(workdir / ".cache"), "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=workdir,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def runs_on(host, task: str) -> list[Path]:
    return sorted((host.root / "tasks" / task / "runs").glob("*"))


def test_run_end_to_end_then_a_cheap_repeat(rig, workdir):
    host = rig.add_host("runner-a", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    first = inv(workdir, "run", "--hosts", str(hosts), "--host", "runner-a", "--task", "tiny_rmsnorm", "--json")
    assert first.returncode == 0, first.stderr
    [outcome] = json.loads(first.stdout)["runs"]  # stdout is the JSON document, whole ...
    assert not re.search(r"connecting|syncing|starting", first.stderr), first.stderr  # ... and no phase is said
    assert outcome["status"] == "passed" and outcome["headline"]["label"] == "smoke: timings are not meaningful"
    fetched = workdir / outcome["summary_dir"]
    # a smoke run's summary has no plot (its timings mean nothing), and says so
    assert sorted(p.name for p in fetched.iterdir()) == ["results.json", "results.md", "run_log.md"]
    assert "SMOKE RUN" in (fetched / "results.md").read_text()
    assert "No plot: a smoke run's timings are not meaningful" in (fetched / "results.md").read_text()
    docs = workdir / "kernels" / "tiny_rmsnorm" / "docs"
    assert outcome["run_id"] in (docs / "run_log.md").read_text()
    assert not (docs / "results.md").exists()  # a smoke run never stands in for a task's real results
    remote_run = host.root / "tasks" / "tiny_rmsnorm" / "runs" / outcome["run_id"]
    assert (remote_run / "raw" / "events.jsonl").exists()  # raw stays on the host ...
    assert not list(fetched.rglob("events.jsonl"))         # ... and never travels

    again = inv(workdir, "run", "--hosts", str(hosts), "--host", "runner-a", "--task", "tiny_rmsnorm", "--json")
    assert again.returncode == 0, again.stderr
    [repeat] = json.loads(again.stdout)["runs"]
    assert repeat["channels"] == 2, repeat            # start (with the sync), follow (with the summary after it)
    assert repeat["synced_files"] == 0                 # nothing changed: no file content travelled


def test_a_piped_run_says_each_phase_of_its_start_once(rig, workdir):
    """(With --json it says none: test_run_end_to_end_then_a_cheap_repeat's first run.)"""
    host = rig.add_host("runner-p", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    args = ("run", "--hosts", str(hosts), "--host", "runner-p", "--task", "tiny_rmsnorm", "--workloads", "grid_r1_c33")
    piped = inv(workdir, *args)
    assert piped.returncode == 0, piped.stderr
    said = [line for line in piped.stderr.splitlines() if line.startswith("runner-p: tiny_rmsnorm: ")]
    assert said[0] == "runner-p: tiny_rmsnorm: connecting" and said[2] == "runner-p: tiny_rmsnorm: starting", said
    assert re.fullmatch(r"runner-p: tiny_rmsnorm: syncing \d+ files \([\d.]+ KiB\)", said[1]), said
    assert len(said) == 3 and "connecting" not in piped.stdout  # one plain line a phase, beside the results


def test_a_summary_over_the_hosts_cap_is_refused_and_nothing_is_written(rig, workdir):
    host = rig.add_host("runner-cap", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host], overrides={"runner-cap": {"max_summary_mb": 0.0001}})
    done = inv(workdir, "run", "--hosts", str(hosts), "--host", "runner-cap", "--task", "tiny_rmsnorm", "--json")
    [outcome] = json.loads(done.stdout)["runs"]
    assert done.returncode != 0 and "larger than 0.0001 MB" in outcome["error"], outcome
    assert outcome["summary_dir"] is None and not (workdir / "kernels" / "tiny_rmsnorm" / "results").exists()
    [run_dir] = runs_on(host, "tiny_rmsnorm")
    assert state_of(run_dir)["status"] == "passed"  # the run itself is whole; only the fetch was refused


def test_detached_run_survives_the_client_and_logs_reattach(rig, workdir):
    host = rig.add_host("runner-b", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    (workdir / "kernels" / "slow_rmsnorm" / "solution" / "kernel.py.sleep").write_text("0.5")
    client = inv_background(workdir, "run", "--hosts", str(hosts), "--host", "runner-b", "--task", "slow_rmsnorm")
    run_dir = wait_for(lambda: runs_on(host, "slow_rmsnorm"))[-1]
    wait_for(lambda: (run_dir / "raw" / "events.jsonl").exists())
    client.kill()  # the laptop closes: SIGKILL, no goodbye
    client.wait()
    followed = inv(workdir, "logs", "--hosts", str(hosts), "--host", "runner-b", "--run", run_dir.name, "--follow")
    assert followed.returncode == 0, followed.stderr
    assert f"run {run_dir.name}: passed" in followed.stdout
    status = inv(workdir, "status", "--hosts", str(hosts), "--host", "runner-b", "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    assert [r["status"] for r in answer["runs"] if r["run_id"] == run_dir.name] == ["passed"]
    fetch = inv(workdir, "fetch-results", "--hosts", str(hosts), "--host", "runner-b", "--task", "slow_rmsnorm",
                "--run", run_dir.name)
    assert fetch.returncode == 0, fetch.stderr
    assert (workdir / "kernels" / "slow_rmsnorm" / "results" / "runner-b" / run_dir.name / "results.json").exists()


def test_ctrl_c_cancels_the_remote_run_and_frees_the_gpu(rig, workdir):
    host = rig.add_host("runner-c", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    client = inv_background(workdir, "run", "--hosts", str(hosts), "--host", "runner-c", "--task", "slow_rmsnorm")
    run_dir = wait_for(lambda: runs_on(host, "slow_rmsnorm"))[-1]
    wait_for(lambda: state_of(run_dir).get("phase") not in (None, "starting"))
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=60)
    assert client.returncode == 130, err
    assert f"cancelled run {run_dir.name}" in err
    assert state_of(run_dir)["status"] == "cancelled"
    assert wait_for(lambda: not processes_mentioning(run_dir.name), timeout=10)
    probe = inv(workdir, "gpu-status", "--hosts", str(hosts), "--host", "runner-c", "--json")
    [gpu] = json.loads(probe.stdout)["hosts"][0]["gpus"]
    assert gpu["lease"] is None


def test_one_idle_gpu_two_runs_one_fails_clearly(rig, workdir):
    host = rig.add_host("runner-d", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    first = inv(workdir, "run", "--hosts", str(hosts), "--host", "runner-d", "--task", "slow_rmsnorm", "--detach")
    assert first.returncode == 0, first.stderr
    second = inv(workdir, "run", "--hosts", str(hosts), "--host", "runner-d", "--task", "tiny_rmsnorm")
    assert second.returncode == 2
    assert "no idle GPU" in second.stderr and "Traceback" not in second.stderr
    [run_dir] = runs_on(host, "slow_rmsnorm")
    inv(workdir, "cancel", "--hosts", str(hosts), "--host", "runner-d", "--run", run_dir.name)
    assert state_of(run_dir)["status"] == "cancelled"


def test_a_group_takes_two_tasks_in_parallel(rig, workdir):
    one = rig.add_host("pair-1", gpus=[idle_gpu(0)])
    two = rig.add_host("pair-2", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [one, two],
                                 overrides={"pair-1": {"groups": ["pair"]}, "pair-2": {"groups": ["pair"]}})
    (workdir / "kernels" / "slow_rmsnorm" / "solution" / "kernel.py.sleep").write_text("0.2")
    result = inv(workdir, "run", "--hosts", str(hosts), "--host", "pair", "--task", "tiny_rmsnorm,slow_rmsnorm",
                 "--workloads", "grid_r1_c33", "--json")
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)["runs"]
    assert sorted(o["host"] for o in outcomes) == ["pair-1", "pair-2"]
    assert all(o["status"] == "passed" for o in outcomes)


def test_unknown_task_suggests_the_closest(rig, workdir):
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [])
    result = inv(workdir, "run", "--hosts", str(hosts), "--task", "tiny_rmsnrom")
    assert result.returncode == 2
    assert "unknown task 'tiny_rmsnrom'" in result.stderr and "did you mean 'tiny_rmsnorm'" in result.stderr
