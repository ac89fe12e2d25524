"""Ctrl-C at the terminal, tried for real: whenever it comes, nothing of the run or its waiter stays on the host.

One real OpenSSH host with one fixture GPU, the real `inv` command line, the gated task of test_reliability.py
(its candidate waits at a gate the test holds closed, so a run stays in flight as long as needed). SIGINT goes to
the client alone, at random moments (seeded, the seed is in the test id): connecting, syncing, starting, waiting
for a GPU, following. After each: the client exited 130 within 2 s, no process of kpremote's is alive on the host,
the GPU's lease is free, and every run record there is over.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kpremote.agent.lease import holders
from kpremote.agent.run.runstate import TERMINAL
from rig import idle_gpu
from test_reliability import SMALL, Workdir, blocked_at_gate, run_dirs
from waiting import processes_mentioning, state_of, wait_for

SEED = 1313
MOMENTS = 20
EXIT_WITHIN_S = 2.0


@pytest.fixture(autouse=True, scope="module")
def sigint_as_from_a_terminal():
    """The client starts with SIGINT at its default, as a terminal starts it. A suite run as a background job of a
    non-interactive shell (nohup, `cmd &`) has SIGINT ignored, which every child inherits through exec: the client
    then ignores a press that comes before kpremote installs its handler (seen at 0.142 s: the run went on with
    nobody following it). A handler of ours here instead is reset to the default in each child by exec."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def host(rig):
    return rig.add_host("ctrlc", gpus=[idle_gpu(0)])


@pytest.fixture
def work(tmp_path: Path, rig, host) -> Workdir:
    work = Workdir.make(tmp_path)
    rig.write_hosts_toml(tmp_path / "hosts.toml", [host], local=False)
    work.close_gate()
    yield work
    for run in run_dirs(host.root, "gated"):  # a failed test leaves no blocker for the next one
        if state_of(run).get("status") not in TERMINAL:
            work.inv("cancel", "--hosts", str(tmp_path / "hosts.toml"), "--host", "ctrlc", "--run", run.name)
    work.open_gate()


def inv_args(work: Workdir, *args: str) -> list[str]:
    return ["run", "--hosts", str(work.path / "hosts.toml"), "--host", "ctrlc", "--task", "gated",
            "--workloads", SMALL, *args]


def interrupt(client: subprocess.Popen, presses: int = 1) -> tuple[float, str]:
    """SIGINT the client (presses times, 0.1 s apart); returns how long it took to exit, and its stderr."""
    sent = time.monotonic()
    for press in range(presses):
        if press:
            time.sleep(0.1)
        client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    return time.monotonic() - sent, err


def nothing_left(host, work: Workdir) -> None:
    """No kpremote process on the host (start, waiter, runner, worker, follow), no lease, every record over."""
    wait_for(lambda: not processes_mentioning(str(host.root)), 10, "every kpremote process on the host gone")
    assert holders(host.root) == {}
    for run in run_dirs(host.root, "gated"):
        assert state_of(run).get("status") in TERMINAL, (run.name, state_of(run))


def assert_interrupted(client: subprocess.Popen, took: float, err: str, *, may_precede_kpremote: bool = False) -> bool:
    """The client ended as a Ctrl-C asks; True when it ended before kpremote had taken over SIGINT.

    That early end is allowed only where the press may come first (may_precede_kpremote): a press after kpremote has
    started anything must end in 130, whatever the exit code Python or Invoke would have chosen."""
    print(f"[ctrl-c] exit {client.returncode} after {took:.2f} s")  # pytest -s shows the spread (docs/reliability.md)
    assert took < EXIT_WITHIN_S, f"exit {took:.2f} s after Ctrl-C:\n{err}"
    if may_precede_kpremote and client.returncode in (-signal.SIGINT, 1) and "/kpremote/" not in err \
            and "KeyboardInterrupt" in err:
        # Python and Invoke were still importing (or Python's own site setup: exit 1), kpremote's handler was not
        # installed yet, so Python's default ended the process. Nothing can have been started then
        # (docs/architecture.md): the caller checks that no run came to exist.
        return True
    if may_precede_kpremote and client.returncode == 1 and not err.strip():
        # Invoke's Program.run was loading tasks.py, before kpremote.commands installed its handler: Invoke catches
        # KeyboardInterrupt there and exits 1 without a word (CI saw it at 0.142 s on a loaded 2-core machine).
        # `inv` cannot move that moment earlier; the `kpremote` command does (program.main). The caller checks
        # that no run came to exist.
        return True
    assert client.returncode == 130, err
    assert "Traceback" not in err, err
    return False


