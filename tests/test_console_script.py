"""The `kpremote` command: the same tasks as `inv`, from any folder of a project (root found by hosts.toml or
pyproject's [tool.kpremote]), its own --version, and completion of hosts, groups, tasks and run ids."""

from __future__ import annotations

import json
import subprocess
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


PARSE_ERRORS = [
    (["run", "--host", "local"], "error: run: --task VALUE is required (see: {p} --help run)"),
    (["run", "--host", "local", "--task", TASK, "--bogus"], "error: run: unknown option --bogus"),
    (["run", "--host", "local", "--task", TASK, "--hots", "x"],
     "error: run: unknown option --hots — did you mean --hosts? (see: {p} --help run)"),
    (["run", "--host", "local", "--task"], "error: run: --task needs a value (see: {p} --help run)"),
    (["compare", "--task", TASK, "--json", "x"], "error: compare: unexpected 'x': every value follows its option"),
    (["run", "--host", "local", "--taks", TASK],  # a misspelt required option, then its value: the option is named
     "error: run: unknown option --taks — did you mean --task? (see: {p} --help run)"),
    (["run", "--taks"], "error: run: unknown option --taks — did you mean --task?"),
    (["new-task", "--nmae", "x"], "error: new-task: unknown option --nmae — did you mean --name?"),
    (["runn"], "error: unknown command 'runn' — did you mean run? (see: {p} --list)"),
]


@pytest.mark.parametrize("program", ["inv", "kpremote"])
@pytest.mark.parametrize("args, line", PARSE_ERRORS, ids=[" ".join(a) for a, _ in PARSE_ERRORS])
def test_a_command_line_that_cannot_be_parsed_is_one_line_in_kpremotes_words_exit_2(project, program, args, line):
    result = kp(project, *args, program=program)
    assert result.returncode == 2, result.stderr
    [said] = result.stderr.splitlines()
    assert said.startswith(line.format(p=program)), said


@pytest.mark.parametrize("program", ["inv", "kpremote"])
@pytest.mark.parametrize("asked", [["new-task", "--help"], ["new-task", "-h"], ["run", "--host", "x", "--help"]])
def test_help_after_a_command_is_its_help_not_a_value(project, program, asked):
    result = kp(project, *asked, program=program)
    assert result.returncode == 0, result.stderr
    assert f"Usage: {program}" in result.stdout and "Docstring:" in result.stdout
    assert not (project / "kernels" / "--help").exists()


