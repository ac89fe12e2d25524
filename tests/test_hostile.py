"""Hostile input: task files fuzzed through the agent's validator, shell words through the real `inv` command line.

Elsewhere: hosts.toml fuzz (test_config.py), hostile summary archives (test_fetch.py), links in a task folder
(test_sync.py), hostile words over SSH and docker (test_transport.py), unknown or changed host keys
(test_transport.py). docs/reliability.md lists them all.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kpremote.agent.task.taskspec import TaskSpec, TaskSpecError, load_task
from rig import REPO, Rig, SshHost, idle_gpu

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
VALID_TASK = tomllib.loads((TINY / "task.toml").read_text())
VALID_WORKLOADS = tomllib.loads((TINY / "bench" / "workloads.toml").read_text())


# ------------------------------------------------------------------------------------------ TOML, written here


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (dt.date, dt.time)):  # a datetime is a date too
        return value.isoformat()
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(data: dict[str, Any]) -> str:
    """Top-level scalars first, then one [table] per dict and one [[table]] per list of dicts."""
    lines = [f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in data.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v))]
    for key, value in data.items():
        tables = [value] if isinstance(value, dict) else value if isinstance(value, list) and value and all(
            isinstance(x, dict) for x in value) else []
        for table in tables:
            header = json.dumps(key, ensure_ascii=False)
            lines.append(f"[{header}]" if isinstance(value, dict) else f"[[{header}]]")
            lines += [f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


scalars = st.one_of(
    st.integers(), st.integers(min_value=2**1024), st.floats(), st.booleans(), st.text(max_size=12),
    st.sampled_from(["", " ", "..", "/etc/passwd", "x;touch CANARY", "cuda", "triton", "h200", "cold", "graph",
                     "tiny_rmsnorm", "kernel", "kernel.cu"]),
    st.datetimes(), st.dates(), st.times(),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)
keys_of_task = sorted({key for table in VALID_TASK.values() for key in table} | {"candidate_flags", "sources"})


@st.composite
def mutated(draw, valid: dict[str, Any], keys: list[str], extra_tables: list[str]) -> dict[str, Any]:
    """The valid document with a few keys set, dropped or added (now and then a whole table): most examples
    get past the table checks into the field checks."""
    data = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        table = draw(st.sampled_from(sorted(data) * 4 + extra_tables))
        action = draw(st.sampled_from(["set"] * 6 + ["drop key", "drop key", "replace table", "drop table"]))
        if action == "replace table":
            data[table] = draw(values)
        elif action == "drop table":
            data.pop(table, None)
        else:
            target = data.setdefault(table, {})
            rows = [row for row in (target if isinstance(target, list) else [target]) if isinstance(row, dict)]
            for row in rows[: draw(st.integers(1, 3))]:
                key = draw(st.sampled_from(keys) | st.text(max_size=6))
                if action == "drop key":
                    row.pop(key, None)
                else:
                    row[key] = draw(scalars | values)
    return data


def fuzz_folder(tmp_path: Path) -> Path:
    task = tmp_path / "tiny_rmsnorm"
    if not task.exists():
        shutil.copytree(TINY, task)
    return task


def assert_clean(task: Path) -> None:
    try:
        spec = load_task(task)
    except TaskSpecError as exc:
        message = str(exc)
        where = message.split(": ", 1)[0]
        assert where.endswith(("task.toml", "workloads.toml")), message  # names the file ...
        assert len(message.splitlines()) == 1, message                  # ... in one line
    else:
        assert isinstance(spec, TaskSpec) and spec.workloads


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=mutated(VALID_TASK, keys_of_task, ["timing", "candidate", "junk"]))
def test_a_fuzzed_task_toml_is_a_clean_task_spec_error_or_a_task(tmp_path, data):
    task = fuzz_folder(tmp_path)
    (task / "task.toml").write_text(toml_document(data))
    assert_clean(task)


@SETTINGS
@given(data=mutated(VALID_WORKLOADS, ["id", "production", "shape", "atol", "rtol", "dtype", "preset"], ["junk"]))
def test_a_fuzzed_workloads_toml_is_a_clean_task_spec_error_or_a_task(tmp_path, data):
    task = fuzz_folder(tmp_path)
    (task / "bench" / "workloads.toml").write_text(toml_document(data))
    assert_clean(task)


@SETTINGS
@given(file=st.sampled_from(["task.toml", "bench/workloads.toml"]), cut=st.integers(0, 400),
       length=st.integers(0, 40), junk=st.text(max_size=20).map(str.encode) | st.binary(max_size=20))
def test_a_task_file_with_garbage_spliced_in_is_a_clean_task_spec_error_or_a_task(tmp_path, file, cut, length, junk):
    task = fuzz_folder(tmp_path)
    data = (TINY / file).read_bytes()
    (task / file).write_bytes(data[:cut] + junk + data[cut + length:])
    try:
        assert_clean(task)
    finally:
        (task / file).write_bytes(data)


HUGE = "1" + "0" * 400  # TOML integers have no size limit in tomllib; no float holds this one


@pytest.mark.parametrize("file, line, complaint", [
    ("task.toml", "min_time_s = nan", "min_time_s = nan — allowed: a number > 0"),
    ("task.toml", "max_time_s = inf", "max_time_s = inf — allowed: a number > 0"),
    ("task.toml", f"warmup_s = {HUGE}", "warmup_s = 1000+ — allowed: a number > 0"),
    ("bench/workloads.toml", "atol = nan", r"\(grid_r1_c33\) atol = nan — allowed: a number >= 0"),
    ("bench/workloads.toml", "rtol = inf", r"\(grid_r1_c33\) rtol = inf — allowed: a number >= 0"),
    ("bench/workloads.toml", f"atol = {HUGE}", r"\(grid_r1_c33\) atol = 1000+ — allowed: a number >= 0"),
])
def test_numbers_no_float_can_hold_are_refused_not_crashed_on(tmp_path, file, line, complaint):
    """Found by the fuzz above: nan and inf slipped through as timing settings and tolerances (inf: any output
    passes the correctness gate), and a huge integer tolerance crashed the loader with OverflowError."""
    task = fuzz_folder(tmp_path)
    (task / file).write_text((TINY / file).read_text() + line + "\n")
    with pytest.raises(TaskSpecError, match=complaint):
        load_task(task)


@pytest.mark.parametrize("line", ['"x\\nerror: all good" = 1', '"\\u001b[2J" = 1', '"x\\u0085y" = 1'])
def test_a_key_holding_a_newline_or_an_escape_is_quoted_in_a_one_line_message(tmp_path, line):
    """Found by the fuzz above: such a key went into the message as is, breaking it over lines (or the terminal)."""
    task = fuzz_folder(tmp_path)
    (task / "task.toml").write_text((TINY / "task.toml").read_text() + line + "\n")
    with pytest.raises(TaskSpecError) as refused:
        load_task(task)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "\x1b" not in message and "unknown key" in message


def test_a_task_file_that_is_not_utf8_is_refused_cleanly(tmp_path):
    """Found by the fuzz above: tomllib's UnicodeDecodeError escaped load_task (the run said "agent error")."""
    task = fuzz_folder(tmp_path)
    (task / "task.toml").write_bytes(b"\x80" + (TINY / "task.toml").read_bytes())
    with pytest.raises(TaskSpecError, match=r"task.toml: not UTF-8 text \(byte 0\), so not TOML"):
        load_task(task)


