"""One provenance for both sides: the client's stamp and the agent's own computation of the same tree agree, and
git state is taken only from a repository that tracks the task folder."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from unit.helpers import TASK, write

from kpremote.agent.provenance import git_state, source_provenance, task_provenance
from kpremote.agent.run.runner import Runner
from kpremote.agent.run.runoptions import Options
from kpremote.runs.fetch import FetchReport, refresh_docs
from kpremote.agent.task.taskspec import load_task
from kpremote.runs.sync import sync_task
from kpremote.task.taskdir import find_task
from kpremote.task.taskscan import scan_task

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


# ---------------------------------------------------------------- the sealed task (issue 43)


def test_a_committed_task_is_its_own_pin_and_every_edit_outside_solution_is_named(kernels):
    from kpremote.agent.provenance import committed_task, compare_to_pin, hash_task

    task = kernels / TASK
    git(kernels.parent, "init", "-q")
    commit_all(kernels.parent)
    source = task_provenance(task)
    assert source["task_pin"] == source["task_digest"] and source["task_changed"] == []
    write(task / "solution" / "kernel.py", "# the candidate may change freely\n")
    write(task / "docs" / "notes.md", "so may notes\n")
    assert compare_to_pin(hash_task(task), committed_task(task)) == []
    write(task / "bench" / "adapter.py", (task / "bench" / "adapter.py").read_text() + "# edited\n")
    write(task / "baseline" / "extra.py", "x = 1\n")
    (task / "task.toml").unlink()
    assert compare_to_pin(hash_task(task), committed_task(task)) == [
        "baseline/extra.py (not committed)", "bench/adapter.py (changed)", "task.toml (missing)"]
    assert task_provenance(task)["task_pin"] == source["task_pin"]  # the pin is HEAD's, whatever the folder holds


def test_the_upstream_files_are_pinned_by_heads_task_toml_and_an_ignore_rule_is_part_of_the_task(kernels):
    from kpremote.agent.provenance import committed_task, compare_to_pin, hash_task

    task = kernels / TASK
    upstream = b"def kernel(): pass\n"
    toml = task / "task.toml"
    toml.write_text(toml.read_text() + f'\n[baseline.sha256]\n"pkg/k.py" = "{hashlib.sha256(upstream).hexdigest()}"\n')
    write(task / "baseline" / ".gitignore", "/upstream/\n")
    git(kernels.parent, "init", "-q")
    commit_all(kernels.parent)
    assert compare_to_pin(hash_task(task), committed_task(task)) == ["baseline/upstream/pkg/k.py (missing)"]
    write(task / "baseline" / "upstream" / "pkg" / "k.py", upstream)  # as materialized from the wheel
    assert compare_to_pin(hash_task(task), committed_task(task)) == []
    write(task / "baseline" / "upstream" / "pkg" / "k.py", upstream + b"# faster\n")
    assert compare_to_pin(hash_task(task), committed_task(task)) == ["baseline/upstream/pkg/k.py (changed)"]
    write(task / "baseline" / "upstream" / "pkg" / "k.py", upstream)
    write(task / ".kpremoteignore", "bench/\n")  # hiding bench/ from the digest is itself an edit
    assert compare_to_pin(hash_task(task), committed_task(task))[0] == ".kpremoteignore (not committed)"


def test_a_task_no_commit_holds_has_no_pin(kernels):
    from kpremote.agent.provenance import committed_task

    assert committed_task(kernels / TASK) is None  # no repository
    git(kernels.parent, "init", "-q")
    assert committed_task(kernels / TASK) is None  # no commit yet
    source = task_provenance(kernels / TASK)
    assert source["task_pin"] is None and source["task_changed"] == [] and source["task_digest"]


def test_the_run_records_what_it_measured_against(kernels, tmp_path):
    from kpremote.agent.provenance import task_pin_record

    task = kernels / TASK
    git(kernels.parent, "init", "-q")
    commit_all(kernels.parent)
    source = task_provenance(task)
    assert task_pin_record(task, source)["state"] == "pinned"
    write(task / "bench" / "workloads.toml", (task / "bench" / "workloads.toml").read_text() + "# rtol edited\n")
    edited = task_pin_record(task, task_provenance(task))
    assert edited["state"] == "edited" and edited["changed"] == ["bench/workloads.toml (changed)"]
    assert edited["pin"] == source["task_pin"] != edited["digest"]
    # a host's copy changed after the client's stamp: the run still measures its own copy against the pin
    assert task_pin_record(task, source)["changed"] == ["the host's copy of the task is not the one its client synced"]
    assert task_pin_record(task, {})["state"] == "unpinned"
