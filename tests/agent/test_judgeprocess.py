"""One judge and its two sides serve a run's rows while they pass clean; any other row ends them.

A real runner on the CPU (tiny_rmsnorm through Triton's interpreter), four rows: two clean ones, one the candidate
gets wrong on purpose, and one more clean one. The rows' records say which processes ran them; the rows' logs
say what each process printed while that row ran.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agent.test_runner import copy_fixture, rows_by_id, run_agent
from kpremote.agent.harness.judgeprocess import keeps_its_judge

WORKLOADS = '''
[defaults]
dtype = "float32"
eps = 1e-6

[[workload]]
id = "first_r4"
production = true
shape = [4, 64]

[[workload]]
id = "second_r3"
production = true
shape = [3, 100]

[[workload]]
id = "wrong_r2"
shape = [2, 40]

[[workload]]
id = "after_r1"
shape = [1, 33]
'''

# Says which process it is and which row it serves; gets the two-row shape wrong.
CANDIDATE = '''
import os
import sys

from .honest import rmsnorm as honest_rmsnorm

_said = set()


def rmsnorm(x, weight, out, eps):
    rows = x.shape[0]
    if rows not in _said:
        _said.add(rows)
        print(f"candidate pid {os.getpid()} serves rows={rows}", file=sys.stderr, flush=True)
    honest_rmsnorm(x, weight, out, eps)
    if rows == 2:
        out.add_(1.0)
'''


@pytest.fixture(scope="module")
def four_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("judgeprocess")
    task = copy_fixture(base)
    (task / "solution" / "kernel.py").rename(task / "solution" / "honest.py")
    (task / "solution" / "kernel.py").write_text(CANDIDATE)
    (task / "bench" / "workloads.toml").write_text(WORKLOADS)
    run_dir = base / "run"
    return run_dir, run_agent(task, run_dir, "--workloads", "first_r4,second_r3,wrong_r2,after_r1")


def test_clean_rows_share_one_judge_and_a_failed_row_ends_it(four_rows: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, done = four_rows
    assert done.returncode == 1, done.stderr  # the wrong row fails the run
    rows = rows_by_id(run_dir)
    assert [rows[r]["status"] for r in ("first_r4", "second_r3", "wrong_r2", "after_r1")] == \
        ["PASSED", "PASSED", "INCORRECT", "PASSED"]
    first, second, wrong, after = (rows[r]["processes"] for r in ("first_r4", "second_r3", "wrong_r2", "after_r1"))
    assert [p["row_of_these"] for p in (first, second, wrong, after)] == [1, 2, 3, 1]
    for key in ("judge", "baseline", "candidate"):
        assert first[key] == second[key] == wrong[key], key  # kept while the rows passed
        assert after[key] != wrong[key], key  # the row after a failed one starts from fresh processes


def test_each_row_has_its_own_log_with_what_its_processes_printed(
    four_rows: tuple[Path, subprocess.CompletedProcess],
) -> None:
    run_dir, _ = four_rows
    logs = {row: (run_dir / "raw" / "workloads" / f"{row}.log").read_text()
            for row in ("first_r4", "second_r3", "wrong_r2", "after_r1")}
    rows = rows_by_id(run_dir)
    for row, log in logs.items():
        shape_rows = rows[row]["params"]["shape"][0]
        # The pid the candidate printed is the one it has in the judge's PID namespace; the record names this host's.
        assert re.search(rf"candidate pid \d+ serves rows={shape_rows}\n", log), (row, log[-2000:])
        others = {r for r in (4, 3, 2, 1) if r != shape_rows}
        assert not any(f"serves rows={r}\n" in log for r in others), (row, log[-2000:])
        assert "sides ready (row " in log


def test_no_process_of_the_run_outlives_it(four_rows: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = four_rows
    pids = {pid for row in rows_by_id(run_dir).values() for key, pid in (row.get("processes") or {}).items()
            if key != "row_of_these"}
    assert len(pids) == 6  # two judges with two sides each
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid)]
    assert alive == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.mark.parametrize(
    ("result", "keeps"),
    [
        ({"status": "PASSED"}, True),
        ({"status": "PASSED", "invalid": "the candidate side started 1 thread(s) during timing"}, False),
        ({"status": "PASSED", "implausible": "candidate: faster than the copy bandwidth"}, False),
        ({"status": "INCORRECT"}, False),
        ({"status": "ERROR"}, False),
        (None, False),
    ],
)
def test_only_a_clean_pass_keeps_the_judge(result: dict | None, keeps: bool) -> None:
    assert keeps_its_judge(result) is keeps