# ------------------------------------------------------------------------------------------ shell words, real CLI


VALID_TEXT = (TINY / "task.toml").read_bytes()
BROKEN_TASK_FILES = {"not-a-table": b"task = 1\n" + VALID_TEXT[VALID_TEXT.index(b"[baseline]"):],
                     "arch-a-number": None, "not-utf8": b"\x80" + VALID_TEXT}
HOSTILE_NAMES = ["x;touch {canary}", "$(touch {canary})", "`touch {canary}`", "a b", "x\ntouch {canary}",
                 "-rf", "x|touch {canary}&&true"]


@dataclass
class Shell:
    """A workdir with a task folder under every hostile name, one SSH host, and the canary nothing may create."""

    rig: Rig
    base: Path
    host: SshHost
    hosts: Path

    @property
    def canary(self) -> Path:
        return self.base / "CANARY"

    def hostile(self, name: str) -> str:
        return name.format(canary=self.canary).replace("/", "_")  # a folder name: the canary's path flattened

    def inv(self, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "KPREMOTE_CACHE": str(self.base / ".cache"), "NO_COLOR": "1", "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args], cwd=self.base,
                              env=env, capture_output=True, text=True, timeout=120)

    def assert_nothing_ran(self) -> None:
        assert not self.canary.exists()
        assert not list(self.base.glob("CANARY")) and not list(self.host.home.rglob("CANARY"))


@pytest.fixture(scope="module")
def shell(rig, tmp_path_factory) -> Shell:
    base = tmp_path_factory.mktemp("hostile")
    host = rig.add_host("hostile", gpus=[idle_gpu(0)])
    shell = Shell(rig, base, host, rig.write_hosts_toml(base / "hosts.toml", [host], local=False))
    for name in ["tiny_rmsnorm", *map(shell.hostile, HOSTILE_NAMES)]:
        shutil.copytree(TINY, base / "kernels" / name)
    return shell


@pytest.mark.parametrize("name", HOSTILE_NAMES + ["..", "../tiny_rmsnorm", "tiny_rmsnorm/../tiny_rmsnorm"])
def test_task_names_with_shell_words_are_refused_never_run(shell, name):
    result = shell.inv("run", "--hosts", str(shell.hosts), "--host", "hostile", "--task", shell.hostile(name))
    assert result.returncode == 2, result.stderr
    assert ("invalid task name" in result.stderr or "unknown task" in result.stderr) and "Traceback" not in result.stderr
    arrived = {p.name for p in (shell.host.root / "tasks").glob("*")}
    assert arrived <= {"tiny_rmsnorm", *BROKEN_TASK_FILES}  # only the other tests' own tasks ever reach the host
    shell.assert_nothing_ran()


