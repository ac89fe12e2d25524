"""Every bad option value: one line naming it, exit 2, no traceback, and nothing created on any host.

The host is a real sshd host of the rig; "nothing created" means its remote root stays exactly as it was (no agent
shipped, no workspace, no run record). Also: `inv --dry` runs nothing, and the exit codes of Ctrl-C on the
commands that run until interrupted (--watch, logs --follow) and of following a cancelled run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rig import idle_gpu
from test_reliability import SMALL, Workdir, blocked_at_gate
from waiting import processes_mentioning, wait_for


@pytest.fixture(scope="module")
def host(rig):
    return rig.add_host("strict", gpus=[idle_gpu(0)])


@pytest.fixture
def work(tmp_path: Path, rig, host) -> Workdir:
    work = Workdir.make(tmp_path)
    rig.write_hosts_toml(tmp_path / "hosts.toml", [host], local=False)
    return work


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def at_host(work: Workdir, *args: str) -> list[str]:
    return ["--hosts", str(work.path / "hosts.toml"), "--host", "strict", *args]


BAD_RUN_VALUES = [
    (["--mode", "hot"], "--mode 'hot': allowed: cold, graph"),
    (["--workloads", "nope"], "no workload 'nope'"),
    (["--workloads", f"{SMALL},,x"], "--workloads"),
    (["--wait=abc"], "--wait 'abc': give a number of seconds"),
    (["--wait=-1"], "--wait '-1': give a number of seconds >= 0"),
    (["--wait=nan"], "--wait 'nan'"),
    (["--gpu", "first"], "--gpu 'first': give a GPU index"),
    (["--device", "gpu"], "--device 'gpu': allowed: auto, cuda, cpu"),
]


@pytest.mark.parametrize("extra,message", BAD_RUN_VALUES, ids=[" ".join(v[0]) for v in BAD_RUN_VALUES])
def test_a_bad_run_option_is_one_line_exit_2_and_nothing_on_the_host(host, work, extra, message) -> None:
    before = tree(host.root)
    result = work.inv("run", *at_host(work, "--task", "tiny_rmsnorm", *extra))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert tree(host.root) == before


def test_an_empty_task_name_is_refused(host, work) -> None:
    result = work.inv("run", *at_host(work, "--task", "tiny_rmsnorm,"))
    assert result.returncode == 2 and "--task 'tiny_rmsnorm,'" in result.stderr, result.stderr


def test_a_task_toml_the_host_would_refuse_is_refused_here_under_the_users_path(host, work) -> None:
    toml = work.path / "kernels" / "tiny_rmsnorm" / "task.toml"
    toml.write_text(toml.read_text().replace('kind = "triton"', 'kind = "rust"'))
    before = tree(host.root)
    result = work.inv("run", *at_host(work, "--task", "tiny_rmsnorm"))
    assert result.returncode == 2, result.stderr
    assert 'kernels/tiny_rmsnorm/task.toml: [build] kind = "rust"' in result.stderr, result.stderr
    assert not (work.path / "kernels" / "tiny_rmsnorm" / "docs").exists()  # no summary, no run_log line
    assert tree(host.root) == before


BAD_PROFILE_VALUES = [
    (["--calls", "abc"], "--calls 'abc': give a whole number from 1 to 100"),
    (["--calls", "0"], "--calls '0'"),
    (["--warmup=-1"], "--warmup '-1'"),
    (["--warmup", "x"], "--warmup 'x'"),
    (["--workload", "nope"], "no workload 'nope'"),
    (["--wait=soon"], "--wait 'soon'"),
]


@pytest.mark.parametrize("extra,message", BAD_PROFILE_VALUES, ids=[" ".join(v[0]) for v in BAD_PROFILE_VALUES])
def test_a_bad_profile_option_is_one_line_exit_2(host, work, extra, message) -> None:
    before = tree(host.root)
    workload = [] if "--workload" in extra else ["--workload", SMALL]
    result = work.inv("profile", *at_host(work, "--task", "tiny_rmsnorm", *workload, *extra))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert tree(host.root) == before


@pytest.mark.parametrize("value", ["abc", "-1", "0", "0.2"])
def test_watch_below_half_a_second_or_not_a_number_is_refused(host, work, value) -> None:
    result = work.inv("gpu-status", *at_host(work, f"--watch={value}"))
    assert result.returncode == 2, result.stderr
    assert f"--watch {value!r}" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_dry_prints_what_would_run_and_runs_nothing(host, work) -> None:
    before = tree(host.root)
    result = work.inv("--dry", "run", *at_host(work, "--task", "tiny_rmsnorm"))
    assert result.returncode == 0, result.stderr
    assert "dry run, nothing was run: inv run" in result.stderr and "--task tiny_rmsnorm" in result.stderr
    assert tree(host.root) == before


def interrupted(work: Workdir, *args: str, ready) -> subprocess.CompletedProcess:
    client = work.inv_background(*args)
    wait_for(ready, 60, "the command under way")
    time.sleep(0.5)
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=30)
    return subprocess.CompletedProcess(args, client.returncode, out, err)


def test_ctrl_c_on_watch_exits_130(host, work) -> None:
    started = time.monotonic()
    result = interrupted(work, "gpu-status", *at_host(work, "--watch", "0.5"),
                         ready=lambda: time.monotonic() - started > 3)  # a few refreshes in
    assert result.returncode == 130 and "Traceback" not in result.stderr, result.stderr
    assert "nothing was started" not in result.stderr  # it was under way, not still loading
    assert result.stderr.splitlines() == ["stopped watching"], result.stderr  # how a watch stops: no error
    assert "strict" in result.stdout


def test_logs_follow_ctrl_c_is_130_and_following_a_cancelled_run_is_not_0(host, work) -> None:
    work.close_gate()
    try:
        assert work.inv("run", *at_host(work, "--task", "gated", "--workloads", SMALL, "--detach")).returncode == 0
        [run] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "the run in flight")
        follow = interrupted(work, "logs", *at_host(work, "--run", run.name, "--follow"),
                             ready=lambda: processes_mentioning(str(host.root), "follow", run.name))
        assert follow.returncode == 130 and "nothing was started" not in follow.stderr, follow.stderr
        assert "the run goes on" in follow.stderr and "error" not in follow.stderr, follow.stderr
        cancelled = work.inv("cancel", *at_host(work, "--run", run.name))
        assert cancelled.returncode == 0, cancelled.stderr
        after = work.inv("logs", *at_host(work, "--run", run.name, "--follow"))
        assert after.returncode == 1 and f"run {run.name}: cancelled" in after.stdout, after
    finally:
        work.open_gate()


def test_gpu_status_json_idle_means_a_run_would_lease_it_now(host, work) -> None:
    work.close_gate()
    try:
        assert work.inv("run", *at_host(work, "--task", "gated", "--workloads", SMALL, "--detach")).returncode == 0
        [run] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "the run holding the GPU")
        status = work.inv("gpu-status", *at_host(work, "--json"))
        [gpu] = json.loads(status.stdout)["hosts"][0]["gpus"]
        assert gpu["lease"]["run_id"] == run.name
        assert gpu["idle"] is False and gpu["reason"].startswith(f"leased: run {run.name}"), gpu
        work.inv("cancel", *at_host(work, "--run", run.name))
        [gpu] = json.loads(work.inv("gpu-status", *at_host(work, "--json")).stdout)["hosts"][0]["gpus"]
        assert gpu["idle"] is True and gpu["lease"] is None
    finally:
        work.open_gate()
