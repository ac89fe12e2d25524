from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from kpremote.agent import AGENT_HOME, protocol
from kpremote.agent import sync as agent_sync
from kpremote.agent.__main__ import main
from kpremote.agent.lease import holders
from kpremote.agent.procfs import group_members
from kpremote.agent.protocol import is_run_id
from kpremote.agent.run.cancel import cancel
from kpremote.agent.run.follow import follow
from kpremote.agent.run.liveness import status
from kpremote.agent.run.runpaths import new_run
from kpremote.agent.run.runstate import mark_cancel_requested, read_state, update_state
from unit.helpers import FILES, TASK_TOML, write
from waiting import processes_mentioning, wait_for

TASK = "h200_demo__multi_shape"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "kproot"


def write_task(path: Path, arch: str = "any") -> None:
    """A task start accepts (it checks task.toml before any record or lease): the stand-in runner never reads it."""
    for rel, text in FILES.items():
        write(path / rel, text)
    toml = TASK_TOML.format(arch=arch).replace("'demo'", repr(TASK), 1)
    write(path / "task.toml", toml)
    write(path / "bench" / "workloads.toml", "[[workload]]\nid = 'a'\n[[workload]]\nid = 'b'\n")


@pytest.fixture
def workspace(root: Path):
    """A synced task whose stand-in runner follows the plan written here."""
    path = root / "tasks" / TASK / "workspace"
    write_task(path)

    def plan(**behaviour) -> Path:
        (path / "standin.json").write_text(json.dumps(behaviour))
        return path

    plan()
    return plan


@pytest.fixture
def standin_runner(monkeypatch):
    """`start` in this process spawns the stand-in runner (kp_standin_runner.py) for a timing run; in a subprocess,
    `python -m kp_standin_agent` does the same."""
    monkeypatch.setitem(protocol.RUNNERS, protocol.TIMING, "kp_standin_runner")


