"""`inv run --json-stream` and `inv logs --json`: a run's events as JSON lines, each read back and validated against
docs/schemas/run-event.json — real runs over real OpenSSH on loopback (the rig), CPU smoke mode, fixture GPUs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from rig import REPO, idle_gpu, run_inv

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
SCHEMAS = REPO / "docs" / "schemas"
EVENT = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "run-event.json").read_text()))
RUN = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "run.json").read_text()))


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    return make_workdir(tmp_path)


def make_workdir(folder: Path) -> Path:
    shutil.copytree(TINY, folder / "kernels" / "tiny_rmsnorm")
    return folder


def inv(workdir: Path, *args: str):
    return run_inv(*args, cwd=workdir, env={"KPREMOTE_CACHE": str(workdir / ".cache")})


def event_lines(stdout: str) -> list[dict]:
    """Every line of stdout, each one whole JSON object valid against run-event.json."""
    lines = [json.loads(line) for line in stdout.splitlines()]
    for line in lines:
        EVENT.validate(line)
    return lines


def kinds(lines: list[dict]) -> list[str]:
    return [line["event"] for line in lines]


@pytest.fixture(scope="module")
def streamed(rig, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """One `inv run --json-stream` of the tiny task, whole (a run is ~8 CPU-seconds): its workdir, its hosts.toml,
    and what it printed. The stream's tests read it; `inv logs --json` replays it."""
    workdir = make_workdir(tmp_path_factory.mktemp("stream"))
    host = rig.add_host("stream-a", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    return workdir, hosts, inv(workdir, "run", "--hosts", str(hosts), "--host", "stream-a", "--task", "tiny_rmsnorm",
                               "--json-stream")


def test_run_json_stream_says_each_phase_row_and_end_then_the_document(streamed):
    _, _, result = streamed
    assert result.returncode == 0, result.stderr
    *lines, last = result.stdout.splitlines()
    RUN.validate(document := json.loads(last))  # the --json document, unchanged, on the last line
    [outcome] = document["runs"]
    events = event_lines("\n".join(lines))
    assert all(e["schema"] == "kpremote.run-event/1" and e["host"] == "stream-a" and e["task"] == "tiny_rmsnorm"
               for e in events)
    said = kinds(events)
    assert said[:2] == ["connecting", "syncing"] and said[-3:] == ["headline", "done", "end"], said
    assert said.index("created") < said.index("started") < said.index("phase")
    assert {e["run_id"] for e in events[said.index("created"):]} == {outcome["run_id"]}
    workloads = [e for e in events if e["event"] == "phase" and e["phase"] == "workload"]
    rows = [e for e in events if e["event"] == "row"]
    total = workloads[0]["n"]
    assert [(e["i"], e["n"]) for e in workloads] == [(i, total) for i in range(1, total + 1)]
    assert [(r["workload"], r["i"]) for r in rows] == [(w["workload"], w["i"]) for w in workloads]
    assert all(r["status"] == "PASSED" and r["verdict"] is None for r in rows)  # a smoke run's verdict means nothing
    times = [e["t"] for e in events]
    assert times == sorted(times)
    end = events[-1]
    assert (end["status"], end["exit_code"], end["summary_dir"], end["ended"]) == ("passed", 0, outcome["summary_dir"],
                                                                                  True)
    envelope = ("schema", "event", "host", "task", "run_id", "t")
    assert end["headline"] == outcome["headline"] == {k: v for k, v in events[-3].items() if k not in envelope}
    assert not result.stderr.strip(), result.stderr  # nothing of the live view: stdout is the stream alone


def test_logs_json_replays_the_run_to_its_end_and_re_attaches(streamed):
    workdir, hosts, run = streamed
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout.splitlines()[-1])["runs"][0]["run_id"]
    for follow in (["--follow"], []):
        logs = inv(workdir, "logs", "--hosts", str(hosts), "--host", "stream-a", "--run", run_id[-6:], "--json",
                   *follow)
        assert logs.returncode == 0, logs.stderr
        events = event_lines(logs.stdout)
        assert {(e["host"], e["task"], e["run_id"]) for e in events} == {("stream-a", "tiny_rmsnorm", run_id)}
        assert kinds(events)[0] == "phase" and kinds(events)[-2:] == ["done", "end"]
        assert (events[-1]["status"], events[-1]["exit_code"], events[-1]["ended"]) == ("passed", 0, True)
        # the agent's events are the ones inv run streamed, field for field
        agent_said = [e for e in event_lines("\n".join(run.stdout.splitlines()[:-1]))
                      if e["run_id"] == run_id and e["event"] not in ("created", "started", "end")]
        assert events[:-1] == agent_said


def test_a_reader_that_leaves_early_changes_nothing_about_the_run(rig, workdir):
    """`inv run --json-stream | head -1`: the lines stop, the run is still followed, fetched and recorded."""
    host = rig.add_host("stream-c", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    env = {**os.environ, "KPREMOTE_CACHE": str(workdir / ".cache"), "NO_COLOR": "1"}
    client = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "run", "--hosts",
                               str(hosts), "--host", "stream-c", "--task", "tiny_rmsnorm", "--workloads",
                               "grid_r1_c33", "--json-stream"],
                              cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(client.stdout.readline())["event"] == "connecting"
    client.stdout.close()  # the reader goes away
    err = client.stderr.read()
    assert client.wait(timeout=300) == 0, err
    assert "stdout was closed: the event lines stop here" in err and "Traceback" not in err, err
    assert "Exception ignored" not in err, err
    [fetched] = (workdir / "kernels" / "tiny_rmsnorm" / "results" / "stream-c").iterdir()
    assert (fetched / "results.json").is_file()
    [entry] = [json.loads(line) for line in (workdir / "kernels" / "tiny_rmsnorm" / "ledger.jsonl").open()]
    assert (entry["run_id"], entry["status"]) == (fetched.name, "passed")


def test_a_mistyped_event_from_the_host_is_one_line_naming_it_and_exit_2(streamed):
    """An events.jsonl line of another shape (here `"speedup": "fast"`, appended on the host after the run) is read
    with RunEvent.from_json: one line naming the host, run and field, exit 2, no traceback. (Last in this file: it
    spoils the streamed run's events for any test after it.)"""
    import tomllib

    workdir, hosts, run = streamed
    run_id = json.loads(run.stdout.splitlines()[-1])["runs"][0]["run_id"]
    root = Path(tomllib.loads(hosts.read_text())["hosts"]["stream-a"]["remote_root"]).expanduser()
    [events] = list(root.rglob(f"{run_id}/raw/events.jsonl"))
    with events.open("a") as file:
        file.write('{"t": 1.0, "event": "row", "workload": "w", "speedup": "fast"}\n')
    logs = inv(workdir, "logs", "--hosts", str(hosts), "--host", "stream-a", "--run", run_id[-6:], "--json")
    assert logs.returncode == 2, logs.stderr
    assert "Traceback" not in logs.stderr
    said = [line for line in logs.stderr.splitlines() if "malformed" in line]
    assert said == [f"error: stream-a: run {run_id}: a malformed event line from the agent: event.speedup: "
                    f"expected a number or null, got 'fast'"], logs.stderr