@pytest.mark.parametrize("entry, complaint", [
    ('[hosts."x;touch {canary}"]\nssh = "root@127.0.0.1"', "host names may use letters"),
    ('[hosts."a\\nb"]\nssh = "root@127.0.0.1"', "host names may use letters"),
    ('[hosts.".."]\nssh = "root@127.0.0.1"', "host names may use letters"),
    ('[hosts.ok]\nssh = "root@127.0.0.1 -oProxyCommand=touch {canary}"', "ssh = "),
    ('[hosts.ok]\nssh = "root@h"\ncontainer = "c;touch {canary}"', "container = "),
    ('[hosts.ok]\nssh = "root@h"\ngroups = ["g$(touch {canary})"]', "groups = "),
    ('[hosts.ok]\nssh = "root@h"\nremote_root = "/tmp/../{canary}"', "must not contain '..'"),
])
def test_hosts_toml_with_shell_words_is_refused_never_run(shell, tmp_path, entry, complaint):
    hosts_toml = tmp_path / "hosts.toml"
    hosts_toml.write_text(entry.format(canary=shell.canary) + "\n")
    result = shell.inv("gpu-status", "--hosts", str(hosts_toml))
    assert result.returncode == 2 and complaint in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    shell.assert_nothing_ran()


def test_words_passed_to_the_host_are_quoted_never_run(shell, tmp_path):
    """python, remote_root, --gpu, --workloads and --run reach the host as single quoted words."""
    canary, host = shell.canary, shell.host
    odd_root = tmp_path / f"root; touch {canary}"
    results = {}
    for key, value in (("python", f"python3; touch {canary}"), ("remote_root", str(odd_root))):
        hosts_toml = shell.rig.write_hosts_toml(tmp_path / f"{key}.toml", [host], local=False,
                                                overrides={"hostile": {key: value}})
        results[key] = shell.inv("gpu-status", "--hosts", str(hosts_toml), "--host", "hostile", "--json")
    on_host = ("--hosts", str(shell.hosts), "--host", "hostile", "--task", "tiny_rmsnorm")
    flags = {
        "--gpu": shell.inv("run", *on_host, "--gpu", f"0;touch {canary}", "--json"),
        "--run": shell.inv("cancel", *on_host, "--run", f"$(touch {canary})"),
        "--workloads": shell.inv("run", *on_host, "--workloads", f"x;touch {canary}", "--json"),
    }

    [python] = json.loads(results["python"].stdout)["hosts"]
    assert not python["ok"] and f"remote python 'python3; touch {canary}' not found" in python["error"]
    [rooted] = json.loads(results["remote_root"].stdout)["hosts"]
    assert rooted["ok"] and (odd_root / "agent").is_dir()  # a folder with that very name: a word, not a command
    # --gpu and --workloads are now refused on the client, before anything connects (tests/test_options.py)
    assert flags["--gpu"].returncode == 2 and f"--gpu '0;touch {canary}'" in flags["--gpu"].stderr
    assert flags["--run"].returncode == 2 and "bad run id" in flags["--run"].stderr
    assert flags["--workloads"].returncode == 2 and f"no workload 'x;touch {canary}'" in flags["--workloads"].stderr
    for result in [*results.values(), *flags.values()]:
        assert "Traceback" not in result.stderr
    shell.assert_nothing_ran()


def test_a_broken_task_toml_reaching_the_host_is_one_clean_line_per_task(shell):
    """The host reads task.toml too (the lease follows [task] arch): a broken one must be refused, not crash start."""
    kernels = shell.base / "kernels"
    for name, text in BROKEN_TASK_FILES.items():
        shutil.copytree(TINY, kernels / name, dirs_exist_ok=True)
        toml = (TINY / "task.toml").read_bytes().replace(b'name = "tiny_rmsnorm"', f'name = "{name}"'.encode())
        (kernels / name / "task.toml").write_bytes(text or toml.replace(b'arch = "any"', b"arch = 3"))
    # The client reads task.toml with the agent's own validator first (kpremote/cli/options.py): refused before the
    # host is contacted, under the user's path. The host's own refusal: tests/agent/test_agent_runs.py.
    for name, complaint in (("not-a-table", "[task] must be a table"), ("arch-a-number", "[task] arch = 3"),
                            ("not-utf8", "not UTF-8 text")):
        result = shell.inv("run", "--hosts", str(shell.hosts), "--host", "hostile", "--task", name, "--json")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"kernels/{name}/task.toml" in result.stderr and complaint in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    shell.assert_nothing_ran()
