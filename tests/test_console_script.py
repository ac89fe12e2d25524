"""The `kpremote` command: the same tasks as `inv`, from any folder of a project (root found by hosts.toml or
pyproject's [tool.kpremote]), its own --version, and completion of hosts, groups, tasks and run ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kpremote import __version__
from localproject import TASK, kp, make_project
from rig import REPO, run_inv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("console") / "proj")


def kpremote(project: Path, *args: str, cwd: Path, **kwargs):
    return kp(project, *args, cwd=cwd, program="kpremote", **kwargs)


def test_the_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"kpremote": "kpremote.program:main"}
    from kpremote.program import main

    assert callable(main)


def test_version_is_kpremotes(project, tmp_path):
    result = kpremote(project, "--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == f"kpremote {__version__}"


def test_from_a_task_folder_hosts_and_kernels_come_from_the_project_root(project):
    inside = project / "kernels" / TASK / "solution"
    hosts = kpremote(project, "hosts", "--json", cwd=inside)
    assert hosts.returncode == 0, hosts.stderr
    assert [h["name"] for h in json.loads(hosts.stdout)["hosts"]] == ["local", "gone"]
    synced = kpremote(project, "sync", "--host", "local", "--task", TASK, "--json", cwd=inside)
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["task"] == TASK
    made = kpremote(project, "new-task", "second", cwd=inside)
    assert made.returncode == 0, made.stderr
    assert (project / "kernels" / "second" / "task.toml").is_file() and not (inside / "kernels").exists()


def test_a_pyproject_tool_table_marks_the_root_and_can_name_the_files(project, tmp_path):
    other = tmp_path / "other"
    (other / "conf").mkdir(parents=True)
    (other / "conf" / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (other / "pyproject.toml").write_text('[tool.kpremote]\nhosts = "conf/hosts.toml"\n')
    (other / "deep" / "er").mkdir(parents=True)
    result = kpremote(project, "hosts", "--json", cwd=other / "deep" / "er")
    assert result.returncode == 0, result.stderr
    assert [h["name"] for h in json.loads(result.stdout)["hosts"]] == ["box"]


def test_outside_any_project_the_users_hosts_file_is_used(project, tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "kpremote").mkdir(parents=True)
    (home / ".config" / "kpremote" / "hosts.toml").write_text('[hosts.mine]\ntransport = "local"\n')
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    result = kpremote(project, "hosts", "--json", cwd=nowhere, env={"HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert [h["name"] for h in json.loads(result.stdout)["hosts"]] == ["mine"]
    missing = kpremote(project, "hosts", cwd=nowhere, env={"HOME": str(tmp_path)})
    assert missing.returncode == 2 and "no such hosts file" in missing.stderr and "Traceback" not in missing.stderr


def test_completion_offers_hosts_groups_tasks_and_run_ids(project):
    (project / "hosts.toml").write_text((project / "hosts.toml").read_text() + 'groups = ["far"]\n')
    fetched = project / "kernels" / TASK / "results" / "local" / "20261123-101010-abcdef"
    fetched.mkdir(parents=True)
    inside = project / "kernels" / TASK

    def offered(*words: str) -> list[str]:
        result = kpremote(project, "--complete", "--", "kpremote", *words, cwd=inside)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert offered("gpu-status", "--host") == ["local", "gone", "far"]
    assert offered("run", "--host", "lo") == ["local", "gone", "far"]  # the shell keeps those starting with "lo"
    assert TASK in offered("check", "--task")
    assert offered("logs", "--host", "local", "--run")[:2] == ["latest", "20261123-101010-abcdef"]
    assert "gpu-status" in offered("gpu")  # task names: Invoke's own completion


def test_completion_script_and_inv_in_the_repository():
    script = kp(REPO, "--print-completion-script", "bash", program="kpremote", cwd=REPO)
    assert "kpremote --complete" in script.stdout
    listed = run_inv("--list")
    assert listed.returncode == 0 and "gpu-status" in listed.stdout
