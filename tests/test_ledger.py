"""`inv run` reads the task's ledger (kernels/T/ledger.jsonl) before it spends GPU time: a candidate measured
cleanly on the host already is said and not run again, unless --again. Real `inv` in a subprocess, local host."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import jsonschema
from localproject import TASK, kp, make_project
from rig import REPO

from kpremote.agent.harness import HARNESS_VERSION, pinned_inputs
from kpremote.agent.provenance import task_provenance
from kpremote.results.ledger import append_line, measured_before, read_ledger

EARLIER = "20261101-120000-abcdef"


def measured_line(task_dir: Path, **changes) -> dict:
    source = task_provenance(task_dir)
    return {"schema": "kpremote.ledger/1", "kind": "run", "run_id": EARLIER, "host": "local", "gpu": "NVIDIA H200",
            "candidate_sha256": source["solution_sha256"], "baseline_sha256": source["baseline_sha256"],
            "harness": HARNESS_VERSION, "pinned": pinned_inputs(task_dir), "smoke": False, "exit_code": 0,
            "task_digest": source["task_digest"], "task_state": "pinned",
            "headline": {"geomean": 1.12, "low": 1.1, "high": 1.14, "n": 1, "of": 1}, **changes}


def committed_project(root: Path) -> Path:
    project = make_project(root)
    (project / ".gitignore").write_text("remote/\nkernels/*/results/\nkernels/*/ledger.jsonl\n.kpremote/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "pinned"]):
        subprocess.run(["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True)
    return project


def fetched_earlier(task_dir: Path, run_id: str = EARLIER) -> str:
    """A GPU run's summary as inv fetch-results leaves it under results/local/RUN/; the sha256 of its results.json."""
    summary = task_dir / "results" / "local" / run_id
    summary.mkdir(parents=True)
    data = json.dumps({"schema": "kpremote.results/1", "status": "passed", "exit_code": 0, "smoke": False,
                       "provenance": {"run_id": run_id}, "rows": [], "headline": {"geomean": 1.12}}).encode()
    (summary / "results.json").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_a_candidate_measured_on_the_host_already_is_not_run_again_unless_again(tmp_path: Path) -> None:
    project = committed_project(tmp_path / "project")
    task_dir = project / "kernels" / TASK
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, summary_sha256=fetched_earlier(task_dir)))
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, kind="profile", run_id="20261101-130000-fedcba"))
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, smoke=True, run_id="20261101-140000-aaaaaa"))
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, harness="2.7", run_id="20261101-150000-bbbbbb"))
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, pinned={"bench_sha256": "another bench"},
                                                         run_id="20261101-160000-cccccc"))
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, task_state="edited", run_id="20261101-170000-dddddd"))
    # a profile or a smoke run timed nothing; another harness or another bench/ measured something else; a TASK
    # EDITED run measured another task even where its files are these again
    done = kp(project, "run", "--host", "local", "--task", TASK, "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    jsonschema.validate(document, json.loads((REPO / "docs" / "schemas" / "run.json").read_text()))
    [outcome] = document["runs"]
    assert (outcome["status"], outcome["run_id"]) == ("already measured", EARLIER)
    assert f"was already measured on local (NVIDIA H200): 1.120x (1.100–1.140)" in done.stderr
    assert f"run {EARLIER}; --again" in done.stderr and "not trusted" not in done.stderr
    assert [p.name for p in (task_dir / "results" / "local").iterdir()] == [EARLIER]

    with (task_dir / "solution" / "kernel.py").open("a") as source:  # another candidate: measured as usual
        source.write("\n# a changed candidate\n")
    done = kp(project, "run", "--host", "local", "--task", TASK, "--json")
    assert json.loads(done.stdout)["runs"][0]["status"] == "passed", done.stderr
    assert len(read_ledger(task_dir)) == 7 and read_ledger(task_dir)[-1]["kind"] == "run"

    again = "20261102-120000-abcdef"  # the changed one, as if measured on a GPU and fetched
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, run_id=again,
                                                         summary_sha256=fetched_earlier(task_dir, again)))
    done = kp(project, "run", "--host", "local", "--task", TASK, "--again", "--json")
    [outcome] = json.loads(done.stdout)["runs"]
    assert outcome["status"] == "passed" and outcome["run_id"] != EARLIER and "already" not in done.stderr


