"""Rows timed where the model runs them (issue 45 item 1): one real agent run on the CPU over
tests/fixtures/tasks/tiny_context (out = x * scale + shift, plain torch), whose rows name a context in bench/context.py
(a LayerNorm writes x before the kernel, a linear reads out after it). Each such row is timed cold, warm and in its
context, through the same judge, sides, seal and checks; the candidate picks its behaviour by the row's column count.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kpremote.agent.harness.timing import SMOKE_SAMPLES
from kpremote.agent.results import RunResults
from kpremote.agent.task.taskrecords import TaskSpecError
from kpremote.agent.task.taskspec import load_task
from rig import run_inv
from agent.test_runner import copy_fixture, results_of, run_agent

TASK = "tiny_context"


@pytest.fixture(scope="module")
def context_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("context")
    task = copy_fixture(base, TASK)
    run_dir = base / "runs" / "run-1"
    return run_dir, run_agent(task, run_dir)


@pytest.fixture(scope="module")
def rows(context_run: tuple[Path, subprocess.CompletedProcess]) -> dict[str, dict[str, Any]]:
    run_dir, _ = context_run
    return {row["workload"]: row for row in results_of(run_dir)["rows"]}  # the schema and the record, checked


def test_a_row_with_a_context_is_timed_cold_warm_and_in_its_context(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["honest"]
    assert row["status"] == "PASSED" and row["timing"]["mode"] == "smoke", row.get("message")
    regimes = row["regimes"]
    assert regimes["name"] == "ln_linear" and regimes["headline"] == "cold"
    for regime in ("warm", "context"):
        timed = regimes[regime]
        assert timed["timing"]["mode"] == regime
        assert timed["timing"]["baseline"]["n"] == timed["timing"]["candidate"]["n"] == SMOKE_SAMPLES
        assert timed["speedup"] == timed["timing"]["speedup"] > 0
        assert timed["verdict"]["verdict"] is None  # a CPU smoke run says no word on any regime
        assert all(n >= 1 for n in timed["checks"]["checked_samples"].values())  # each side's last sample at least
    assert "regimes" not in rows["alone"]  # a row without a context is timed as every row was


def test_a_context_may_write_an_input_the_call_rewrites_in_place(rows: dict[str, dict[str, Any]]) -> None:
    """An in-place call (the row's `mutates`: x is its result) whose context's before() writes x, as qknorm_rope's
    QKV projection writes the q and k it rotates in place: timed in every regime, its result checked in each."""
    row = rows["inplace"]
    assert row["status"] == "PASSED", row.get("message")
    for regime in ("warm", "context"):
        timed = row["regimes"][regime]
        assert timed["timing"]["baseline"]["n"] == timed["timing"]["candidate"]["n"] == SMOKE_SAMPLES
        assert all(n >= 1 for n in timed["checks"]["checked_samples"].values())


def test_an_in_place_candidate_that_does_less_work_in_its_context_is_incorrect(
        rows: dict[str, dict[str, Any]]) -> None:
    row = rows["inplace_lazy_in_context"]  # half of x rewritten in the context's graph: the rest is what before() wrote
    assert row["status"] == "INCORRECT", row
    assert re.search(r"in the context regime: output 'x'", row["message"]), row["message"]


def test_an_in_place_context_row_is_judged_against_the_baselines_call_without_a_reference(tmp_path: Path) -> None:
    """Without an adapter reference the judge takes the baseline's call on what before() wrote as the expected result:
    the mutated input must hold those values, not its pristine ones, when the baseline runs."""
    task = copy_fixture(tmp_path, TASK)
    adapter = task / "bench" / "adapter.py"
    adapter.write_text(adapter.read_text().replace("def reference(", "def _no_reference("))
    run_dir = tmp_path / "run"
    run_agent(task, run_dir, "--workloads", "inplace,inplace_lazy_in_context")
    rows = {row["workload"]: row for row in results_of(run_dir)["rows"]}
    assert rows["inplace"]["status"] == "PASSED", rows["inplace"].get("message")
    assert rows["inplace_lazy_in_context"]["status"] == "INCORRECT", rows["inplace_lazy_in_context"]


def test_each_regimes_samples_go_to_the_raw_samples_with_their_regime(
        context_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = context_run
    lines = [json.loads(line) for line in (run_dir / "raw" / "samples.jsonl").read_text().splitlines()]
    honest = {(line["regime"], line["side"]) for line in lines if line["workload"] == "honest"}
    assert honest == {(regime, side) for regime in ("cold", "warm", "context") for side in ("baseline", "candidate")}
    assert {line["regime"] for line in lines if line["workload"] == "alone"} == {"cold"}


def test_a_candidate_that_does_less_work_only_in_its_context_is_incorrect(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["lazy_in_context"]  # right alone, cold and warm; half its rows in the context's graph
    assert row["status"] == "INCORRECT" and row["speedup"] is None, row
    # caught on a checked sample, or at the latest on its last one
    assert re.search(r"changed behaviour during timing( \(last sample\))? in the context regime: output 'out'",
                     row["message"]), row["message"]


def test_a_candidate_that_empties_its_contexts_next_op_is_incorrect(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["skips_the_next_op"]  # its kernel is right; in its own process the context's after() does nothing
    assert row["status"] == "INCORRECT", row
    assert "what the context's after() wrote into 'next' in a timed context sample" in row["message"], row["message"]
    assert "never written" in row["message"]  # the judge's poison, left where after() should have written


def test_results_md_shows_each_regime_and_which_regime_the_headline_is(
        context_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = context_run
    markdown = (run_dir / "summary" / "results.md").read_text()
    results = RunResults.from_json(json.loads((run_dir / "summary" / "results.json").read_text()))
    assert results.headline.regime == "cold"
    row = results.by_workload()["honest"]
    for regime in ("cold", "warm", "context"):
        part = row.regime(regime)
        assert f"| `honest` | ln_linear | {regime} | " in markdown and f" | {part.speedup:.3f}× (" in markdown, markdown
    assert "| `alone` | ln_linear |" not in markdown


def test_a_context_the_file_does_not_define_is_one_line_exit_2(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path / "kernels", TASK)
    workloads = task / "bench" / "workloads.toml"
    workloads.write_text(workloads.read_text().replace('context = "ln_linear"', 'context = "ln_lineer"', 1))
    result = run_inv("run", "--task", TASK, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f'error: {TASK}: kernels/{TASK}/bench/workloads.toml: [[workload]] #1 (honest) context = "ln_lineer" — not in '
        f"kernels/{TASK}/bench/context.py's CONTEXTS (did you mean 'ln_linear'?); it has \"ln_linear\", "
        f"\"ln_linear_inplace\""], result.stderr
    assert not (task / "results").exists()  # refused before anything ran


@pytest.mark.parametrize("edit,expected", [
    (("context.py", None), r'#1 \(honest\) context = "ln_linear" — .*bench/context.py is missing'),
    (("workloads.toml", ('context = "ln_linear"', "context = 3")), r"#1 \(honest\) context = 3 — allowed: the name of"),
    (("context.py", ("CONTEXTS = {", "CONTEXTS = dict(")),
     r"context.py:\d+: not valid Python|CONTEXTS must be a dict written out with string keys"),
    (("context.py", ("CONTEXTS = {", "OTHERS = {")), r"bench/context.py: no CONTEXTS at its top level"),
], ids=["missing file", "not a name", "not a dict", "no CONTEXTS"])
def test_a_bad_context_declaration_names_the_file_and_the_row(tmp_path: Path, edit: tuple, expected: str) -> None:
    task = copy_fixture(tmp_path, TASK)
    name, change = edit
    path = task / "bench" / name
    if change is None:
        path.unlink()
    else:
        path.write_text(path.read_text().replace(*change, 1))
    with pytest.raises(TaskSpecError, match=expected):
        load_task(task)


def test_bench_context_py_is_part_of_the_task_digest(tmp_path: Path) -> None:
    """The contexts are the task's, sealed like the adapter (provenance.task_digest), never the contestant's."""
    from kpremote.agent.provenance import hash_task, task_digest

    task = copy_fixture(tmp_path, TASK)
    before = task_digest(hash_task(task))
    context = task / "bench" / "context.py"
    context.write_text(context.read_text() + "\n# edited\n")
    assert task_digest(hash_task(task)) != before


def test_a_context_that_builds_its_own_binary_is_refused(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path, TASK)
    context = task / "bench" / "context.py"
    context.write_text(context.read_text() + "\nfrom torch.utils.cpp_extension import load_inline\n")
    with pytest.raises(TaskSpecError, match=r"bench/context.py:\d+: builds or loads its own binary"):
        load_task(task)

