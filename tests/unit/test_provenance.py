"""One provenance for both sides: the client's stamp and the agent's own computation of the same tree agree, and
git state is taken only from a repository that tracks the task folder."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from unit.helpers import TASK, write

from kpremote.agent.provenance import git_state, source_provenance, task_provenance
from kpremote.agent.run.runner import Runner
from kpremote.agent.run.runoptions import Options
from kpremote.fetch import FetchReport, refresh_docs
from kpremote.agent.task.taskspec import load_task
from kpremote.sync import sync_task
from kpremote.taskdir import find_task
from kpremote.taskscan import scan_task

DIGESTS = ("solution_sha256", "baseline_sha256")


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_all(folder: Path) -> str:
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "x")
    return git(folder, "rev-parse", "HEAD")


@pytest.fixture
def awkward_task(kernels: Path) -> Path:
    """Names whose order differs between string and path sorting, caches, an ignore file and a link."""
    task = kernels / TASK
    write(task / "solution" / "a-b" / "x.py", "1")
    write(task / "solution" / "a" / "b.py", "2")
    write(task / "solution" / "__pycache__" / "kernel.cpython-311.pyc", b"\0cache")
    write(task / "solution" / "stale.pyc", b"\0cache")
    write(task / "solution" / "notes.tmp", "ignored")
    write(task / ".kpremoteignore", "*.tmp\n")
    (task / "solution" / "link.py").symlink_to(task / "baseline" / "kernel.py")
    return task


def test_the_clients_stamp_and_the_agents_own_computation_of_the_same_tree_are_equal(agent, kernels, awkward_task):
    client = scan_task(find_task(kernels, TASK)).provenance
    sync_task(agent, find_task(kernels, TASK))
    workspace = Path(agent.host.remote_root) / "tasks" / TASK / "workspace"
    (workspace / ".kpremote" / "provenance.json").unlink()  # as a task that came without a sync
    write(workspace / "solution" / "__pycache__" / "kernel.cpython-311.pyc", b"\0built on the host")
    agent_side = source_provenance(workspace)
    assert agent_side["origin"] == "computed by the agent"
    assert {k: agent_side[k] for k in DIGESTS} == {k: client[k] for k in DIGESTS}
    assert all(len(client[k]) == 64 for k in DIGESTS)


def test_a_recorded_stamp_is_what_the_agent_reports(agent, kernels):
    sync_task(agent, find_task(kernels, TASK))
    workspace = Path(agent.host.remote_root) / "tasks" / TASK / "workspace"
    recorded = source_provenance(workspace)
    assert recorded["origin"] == ".kpremote/provenance.json" and recorded["synced_at"]


def test_a_side_with_no_file_has_no_digest_on_either_side(kernels):
    shutil.rmtree(kernels / TASK / "baseline")
    (kernels / TASK / "baseline").mkdir()
    assert scan_task(find_task(kernels, TASK)).provenance["baseline_sha256"] is None
    assert task_provenance(kernels / TASK)["baseline_sha256"] is None


def test_a_task_folder_in_an_untracked_corner_of_another_repository_gets_no_git_state(tmp_path, kernels):
    project = tmp_path / "project"
    write(project / "README.md", "another project")
    git(project, "init", "-q")
    commit_all(project)
    shutil.copytree(kernels / TASK, project / "scratch" / TASK)
    assert git_state(project / "scratch" / TASK) == {"git_commit": None, "git_dirty": None, "diff_sha256": None}
    assert git_state(project)["git_commit"] is not None  # the project itself is a repository


def test_a_clean_tracked_folder_has_no_diff_and_a_binary_change_changes_the_diff_digest(kernels):
    task = kernels / TASK
    write(task / "solution" / "table.bin", bytes(range(256)))
    git(kernels, "init", "-q")
    head = commit_all(kernels)
    assert git_state(task) == {"git_commit": head, "git_dirty": False, "diff_sha256": None}
    write(task / "solution" / "table.bin", bytes(range(256))[::-1])
    one = git_state(task)
    write(task / "solution" / "table.bin", bytes(range(255)))
    other = git_state(task)
    assert one["git_dirty"] is True and other["git_dirty"] is True
    assert None not in (one["diff_sha256"], other["diff_sha256"]) and one["diff_sha256"] != other["diff_sha256"]


def test_the_sync_stamp_carries_the_same_git_state(agent, kernels):
    git(kernels, "init", "-q")
    head = commit_all(kernels)
    sync_task(agent, find_task(kernels, TASK))
    stamp = json.loads((Path(agent.host.remote_root) / "tasks" / TASK / "workspace" / ".kpremote"
                        / "provenance.json").read_text())
    assert (stamp["git_commit"], stamp["git_dirty"], stamp["diff_sha256"]) == (head, False, None)


def test_the_runner_stamps_the_source_the_client_stamped_and_computes_none_of_its_own(agent, kernels, tmp_path):
    client = scan_task(find_task(kernels, TASK)).provenance
    sync_task(agent, find_task(kernels, TASK))
    workspace = Path(agent.host.remote_root) / "tasks" / TASK / "workspace"
    runner = Runner(Options(task_dir=workspace, run_dir=tmp_path / "run"), [])
    runner.ctx.spec = load_task(workspace)
    stamped = runner._provenance()["source"]
    assert stamped["origin"] == ".kpremote/provenance.json"
    assert {k: stamped[k] for k in DIGESTS} == {k: client[k] for k in DIGESTS}
    (workspace / ".kpremote" / "provenance.json").unlink()  # a task that came without a sync: the same definition
    runner_again = runner._provenance()["source"]
    assert runner_again["origin"] == "computed by the agent"
    assert {k: runner_again[k] for k in DIGESTS} == {k: client[k] for k in DIGESTS}


def test_what_fetch_results_writes_into_a_task_never_makes_the_next_run_dirty(kernels):
    task = kernels / TASK
    write(task / "docs" / "results.md", "# demo: results\n")  # tracked, as in a new task's template
    git(kernels, "init", "-q")
    head = commit_all(kernels)
    summary = write(task / "results" / "unit" / "20260101-000000-aaaa" / "results.md", "| measured |\n").parent
    write(summary / "results.json", json.dumps({"smoke": False}))
    refresh_docs(task, [FetchReport("unit", TASK, summary.name, "passed", "fetched", summary, 2, 20)])
    assert "aaaa" in (task / "docs" / "run_log.md").read_text() and "measured" in (task / "docs" / "results.md").read_text()
    assert git_state(task) == {"git_commit": head, "git_dirty": False, "diff_sha256": None}
    write(task / "docs" / "notes.md", "the user's own words")  # anything else still counts
    assert git_state(task)["git_dirty"] is True