def test_a_task_that_is_not_its_pin_is_never_measured_before(tmp_path: Path) -> None:
    """The ledger's dedupe stands only for the pinned task: an edited task (run with --edited-task) or one that no
    commit holds is measured again, whatever its ledger says."""
    project = committed_project(tmp_path / "project")
    task_dir = project / "kernels" / TASK
    (task_dir / "bench" / "workloads.toml").write_text((task_dir / "bench" / "workloads.toml").read_text() + "#\n")
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir))  # as if this very edited task were pinned
    done = kp(project, "run", "--host", "local", "--task", TASK, "--edited-task", "--json")
    assert json.loads(done.stdout)["runs"][0]["status"] == "passed", done.stderr
    assert "already measured" not in done.stderr


def test_a_ledger_line_that_does_not_verify_is_said_and_the_candidate_measured(tmp_path: Path) -> None:
    """Issue 43: on main, one line written into ledger.jsonl by hand made `inv run` print "already measured ...
    2.500x ... run <id>" for a run that exists nowhere, exit 0, and run nothing. Now only a line whose MAC verifies,
    pointing to a fetched run whose results.json it recorded, counts; one that does not is said on stderr."""
    project = committed_project(tmp_path / "project")
    task_dir = project / "kernels" / TASK
    forged = {**measured_line(task_dir), "headline": {"geomean": 2.5, "low": 2.4, "high": 2.6, "n": 1, "of": 1}}
    with (task_dir / "ledger.jsonl").open("a") as ledger:  # no MAC: not a line kpremote wrote
        ledger.write(json.dumps(forged) + "\n")
    done = kp(project, "run", "--host", "local", "--task", TASK, "--json")
    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)["runs"]
    assert outcome["status"] == "passed" and outcome["run_id"] != EARLIER and "already measured" not in done.stderr
    assert f"the ledger says run {EARLIER} on local measured this candidate, but that line is not trusted " \
           "(its MAC does not verify" in done.stderr

    # a line kpremote signed, but its run's results.json was edited since, or was never fetched: not trusted either
    sha = fetched_earlier(task_dir)
    (task_dir / "results" / "local" / EARLIER / "results.json").write_text('{"headline": {"geomean": 2.5}}')
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, summary_sha256=sha))
    assert measured_before(task_dir, ["local"]) == (None, f"{TASK}: the ledger says run {EARLIER} on local measured "
                                                          "this candidate, but that line is not trusted (record "
                                                          "edited: results.json is not what was fetched); it does "
                                                          "not count as measured")
    nowhere = "20261103-120000-abcdef"
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir, run_id=nowhere, summary_sha256=sha))
    done = kp(project, "run", "--host", "local", "--task", TASK, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["runs"][0]["status"] == "passed", done.stderr
    assert "already measured" not in done.stderr
    assert f"run {nowhere} on local measured this candidate, but that line is not trusted (no fetched " \
           f"results.json at {task_dir / 'results' / 'local' / nowhere / 'results.json'})" in done.stderr


def test_an_inv_check_is_recorded_and_verified_like_a_fetched_run(tmp_path: Path) -> None:
    """inv check appends a signed ledger line with its results.json's sha256: history shows it verified, and once its
    results.json is edited, shows it as such and without its number."""
    project = make_project(tmp_path / "project")
    task_dir = project / "kernels" / TASK
    done = kp(project, "check", "--task", TASK)
    assert done.returncode == 0, done.stderr
    [summary] = (task_dir / "results" / "check").glob("*/summary/results.json")
    [line] = read_ledger(task_dir)
    assert (line["kind"], line["host"], line["run_id"]) == ("check", "check", summary.parent.parent.name)
    assert line["summary_sha256"] == hashlib.sha256(summary.read_bytes()).hexdigest()

    def history() -> dict:
        shown = kp(project, "history", "--task", TASK, "--json")
        assert shown.returncode == 0, shown.stderr
        [entry] = json.loads(shown.stdout)["runs"]
        return entry

    assert history()["record"] is None and history()["geomean"]
    results = json.loads(summary.read_text())
    results["headline"]["geomean"] = 2.5
    summary.write_text(json.dumps(results))
    assert (history()["record"], history()["geomean"]) == ("record edited: results.json is not what was fetched", None)