@pytest.mark.parametrize("moment", [round(random.Random(SEED + i).uniform(0.0, 3.0), 3) for i in range(MOMENTS)])
def test_ctrl_c_at_any_moment_of_inv_run_leaves_nothing_on_the_host(host, work, moment) -> None:
    before = {run.name for run in run_dirs(host.root, "gated")}
    client = work.inv_background(*inv_args(work))
    time.sleep(moment)
    took, err = interrupt(client)
    before_kpremote = assert_interrupted(client, took, err, may_precede_kpremote=True)
    nothing_left(host, work)
    new = [run for run in run_dirs(host.root, "gated") if run.name not in before]
    assert not (before_kpremote and new), f"a run came to exist though kpremote never took over: {new}"
    for run in new:  # a run that came to exist was cancelled, and the client said its id
        assert state_of(run)["status"] == "cancelled", state_of(run)
        assert run.name in err, err


def test_a_second_ctrl_c_leaves_nothing_behind_either(host, work) -> None:
    client = work.inv_background(*inv_args(work))
    wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "the run in flight")
    took, err = interrupt(client, presses=2)
    assert_interrupted(client, took, err)
    nothing_left(host, work)


def test_ctrl_c_during_wait_stops_the_waiter_and_no_run_starts_later(host, work) -> None:
    """Both the issue's cases: a waiter left behind, and waiters that later started runs nobody asked for."""
    before = {run.name for run in run_dirs(host.root, "gated")}
    assert work.inv(*inv_args(work, "--detach")).returncode == 0
    [blocker] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "the run holding the GPU")
    rng = random.Random(SEED)
    for _ in range(3):
        client = work.inv_background(*inv_args(work, "--wait"))
        waiting = wait_for(lambda: [r for r in run_dirs(host.root, "gated") if state_of(r).get("status") == "waiting"],
                           60, "a waiter on the host")
        time.sleep(rng.uniform(0.0, 1.5))
        took, err = interrupt(client)
        assert_interrupted(client, took, err)
        assert "waiting for a GPU" in err and f"leased: run {blocker.name}" in err, err  # what it waited for
        [waiter] = waiting
        assert waiter.name in err and state_of(waiter)["status"] == "cancelled", err
        wait_for(lambda: not processes_mentioning(str(host.root), "--wait"), 10, "the waiter gone")
        assert list(holders(host.root).values())[0]["run_id"] == blocker.name
    assert work.inv("cancel", "--hosts", str(work.path / "hosts.toml"), "--host", "ctrlc",
                    "--run", blocker.name).returncode == 0
    # A leftover waiter is a process on the host, and so is the run it would start (held at the closed gate): once
    # no kpremote process is left there, nothing can start later, and the records say what did happen.
    nothing_left(host, work)
    later = [r for r in run_dirs(host.root, "gated") if r.name not in before | {blocker.name}]
    assert len(later) == 3 and all(state_of(r)["status"] == "cancelled" and not state_of(r).get("started")
                                   for r in later), [state_of(r) for r in later]


def test_a_waiter_whose_client_vanished_stops_by_itself(host, work) -> None:
    """SIGKILL: the client cannot cancel anything; the waiter notices its closed channel and ends itself."""
    assert work.inv(*inv_args(work, "--detach")).returncode == 0
    [blocker] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "the run holding the GPU")
    client = work.inv_background(*inv_args(work, "--wait"))
    [waiter] = wait_for(lambda: [r for r in run_dirs(host.root, "gated") if state_of(r).get("status") == "waiting"],
                        60, "a waiter on the host")
    client.kill()
    client.communicate()
    wait_for(lambda: state_of(waiter).get("status") == "cancelled", 10, "the waiter ended by itself")
    assert "client went away" in state_of(waiter)["error"]
    wait_for(lambda: not processes_mentioning(str(host.root), "--wait"), 10, "the waiter gone")
    work.inv("cancel", "--hosts", str(work.path / "hosts.toml"), "--host", "ctrlc", "--run", blocker.name)
    nothing_left(host, work)