@pytest.fixture
def started(root, agent_env, python):
    """start(...) through the real CLI in a subprocess; every run group still alive at teardown is killed."""
    pgids = []

    def start(*extra: str, expect_rc: int = 0) -> dict:
        argv = [python, "-m", "kp_standin_agent", "start", "--task", TASK, "--root", str(root)]
        argv += ["--idle", "{}", *extra]
        done = subprocess.run(argv, env=agent_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == expect_rc, done.stderr
        result = json.loads(done.stdout)
        if "run_id" in result:
            pgids.append(read_state(Path(result["run_dir"]))["pgid"])
        return result

    yield start
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_dir_of(root: Path, run_id: str) -> Path:
    return root / "tasks" / TASK / "runs" / run_id


def follow_to_end(root: Path, run_id: str, offset: int = 0) -> list[dict]:
    out = io.BytesIO()
    assert follow(root, TASK, run_id, offset, out=out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_run_ids_sort_by_time_and_never_collide(tmp_path):
    before = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    ids: list[str] = []
    lock = threading.Lock()

    def make(n: int) -> None:
        for _ in range(n):
            run_id, path = new_run(tmp_path / "runs")
            assert path.is_dir()
            with lock:
                ids.append(run_id)

    threads = [threading.Thread(target=make, args=(40,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")

    assert len(set(ids)) == 240 == len(list((tmp_path / "runs").iterdir()))
    assert all(is_run_id(i) and before <= i[:15] <= after for i in ids)


def test_start_then_follow_until_end(root, workspace, started, nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0, memory_used_mib=100), make_gpu(1))
    workspace(events=4, every_s=0.05, hold_s=0.3)

    result = started("--host-alias", "ion8-h200", "--workloads", "a,b", "--mode", "graph")

    run_dir = Path(result["run_dir"])
    assert result["gpu"]["uuid"] == "GPU-00000001-test"
    assert run_dir == run_dir_of(root, result["run_id"])
    state = read_state(run_dir)
    assert state["status"] == "running" and state["device"] == "cpu" and state["host_alias"] == "ion8-h200"
    assert holders(root)["GPU-00000001-test"]["run_id"] == result["run_id"]
    assert holders(root)["GPU-00000001-test"]["pid"] == state["pid"]

    lines = follow_to_end(root, result["run_id"])

    assert [line["n"] for line in lines[:-1]] == [0, 1, 2, 3]
    end = lines[-1]
    assert end["event"] == "end" and end["state"]["status"] == "passed"
    assert end["offset"] == (run_dir / "raw" / "events.jsonl").stat().st_size
    assert follow_to_end(root, result["run_id"], offset=len(json.dumps(lines[0])) + 1)[0]["n"] == 1

    got = json.loads((run_dir / "raw" / "standin.json").read_text())
    assert got["pid"] == state["pid"] == got["pgid"]  # the gate exec'd into the runner: same pid, own group
    assert got["lease_fd_open"] and got["stdin_is_devnull"]
    assert got["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(AGENT_HOME)
    assert got["env"]["KPREMOTE_ROOT"] == str(root) and got["env"]["CUDA_VISIBLE_DEVICES"] is None
    argv = got["argv"]
    assert argv[argv.index("--gpu") + 1] == "GPU-00000001-test"
    # The runner gets the run's own copy of the workspace, taken at the start: another pane's sync of the same task
    # during the run (a different candidate) changes nothing it reads.
    task_copy = run_dir / "task" / TASK
    assert argv[argv.index("--task-dir") + 1] == str(task_copy)
    workspace_file = root / "tasks" / TASK / "workspace" / "standin.json"
    assert (task_copy / "standin.json").read_text() == workspace_file.read_text()
    replacement = workspace_file.with_name("standin.new")
    replacement.write_text('{"events": 99}')
    replacement.replace(workspace_file)  # as a sync installs a file: a new one renamed over the old
    assert (task_copy / "standin.json").read_text() != workspace_file.read_text()
    assert [argv[argv.index(f) + 1] for f in ("--device", "--workloads", "--mode")] == ["cpu", "a,b", "graph"]
    wait_for(lambda: holders(root) == {})  # the lease ends with the runner


def test_start_without_gpus_runs_without_a_lease(root, workspace, started, nvml_fixture):
    nvml_fixture()
    result = started()
    assert result["gpu"] is None
    final = follow_to_end(root, result["run_id"])[-1]["state"]
    assert final["status"] == "passed", (final, (root / "tasks" / TASK / "runs" / result["run_id"] / "raw" / "agent.log").read_text())
    argv = json.loads((Path(result["run_dir"]) / "raw" / "standin.json").read_text())["argv"]
    assert "--lease-fd" not in argv and "--gpu" not in argv


def test_follow_marks_a_runner_that_died_as_failed(root, workspace, started):
    workspace(events=2, die=True)
    result = started()
    lines = follow_to_end(root, result["run_id"])
    assert [line.get("n") for line in lines[:-1]] == [0, 1]
    assert lines[-1]["state"]["status"] == "failed"
    assert lines[-1]["state"]["error"] == "agent process died"
    assert read_state(Path(result["run_dir"]))["status"] == "failed"


def test_cancel_kills_the_whole_process_group_and_frees_the_lease(root, workspace, started, agent_env, python):
    workspace(events=1, grandchild=True, hold_s=60)
    result = started()
    run_dir = Path(result["run_dir"])
    grandchild = int(wait_for(lambda: _read(run_dir / "raw" / "grandchild.pid")))
    pgid = read_state(run_dir)["pgid"]
    assert grandchild in group_members(pgid) and holders(root)

    done = subprocess.run(
        [python, "-m", "kpremote.agent", "cancel", "--task", TASK, "--run", result["run_id"], "--root", str(root)],
        env=agent_env, capture_output=True, text=True, timeout=60,
    )

    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["cancelled"] and answer["state"]["status"] == "cancelled"
    assert group_members(pgid) == []
    assert holders(root) == {}
    assert follow_to_end(root, result["run_id"])[-1]["state"]["status"] == "cancelled"
    assert cancel(root, TASK, result["run_id"])["cancelled"] is False  # already over


def test_cancel_escalates_to_sigkill_when_sigterm_is_ignored(root, workspace, started):
    workspace(events=1, ignore_term=True, hold_s=60)
    result = started()
    run_dir = Path(result["run_dir"])
    wait_for(lambda: (run_dir / "raw" / "events.jsonl").exists())
    pgid = read_state(run_dir)["pgid"]

    t0 = time.monotonic()
    answer = cancel(root, TASK, result["run_id"], grace_s=0.3)

    assert answer["state"]["status"] == "cancelled" and time.monotonic() - t0 < 4
    assert group_members(pgid) == []
    wait_for(lambda: holders(root) == {})


def test_a_run_found_dead_while_a_cancel_stops_it_is_recorded_cancelled_not_failed(root, workspace, started):
    # Two cancels of one run (Ctrl-C tries the run's own connection, then a fresh one) or a follow: the other look
    # may find the runner gone before the cancel writes its record. It must not call that "agent process died".
    workspace(events=1, hold_s=60)
    result = started()
    run_dir = Path(result["run_dir"])
    wait_for(lambda: (run_dir / "raw" / "events.jsonl").exists())
    pgid = read_state(run_dir)["pgid"]
    mark_cancel_requested(run_dir)  # what cancel() does first
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: group_members(pgid) == [])
    final = follow_to_end(root, result["run_id"])[-1]["state"]
    assert final["status"] == "cancelled" and "error" not in final, final
    assert status(root, TASK)["runs"][-1]["status"] == "cancelled"


def test_a_runner_that_dies_with_no_cancel_asked_is_still_failed(root, workspace):
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_dir = root / "tasks" / TASK / "runs" / "20250102-000000-aaaaaa"
    update_state(run_dir, run_id="20250102-000000-aaaaaa", status="running", pid=dead.pid, pgid=dead.pid)
    assert status(root, TASK)["runs"][-1]["error"] == "agent process died"


def test_status_lists_runs_newest_last_and_fixes_up_dead_ones(root, workspace):
    runs = root / "tasks" / TASK / "runs"
    dead = subprocess.Popen(["true"])
    dead.wait()
    update_state(runs / "20250102-000000-aaaaaa", run_id="20250102-000000-aaaaaa", status="running", pid=dead.pid)
    update_state(runs / "20250101-000000-bbbbbb", run_id="20250101-000000-bbbbbb", status="passed")
    update_state(root / "tasks" / "other" / "runs" / "20250103-000000-cccccc", run_id="20250103-000000-cccccc",
                 status="running")  # no pid recorded: nothing to judge it by, left as is

    every = status(root)["runs"]
    assert [r["run_id"][:8] for r in every] == ["20250101", "20250102", "20250103"]
    assert [r["status"] for r in every] == ["passed", "failed", "running"]
    assert [r["run_id"] for r in status(root, TASK)["runs"]] == ["20250101-000000-bbbbbb", "20250102-000000-aaaaaa"]
    assert status(root / "nothing-here")["runs"] == []


def test_start_refuses_when_no_gpu_is_idle_or_the_arch_is_wrong(root, workspace, nvml_fixture, make_gpu, capsys,
                                                                  standin_runner):
    nvml_fixture(make_gpu(0, util_pct=80), make_gpu(1, processes=[{"pid": 5, "name": "python"}]))
    args = ["start", "--task", TASK, "--root", str(root)]

    assert main(args) == 3
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "no_idle_gpu"
    assert "util 80% > 5%" in error["message"] and "1 compute process (pid 5 python)" in error["message"]

    write_task(root / "tasks" / TASK / "workspace", arch="b200")  # the task's arch decides; the GPUs are H200s
    assert main(args) == 4
    assert json.loads(capsys.readouterr().out)["error"] == "arch_mismatch"
    assert list((root / "tasks" / TASK / "runs").iterdir()) == []  # refused runs leave nothing behind


@pytest.mark.parametrize("task", ["..", ".", "a/b", "x;rm", ""])
def test_start_refuses_bad_task_names(root, task, capsys):
    assert main(["start", "--task", task, "--root", str(root)]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "bad_request"


def test_start_needs_a_synced_workspace(root, capsys):
    assert main(["start", "--task", "never_synced", "--root", str(root)]) == 6
    assert "sync it first" in json.loads(capsys.readouterr().out)["message"]


def test_pack_summary_refuses_a_running_run(root, capfdbinary):
    run_dir = root / "tasks" / TASK / "runs" / "20250101-000000-abcdef"
    update_state(run_dir, run_id="20250101-000000-abcdef", status="running")

    assert main(["pack-summary", "--task", TASK, "--run", "20250101-000000-abcdef", "--root", str(root)]) == 5
    captured = capfdbinary.readouterr()
    assert captured.out == b"" and b"not final" in captured.err


def test_pack_summary_emits_only_summary_files(root, workspace, started, agent_env, python):
    result = started()
    follow_to_end(root, result["run_id"])
    done = subprocess.run(
        [python, "-m", "kpremote.agent", "pack-summary", "--task", TASK, "--run", result["run_id"],
         "--root", str(root)],
        env=agent_env, capture_output=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:") as tar:
        members = {m.name: m.type for m in tar.getmembers()}
        assert tar.extractfile("results.json").read() == b'{"headline": 1.0}'
    assert members == {"plots": tarfile.DIRTYPE, "plots/speedup.txt": tarfile.REGTYPE, "results.json": tarfile.REGTYPE}


def test_pack_summary_sends_nothing_its_runners_seal_does_not_vouch_for(root, workspace, started, agent_env, python):
    """The runner sealed results.json (its sha256 and MAC in state.json and ROOT/index/T.jsonl): a rewrite of the file
    and of state.json's hash beside it, by a later process without the host's key, sends nothing (exit 9)."""
    result = started()
    follow_to_end(root, result["run_id"])
    run_dir = Path(result["run_dir"])
    state = json.loads((run_dir / "state.json").read_text())
    assert len(state["summary_mac"]) == 64 and oct((root / "keys" / "records.key").stat().st_mode & 0o777) == "0o600"
    [sealed] = [json.loads(line) for line in (root / "index" / f"{TASK}.jsonl").read_text().splitlines()]
    assert (sealed["run_id"], sealed["summary_mac"]) == (result["run_id"], state["summary_mac"])
    (run_dir / "summary" / "results.json").write_bytes(b'{"headline": 2.5}')
    (run_dir / "state.json").write_text(json.dumps({**state, "summary_sha256": hashlib.sha256(b'{"headline": 2.5}')
                                                    .hexdigest()}))
    done = subprocess.run([python, "-m", "kpremote.agent", "pack-summary", "--task", TASK, "--run", result["run_id"],
                           "--root", str(root)], env=agent_env, capture_output=True, timeout=60)
    assert done.returncode == 9 and done.stdout == b"", done.stderr
    assert done.stderr.decode().strip().splitlines()[-1] == (
        f"kpremote agent pack-summary: run {result['run_id']} of {TASK}: the summary MAC in its state.json does not "
        "verify with this host's key; its summary is not sent")


def test_follow_with_summary_sends_the_summary_tar_after_the_end_line_and_none_when_cancelled(
        root, workspace, started, agent_env, python):
    result = started()
    follow_to_end(root, result["run_id"])
    argv = [python, "-m", "kpremote.agent", "follow", "--task", TASK, "--run", result["run_id"], "--with-summary",
            "--root", str(root)]
    done = subprocess.run(argv, env=agent_env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    end_line, _, tar_bytes = done.stdout[done.stdout.index(b'{"event": "end"'):].partition(b"\n")
    end = json.loads(end_line)
    assert end["event"] == "end" and end["summary"] is True and end["state"]["status"] == "passed"
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        assert sorted(tar.getnames()) == ["plots", "plots/speedup.txt", "results.json"]

    update_state(Path(result["run_dir"]), status="cancelled")
    done = subprocess.run(argv, env=agent_env, capture_output=True, timeout=60)
    end = json.loads(done.stdout.splitlines()[-1])
    assert "summary" not in end and done.stdout.endswith(b"\n")  # nothing after the end line


def test_follow_exits_quietly_when_its_client_goes_away(root, workspace, started, agent_env, python):
    workspace(events=100000, every_s=0.01)
    result = started()
    for quiet in (False, True):
        follower = subprocess.Popen(
            [python, "-m", "kpremote.agent", "follow", "--task", TASK, "--run", result["run_id"], "--root", str(root),
             *(["--from", str(10**9)] if quiet else [])],  # quiet: past the end, so it never writes
            env=agent_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        if not quiet:
            assert json.loads(follower.stdout.readline())["event"] == "tick"
        follower.stdout.close()
        assert follower.wait(timeout=10) == 0
        assert follower.stderr.read() == b""
    cancel(root, TASK, result["run_id"])


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


def test_start_sync_applies_the_stream_first_and_prints_one_object(root, nvml_fixture, monkeypatch, capsys,
                                                                    standin_runner):
    """`start --sync` hands stdin to syncrecv (a stand-in here) before the workspace is even looked at."""
    calls = []

    def fake_sync(sync_root: Path, task: str, stream) -> tuple[dict, int]:
        calls.append((sync_root, task))
        if "--fail" in os.environ.get("KP_TEST_SYNC", ""):
            return {"error": "bad_stream", "message": "truncated"}, 2
        write_task(root / "tasks" / TASK / "workspace")
        (root / "tasks" / TASK / "workspace" / "standin.json").write_text("{}")
        return {"received_files": 1}, 0

    monkeypatch.setattr(agent_sync, "answer_sync_request", fake_sync)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    args = ["start", "--task", TASK, "--sync", "--root", str(root)]

    monkeypatch.setenv("KP_TEST_SYNC", "--fail")
    assert main(args) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "bad_stream"

    monkeypatch.setenv("KP_TEST_SYNC", "")
    assert main(args) == 0
    out = capsys.readouterr().out
    result = json.loads(out)
    assert len(out.splitlines()) == 1 and result["sync"] == {"received_files": 1}
    assert calls[-1] == (root, TASK)
    final = follow_to_end(root, result["run_id"])[-1]["state"]
    assert final["status"] == "passed", (final, (root / "tasks" / TASK / "runs" / result["run_id"] / "raw" / "agent.log").read_text())


# ------------------------------------------------------------------------------------------ refusals and cancels


TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "tiny_rmsnorm"


@pytest.mark.parametrize("extra,toml_edit,expected", [
    (["--mode", "hot"], None, '--mode = "hot" — allowed: "cold", "graph"'),
    (["--workloads", "nope"], None, "kernels/tiny_rmsnorm/bench/workloads.toml: no workload 'nope'"),
    ([], ('kind = "triton"', 'kind = "rust"'), 'kernels/tiny_rmsnorm/task.toml: [build] kind = "rust"'),
])
def test_a_task_the_agent_refuses_leaves_no_run_record_and_names_the_users_path(root, nvml_fixture, capsys, extra,
                                                                               toml_edit, expected):
    import shutil

    workspace = root / "tasks" / "tiny_rmsnorm" / "workspace"
    shutil.copytree(TINY, workspace)
    if toml_edit:
        toml = workspace / "task.toml"
        toml.write_text(toml.read_text().replace(*toml_edit))
    assert main(["start", "--task", "tiny_rmsnorm", "--root", str(root), "--idle", "{}", *extra]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["error"] == "task_refused" and expected in answer["message"], answer
    assert str(root) not in answer["message"]  # the host's copy is not what the user edits
    assert not (root / "tasks" / "tiny_rmsnorm" / "runs").exists()
    assert holders(root) == {}


def test_a_cancel_that_comes_before_its_start_makes_that_start_refuse(root, workspace, nvml_fixture, capsys,
                                                                       standin_runner):
    run_id = "20250101-000000-c0ffee"
    answer = cancel(root, TASK, run_id, pending=True)
    assert answer["cancelled"] and answer["state"]["phase"] == "never started"
    args = ["start", "--task", TASK, "--root", str(root), "--run-id", run_id]
    assert main(args) == 8
    assert json.loads(capsys.readouterr().out)["error"] == "cancelled"
    assert not (root / "tasks" / TASK / "runs" / run_id).exists() and holders(root) == {}
    assert main(args) == 0  # the tombstone is spent: the id can be used again
    capsys.readouterr()


def test_a_waiting_start_is_cancelled_by_cancel_and_never_leases(root, workspace, agent_env, python, nvml_fixture,
                                                                 make_gpu):
    nvml_fixture(make_gpu(0, util_pct=90))  # busy: the start waits
    run_id = "20250101-000000-5ca1ed"
    waiter = subprocess.Popen([python, "-m", "kp_standin_agent", "start", "--task", TASK, "--root", str(root),
                               "--idle", "{}", "--wait", "60", "--progress",
                               "--run-id", run_id], env=agent_env, stdout=subprocess.PIPE, text=True)
    created = json.loads(waiter.stdout.readline())
    assert created == {"event": "created", "run_id": run_id, "run_dir": str(run_dir_of(root, run_id))}
    waiting = json.loads(waiter.stdout.readline())
    assert waiting["event"] == "waiting" and "util 90% > 5%" in waiting["gpus"][0]["why"]
    assert read_state(run_dir_of(root, run_id))["status"] == "waiting"

    answer = cancel(root, TASK, run_id, grace_s=1.0)

    assert answer["cancelled"] and answer["state"]["status"] == "cancelled"
    assert waiter.wait(timeout=5) == 8
    nvml_fixture(make_gpu(0))  # idle again: nothing may take it now, and nothing of the run is left that could
    assert not processes_mentioning(run_id)
    assert holders(root) == {} and read_state(run_dir_of(root, run_id))["status"] == "cancelled"


def test_a_waiting_start_whose_reader_left_ends_itself(root, workspace, agent_env, python, nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0, util_pct=90))
    run_id = "20250101-000000-90a1e0"
    waiter = subprocess.Popen([python, "-m", "kp_standin_agent", "start", "--task", TASK, "--root", str(root),
                               "--idle", "{}", "--wait", "60", "--progress",
                               "--run-id", run_id], env=agent_env, stdout=subprocess.PIPE)
    waiter.stdout.readline()
    waiter.stdout.close()  # the client's channel closes
    assert waiter.wait(timeout=10) == 8
    state = read_state(run_dir_of(root, run_id))
    assert state["status"] == "cancelled" and "client went away" in state["error"]
