"""Issue 43: nothing outside solution/ may shape a verdict unseen. A task is pinned by the project's HEAD commit: a run
or check of a task whose files outside solution/ differ from it is refused before anything is built, naming each
file; --edited-task runs it anyway and every view says TASK EDITED; compare gives no verdict between runs of two
tasks, and the ledger never counts such a run as measured before. Real `inv` commands on the `local` host (CPU smoke
runs), in a project that git tracks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from localproject import TASK, kp, make_project


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                   capture_output=True, check=True)


def document_of(result: subprocess.CompletedProcess, name: str) -> dict:
    document = json.loads(result.stdout)
    assert document["schema"] == f"kpremote.{name}/1", result.stderr
    return document


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_project(tmp_path_factory.mktemp("sealed") / "proj")
    (root / ".gitignore").write_text("remote/\nkernels/*/results/\nkernels/*/ledger.jsonl\n.kpremote/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the task as its author pinned it")
    return root


def task_file(project: Path, rel: str) -> Path:
    return project / "kernels" / TASK / rel


def runs_on_the_host(project: Path) -> list[str]:
    runs = project / "remote" / "tasks" / TASK / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def test_a_pinned_run_says_so_and_an_edited_task_is_refused_before_anything_is_built(project):
    pinned = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--json")
    assert pinned.returncode == 0, pinned.stderr
    outcome = document_of(pinned, "run")["runs"][0]
    results = json.loads((Path(outcome["summary_dir"]) / "results.json").read_text())
    assert results["provenance"]["task_pin"]["state"] == "pinned"
    assert results["provenance"]["task_pin"]["digest"] == results["provenance"]["task_pin"]["pin"]

    adapter = task_file(project, "baseline/kernel.py")
    original = adapter.read_text()
    before = runs_on_the_host(project)
    try:
        adapter.write_text(original + "\n# the baseline, made to do its work twice\n")
        refused = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu")
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"error: {TASK}: the task differs from its pin (the project's HEAD commit): baseline/kernel.py (changed); "
            "commit the change for review, or pass --edited-task to run it anyway (its results then say TASK EDITED "
            "and are never compared with the pinned task's)"]
        assert runs_on_the_host(project) == before  # nothing started, nothing built
        checked = kp(project, "check", "--task", TASK)
        assert checked.returncode == 2 and "baseline/kernel.py (changed)" in checked.stderr
    finally:
        adapter.write_text(original)


def test_an_edited_task_run_on_purpose_says_task_edited_everywhere_and_gets_no_verdict_against_the_pinned(project):
    first = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--json")
    assert first.returncode == 0, first.stderr
    workloads = task_file(project, "bench/workloads.toml")
    original = workloads.read_text()
    try:
        workloads.write_text(original + "\n# tolerances loosened\n")
        edited = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--edited-task", "--json")
        assert edited.returncode == 0, edited.stderr
        summary = Path(document_of(edited, "run")["runs"][0]["summary_dir"])
        pin = json.loads((summary / "results.json").read_text())["provenance"]["task_pin"]
        assert pin["state"] == "edited" and pin["changed"] == ["bench/workloads.toml (changed)"]
        assert "**TASK EDITED**" in (summary / "results.md").read_text()

        compared = document_of(kp(project, "compare", "--task", TASK, "--json"), "compare")
        assert compared["other_tasks"].startswith("the runs measured different tasks")
        assert compared["headline"]["verdict"] is None and all(r["verdict"] is None for r in compared["rows"])
        assert compared["new"]["task_state"] == "edited" and compared["base"]["task_state"] == "pinned"
        view = kp(project, "compare", "--task", TASK)
        assert "TASK EDITED" in view.stdout and "the runs measured different tasks" in view.stdout

        history = kp(project, "history", "--task", TASK, columns=200)
        assert "TASK EDITED" in history.stdout
        ledger = [json.loads(line) for line in task_file(project, "ledger.jsonl").read_text().splitlines()]
        assert ledger[-1]["task_state"] == "edited" and ledger[-1]["task_digest"] == pin["digest"]

        checked = kp(project, "check", "--task", TASK, "--edited-task")
        assert checked.returncode == 0 and "TASK EDITED: bench/workloads.toml (changed)" in checked.stdout
    finally:
        workloads.write_text(original)


def test_a_task_no_commit_holds_runs_and_says_task_unpinned(tmp_path):
    project = make_project(tmp_path / "proj")  # no repository at all
    result = kp(project, "check", "--task", TASK, "--json")
    assert result.returncode == 0, result.stderr
    summary = Path(document_of(result, "check")["summary_dir"])
    assert json.loads((summary / "results.json").read_text())["provenance"]["task_pin"]["state"] == "unpinned"
    assert "**TASK UNPINNED**" in (summary / "results.md").read_text()