def test_kpremote_help_lists_only_the_core_options_that_mean_something_here(project, tmp_path):
    result = kpremote(project, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--version" in result.stdout and "--print-completion-script" in result.stdout
    assert not any(word in result.stdout for word in ("--pty", "--prompt-for-sudo-password", "--warn-only", "--echo"))


def test_the_users_own_hosts_layer_over_the_projects(project, tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "kpremote").mkdir(parents=True)
    user = home / ".config" / "kpremote" / "hosts.toml"
    user.write_text('[defaults]\nconnect_timeout = 2\n[hosts.mine]\ntransport = "local"\n'
                    '[hosts.gone]\nssh = "me@127.0.0.1:10"\n')
    env = {"HOME": str(home)}
    listed = kpremote(project, "hosts", "--json", cwd=project, env=env)
    assert listed.returncode == 0, listed.stderr
    hosts = {h["name"]: h for h in json.loads(listed.stdout)["hosts"]}
    assert list(hosts) == ["local", "gone", "mine"]  # the project's, then the user's own
    assert hosts["gone"]["address"] == "me@127.0.0.1:10"  # a host of the same name: the user's table, whole
    alone = kpremote(project, "hosts", "--json", "--hosts", str(project / "hosts.toml"), cwd=project, env=env)
    assert [h["name"] for h in json.loads(alone.stdout)["hosts"]] == ["local", "gone"]  # --hosts FILE: that file only
    user.write_text('[hosts.mine]\ntransport = "locl"\n')
    broken = kpremote(project, "hosts", cwd=project, env=env)
    assert broken.returncode == 2 and broken.stderr.startswith(f"error: {user}: [hosts.mine] transport"), broken.stderr


def test_where_hosts_come_from_is_said_when_one_is_unknown_or_cannot_be_asked(project, tmp_path):
    env = {"HOME": str(tmp_path)}
    unknown = kpremote(project, "gpu-status", "--host", "mybox", cwd=project, env=env)
    assert unknown.returncode == 2
    assert "unknown host or group 'mybox'" in unknown.stderr
    assert "list your own hosts in ~/.config/kpremote/hosts.toml: it layers over the project's" in unknown.stderr
    everyone = kpremote(project, "status", cwd=project, env=env)
    assert everyone.returncode == 2
    assert (f"hint: 1 of 2 hosts could not be asked; they are those of {project / 'hosts.toml'}: pick one with "
            "--host NAME, or list your own in ~/.config/kpremote/hosts.toml") in everyone.stderr
    picked = kpremote(project, "status", "--host", "gone", cwd=project, env=env)
    assert picked.returncode == 2 and "hint:" not in picked.stderr  # the user chose it: no advice


def test_new_task_outside_any_project_is_refused_and_creates_nothing(project, tmp_path):
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    result = kpremote(project, "new-task", "foo", cwd=nowhere, env={"HOME": str(tmp_path)})
    assert result.returncode == 2 and "is not inside a project" in result.stderr, result.stderr
    assert list(nowhere.iterdir()) == []


def test_a_task_name_as_the_shell_completes_it_names_the_task(project):
    result = kpremote(project, "compare", "--task", f"{TASK}/", cwd=project / "kernels")
    assert "invalid task name" not in result.stderr and "unknown task" not in result.stderr, result.stderr
    assert "no fetched runs of demo" in result.stderr  # the task was found: it has no runs to compare yet


def with_reader_gone(project: Path, *args: str, program: str) -> subprocess.CompletedProcess:
    """`inv ARGS | head -0`, without the race: stdout is a pipe whose reader has already left."""
    import os

    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "PYTHONPATH": str(REPO),
           "KPREMOTE_NVML_FIXTURE": str(project / "nvml.json")}
    env.pop("KPREMOTE_HOSTS", None)
    argv = ([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args] if program == "inv"
            else [sys.executable, "-m", "kpremote.program", *args])
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(argv, cwd=project, env=env, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)


READER_GONE = [("inv", ["--help", "run"], 0), ("kpremote", ["--help"], 0), ("kpremote", ["run", "--help"], 0),
               ("kpremote", ["--print-completion-script", "bash"], 0), ("inv", ["--list"], 0),
               ("inv", ["hosts", "--json"], 141), ("kpremote", ["status", "--host", "local"], 141)]


@pytest.mark.parametrize("program, args, code", READER_GONE, ids=[f"{p} {' '.join(a)}" for p, a, _ in READER_GONE])
def test_a_reader_that_leaves_is_no_traceback(project, program, args, code):
    result = with_reader_gone(project, *args, program=program)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == code, result.stderr


def test_the_small_things_a_newcomer_hit(project, tmp_path):
    # run ids offered after --run are those of the host named before it
    for host, run_id in (("local", "20261124-101010-aaaaaa"), ("elsewhere", "20261125-101010-bbbbbb")):
        (project / "kernels" / TASK / "results" / host / run_id).mkdir(parents=True)
    offered = kpremote(project, "--complete", "--", "kpremote", "logs", "--host", "local", "--run", cwd=project)
    assert "20261124-101010-aaaaaa" in offered.stdout.split() and "20261125-101010-bbbbbb" not in offered.stdout
    # --task as bash completes it from the project's root
    typed = kpremote(project, "compare", "--task", f"kernels/{TASK}/", cwd=project)
    assert "invalid task name" not in typed.stderr and "unknown task" not in typed.stderr, typed.stderr
    # `skill install --for` a word that is no agent: refused, not a folder made under that name
    home = {"HOME": str(tmp_path)}
    typo = kpremote(project, "skill", "install", "--for", "claudee", cwd=tmp_path, env=home)
    assert typo.returncode == 2 and "did you mean claude?" in typo.stderr and not (tmp_path / "claudee").exists()
    helped = kpremote(project, "skill", "--help", cwd=tmp_path, env=home)
    assert helped.returncode == 0 and "skill-install" in helped.stdout, helped.stderr
    # new-task's folder has a folder's usual mode, not mkdtemp's 0700
    made = kpremote(project, "new-task", "moded", cwd=project)
    assert made.returncode == 0, made.stderr
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert (project / "kernels" / "moded").stat().st_mode & 0o777 == 0o777 & ~umask
