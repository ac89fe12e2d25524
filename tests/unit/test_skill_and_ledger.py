"""The agent skill's install (where SKILL.md lands, what is refused) and the task ledger (what a line holds, that
concurrent appends keep every line whole, that git and provenance leave it out)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unit.helpers import FILES, write

from kpremote.results import ledger, records
from kpremote.agent.provenance import hash_task
from kpremote.skill import install, skill_text

REPO = Path(__file__).resolve().parents[2]


def front_matter(text: str) -> dict[str, str]:
    head, sep, _ = text.partition("\n---\n")
    assert text.startswith("---\n") and sep, "SKILL.md opens with YAML front matter between --- lines"
    return dict(line.split(": ", 1) for line in head.splitlines()[1:])


def test_the_shipped_skill_has_the_front_matter_agents_load() -> None:
    meta = front_matter(skill_text())
    assert meta["name"] == "kpremote" and len(meta["description"]) > 40
    assert skill_text() == (REPO / "kpremote" / "skill" / "SKILL.md").read_text()


def test_every_run_the_skill_names_by_a_word_is_of_its_task() -> None:
    # `--run latest` without --task is the host's newest run of any task or user: an agent followed another's run
    import re

    named = [line for line in skill_text().splitlines() if re.search(r"--run (latest|ID)\b", line)]
    assert len(named) >= 3
    for line in named:
        assert "--task" in line, line


@pytest.mark.parametrize("target, where", [("claude", ".claude/skills/kpremote"), ("codex", ".agents/skills/kpremote")])
def test_install_for_an_agent_lands_in_its_user_skill_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              target: str, where: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = install(target)
    assert path == tmp_path / where / "SKILL.md" and path.read_text() == skill_text()


def test_install_into_a_folder_makes_it(tmp_path: Path) -> None:
    assert install(str(tmp_path / "a" / "b")).read_text() == skill_text()


def kpremote(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kpremote.program", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_skill_install_from_the_command_line_and_a_bad_target_refused(tmp_path: Path) -> None:
    done = kpremote("skill", "install", "--for", "codex", home=tmp_path)
    assert done.returncode == 0 and (tmp_path / ".agents/skills/kpremote/SKILL.md").is_file(), done.stderr
    a_file = write(tmp_path / "not-a-folder", "x")
    for args in (["--for", str(a_file)], []):
        done = kpremote("skill", "install", *args, home=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "--for" in done.stderr
    assert a_file.read_text() == "x"


RESULTS = {"status": "passed", "exit_code": 0, "smoke": False, "unsandboxed": None,
           "provenance": {"run_id": "20261126-080000-abcdef", "device": "cuda", "gpu": {"name": "NVIDIA H200"},
                          "source": {"solution_sha256": "c" * 64, "baseline_sha256": "b" * 64},
                          "baseline_upstream": {"repo": "https://x/sglang", "ref": "main", "commit": "d" * 40},
                          "harness": {"version": "2.8", "digest": "e" * 64}},
           "rows": [{"workload": "w1", "status": "PASSED", "implausible": None,
                     "verdict": {"speedup": 1.12, "verdict": "FASTER"}},
                    {"workload": "w2", "status": "INCORRECT", "implausible": "below the copy floor", "verdict": None}],
           "headline": {"geomean": 1.12, "low": 1.1, "high": 1.14, "level": 0.95, "n": 1, "of": 1,
                        "verdicts": {"FASTER": 1}, "method": "..."}}


def test_a_ledger_line_says_what_was_measured_and_what_came_out(tmp_path: Path) -> None:
    write(tmp_path / "summary" / "results.json", json.dumps(RESULTS))
    ledger.record_run(tmp_path, tmp_path / "summary", "ion8-h200", 1, ["inv", "run", "--task", "demo"])
    [line] = ledger.read_ledger(tmp_path)
    assert (line["run_id"], line["host"], line["gpu"], line["candidate_sha256"], line["harness"]) == \
        ("20261126-080000-abcdef", "ion8-h200", "NVIDIA H200", "c" * 64, "2.8")
    assert line["baseline_pin"] == {"repo": "https://x/sglang", "ref": "main", "commit": "d" * 40}
    assert line["headline"]["low"] == 1.1 and line["headline"]["high"] == 1.14 and "method" not in line["headline"]
    assert line["rows"]["w1"]["verdict"] == "FASTER" and line["rows"]["w2"]["implausible"] == "below the copy floor"
    assert (line["exit_code"], line["command"]) == (1, "inv run --task demo")
    summary = (tmp_path / "summary" / "results.json").read_bytes()
    assert line["summary_sha256"] == hashlib.sha256(summary).hexdigest() and records.line_verifies(line)


def test_a_ledger_line_verifies_only_as_written_and_the_key_is_private(tmp_path: Path) -> None:
    """Every line kpremote appends carries a MAC over all its other fields (a field added later is covered too); an
    edit of any field, a line of an older kpremote (no mac) or one with a made-up mac does not verify."""
    ledger.append_line(tmp_path / "ledger.jsonl", {"run_id": "r", "headline": {"geomean": 1.1}, "later_field": [1]})
    [line] = ledger.read_ledger(tmp_path)
    assert records.line_verifies(line)
    for edited in ({**line, "headline": {"geomean": 2.5}}, {**line, "later_field": [2]}, {**line, "extra": 1},
                   {k: v for k, v in line.items() if k != "mac"}, {**line, "mac": "0" * 64}):
        assert not records.line_verifies(edited)
    key = records.state_dir() / records.KEY_FILE
    assert len(key.read_bytes()) == 32 and key.stat().st_mode & 0o777 == 0o600


def test_a_key_is_made_once_and_never_replaced(tmp_path: Path) -> None:
    from kpremote.agent.atomicfile import read_or_create_key

    key = read_or_create_key(tmp_path / "keys" / "records.key")
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700
    assert read_or_create_key(tmp_path / "keys" / "records.key") == key and len(key) == 32
    (tmp_path / "keys" / "records.key").write_bytes(b"short")
    with pytest.raises(ValueError, match="holds 5 bytes, not a 32-byte key: move it away"):
        read_or_create_key(tmp_path / "keys" / "records.key")


@pytest.mark.parametrize("argv, typed", [
    (["/x/lib/python3.11/site-packages/invoke/__main__.py", "--search-root", "/r", "run", "--task", "a b"],
     "inv --search-root /r run --task 'a b'"),
    (["/x/.venv/bin/inv", "check", "--task", "t"], "inv check --task t"),
    (["/x/kpremote/program.py", "run", "--task", "t"], "kpremote run --task t"),
    (["/x/.venv/bin/kpremote", "run"], "kpremote run"),
])
def test_the_ledger_records_the_command_as_one_types_it(tmp_path: Path, argv: list[str], typed: str) -> None:
    write(tmp_path / "summary" / "results.json", json.dumps(RESULTS))
    ledger.record_run(tmp_path, tmp_path / "summary", "box", 0, argv)
    assert ledger.read_ledger(tmp_path)[-1]["command"] == typed


APPENDER = """
import sys
from kpremote.results.ledger import append_line
for i in range(int(sys.argv[3])):
    append_line(sys.argv[1], {"writer": sys.argv[2], "i": i, "pad": sys.argv[2] * 300_000})
