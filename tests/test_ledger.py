"""`inv run` reads the task's ledger (kernels/T/ledger.jsonl) before it spends GPU time: a candidate measured
cleanly on the host already is said and not run again, unless --again. Real `inv` in a subprocess, local host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
from localproject import TASK, kp, make_project
from rig import REPO

from kpremote.agent.harness import HARNESS_VERSION, pinned_inputs
from kpremote.agent.provenance import task_provenance
from kpremote.ledger import append_line, read_ledger

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


def test_a_candidate_measured_on_the_host_already_is_not_run_again_unless_again(tmp_path: Path) -> None:
    project = committed_project(tmp_path / "project")
    task_dir = project / "kernels" / TASK
    append_line(task_dir / "ledger.jsonl", measured_line(task_dir))
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
    assert f"run {EARLIER}; --again" in done.stderr and not (task_dir / "results").exists()

    with (task_dir / "solution" / "kernel.py").open("a") as source:  # another candidate: measured as usual
        source.write("\n# a changed candidate\n")
    done = kp(project, "run", "--host", "local", "--task", TASK, "--json")
    assert json.loads(done.stdout)["runs"][0]["status"] == "passed", done.stderr
    assert len(read_ledger(task_dir)) == 7 and read_ledger(task_dir)[-1]["kind"] == "run"

    append_line(task_dir / "ledger.jsonl", measured_line(task_dir))  # the changed one, as if measured on a GPU
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
