"""In-place calls: a row's `mutates` inputs get fresh copies before every call and are judged like outputs.

One real agent run over tests/fixtures/tasks/tiny_inplace (x *= scale in place, plain torch) whose candidate
misbehaves per row; the gate's own handling of Case.mutates and the row key's validation need no process.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from agent.test_runner import copy_fixture, rows_by_id, run_agent
from kpremote.agent.contract import Case
from kpremote.agent.harness.correctness import ERROR, INCORRECT, PASSED
from kpremote.agent.harness.gateinprocess import check_workload
from kpremote.agent.task.taskspec import TaskSpecError, load_workloads


@pytest.fixture(scope="module")
def inplace_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    base = tmp_path_factory.mktemp("inplace")
    task = copy_fixture(base, "tiny_inplace")
    done = run_agent(task, base / "run")
    assert done.returncode == 1, done.stderr[-2000:]  # bad rows fail the run; it still finishes every row
    return rows_by_id(base / "run")


def test_an_honest_in_place_candidate_passes_and_is_timed(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["honest"]
    assert row["status"] == PASSED and row["timing"]["candidate"]["n"] > 0
    assert row["correctness"]["max_abs_err"] == {"x": pytest.approx(0.0, abs=1e-6)}  # x judged like an output
    assert row["checks"]["checked_samples"]["candidate"] >= 1


def test_writing_an_undeclared_input_is_incorrect(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["touches_scale"]
    assert row["status"] == INCORRECT and row["timing"] is None
    assert "candidate modified input 'scale'" in row["message"] and "`mutates`" in row["message"]


def test_a_wrong_in_place_result_is_incorrect(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["off_by_one"]
    assert row["status"] == INCORRECT and row["timing"] is None
    assert "candidate output 'x' is wrong: first mismatch at [0, 0]" in row["message"]


def test_skipping_the_work_once_timed_is_caught_by_the_checked_samples(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["lazy_when_timed"]
    assert row["correctness"]["status"] == PASSED  # it passed the gate...
    assert row["status"] == INCORRECT and "candidate changed behaviour during timing" in row["message"]
    assert "output 'x'" in row["message"] and row["timing"] is None  # ...x was restored, so the skip shows


def test_an_undeclared_in_place_call_is_the_baselines_error(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["undeclared"]  # mutates = []: the in-place baseline breaks "calls write only outputs"
    assert row["status"] == ERROR and "baseline modified input 'x'" in row["message"]


def test_a_mutated_name_that_is_no_input_is_reported_when_the_first_case_is_built(inplace_run: dict[str, dict]) -> None:
    row = inplace_run["unknown_name"]
    assert row["status"] == ERROR and row["correctness"]["seeds_checked"] == 0
    assert "mutates 'y'" in row["message"] and "tensor inputs: x, scale" in row["message"]


# --------------------------------------------------------------------------------------------- the gate itself


def in_place_adapter(candidate, *, declared: tuple[str, ...] = ("x",), reference: bool = False):
    def make_case(workload: dict, *, device: str, seed: int) -> Case:
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed))
        return Case({"x": x, "two": torch.full((5,), 2.0)}, {}, {}, atol=1e-6, rtol=0.0, mutates=declared)

    namespace = types.SimpleNamespace(
        make_case=make_case,
        call_baseline=lambda workload, inputs, outputs: inputs["x"].mul_(inputs["two"]),
        call_candidate=lambda workload, inputs, outputs: candidate(inputs),
    )
    if reference:
        namespace.reference = lambda workload, inputs: {"x": inputs["x"].double() * 2}
    return namespace


@pytest.mark.parametrize("reference", [False, True])
def test_case_mutates_gives_each_side_its_own_fresh_copy(reference: bool) -> None:
    seen = []

    def candidate(inputs: dict) -> None:
        seen.append(inputs["x"].clone())
        inputs["x"].mul_(2)

    verdict = check_workload(in_place_adapter(candidate, reference=reference), {"id": "w"}, device="cpu", seeds=2)
    assert verdict.status == PASSED and verdict.max_abs_err == {"x": 0.0}
    pristine = [torch.randn(3, 5, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(seen, pristine))  # not the baseline's doubled x


def test_a_rebound_instead_of_rewritten_input_is_incorrect() -> None:
    def rebinds(inputs: dict) -> None:
        inputs["x"] = inputs["x"] * 2  # the right values, but not in the caller's tensor

    verdict = check_workload(in_place_adapter(rebinds), {"id": "w"}, device="cpu", seeds=1)
    assert verdict.status == INCORRECT and "output 'x' is wrong" in verdict.message


def test_the_row_key_and_the_case_field_add_up() -> None:
    adapter = in_place_adapter(lambda inputs: inputs["x"].mul_(2), declared=())
    assert check_workload(adapter, {"id": "w"}, device="cpu", seeds=1).status == ERROR  # undeclared: baseline error
    assert check_workload(adapter, {"id": "w", "mutates": ["x"]}, device="cpu", seeds=1).status == PASSED


@pytest.mark.parametrize("value", ['"x"', "[1]", '["x", "x"]', '[""]'])
def test_the_row_key_must_be_a_list_of_distinct_names(tmp_path: Path, value: str) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(f'[defaults]\nmutates = {value}\n\n[[workload]]\nid = "r"\n')
    with pytest.raises(TaskSpecError, match=r"\[\[workload\]\] #1 \(r\) mutates = .* allowed: a list of distinct"):
        load_workloads(path)


def test_the_row_key_is_read_into_the_workload(tmp_path: Path) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text('[defaults]\nmutates = ["q", "k"]\n\n[[workload]]\nid = "r"\n\n[[workload]]\nid = "s"\nmutates = []\n')
    assert [w.mutates for w in load_workloads(path)] == [("q", "k"), ()]