"""


def test_four_processes_appending_at_once_keep_every_line_whole(tmp_path: Path) -> None:
    path, lines = tmp_path / "ledger.jsonl", 40
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), name, str(lines)], env=env)
               for name in "abcd"]
    assert all(w.wait(timeout=120) == 0 for w in writers)
    seen = [json.loads(line) for line in path.read_text().splitlines()]  # a torn line would not parse
    for name in "abcd":
        assert [e["i"] for e in seen if e["writer"] == name] == list(range(lines))


def test_git_and_provenance_leave_the_ledger_out(tmp_path: Path) -> None:
    for rel, text in FILES.items():
        write(tmp_path / rel, text)
    write(tmp_path / "ledger.jsonl", "{}\n")
    assert "ledger.jsonl" not in hash_task(tmp_path) and "task.toml" in hash_task(tmp_path)
    ignored = subprocess.run(["git", "check-ignore", "-q", "kernels/some_task/ledger.jsonl"], cwd=REPO)
    assert ignored.returncode == 0
    # nor does a quick start's fetch leave an untracked run log in a shipped task (docs/results.md stays tracked)
    logged = subprocess.run(["git", "check-ignore", "-q", "kernels/some_task/docs/run_log.md"], cwd=REPO)
    results = subprocess.run(["git", "check-ignore", "-q", "kernels/some_task/docs/results.md"], cwd=REPO)
    assert logged.returncode == 0 and results.returncode == 1


def test_a_summary_of_another_shape_still_gets_its_ledger_line(tmp_path: Path) -> None:
    """A results.json the ledger cannot read as results (a stand-in's, a foreign one: the follow benchmark's stand-in
    summary says "rows": 200) costs the run nothing: the line is written with what is known, the rest null."""
    from kpremote.results.ledger import read_ledger, record_run

    summary = tmp_path / "runs" / "r1" / "summary"
    summary.mkdir(parents=True)
    (summary / "results.json").write_text('{"smoke": true, "rows": 200, "headline": "x", "provenance": []}')
    entry = record_run(tmp_path, summary, "h", 0, ["inv", "run"])
    assert entry["rows"] == {} and entry["exit_code"] == 0 and entry["run_id"] is None and entry["summary_sha256"]
    assert {k: v for k, v in read_ledger(tmp_path)[-1].items() if k != "mac"} == entry  # the line was written
