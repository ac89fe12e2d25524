"""Candidates that cheat or break: each is caught with the right status, and nothing is timed for it.

One run through the whole agent holds one adversarial candidate (tests/fixtures/tasks/adversarial/kernel.py)
whose misbehaviour is chosen per workload row, so a bad row costs that row and the run goes on. Smaller cases
that need no process of their own go straight through the correctness gate.
"""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from kpremote.agent.contract import Case
from kpremote.agent.harness.correctness import ERROR, INCORRECT, PASSED, check_workload
from agent.test_runner import FIXTURES, copy_fixture, events_of, results_of, rows_by_id, run_agent

HANG_TIMEOUT_S = 6  # the adversarial task's [timing] timeout_s: a hung row costs this much


@pytest.fixture(scope="module")
def adversarial_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    base = tmp_path_factory.mktemp("adversarial")
    task = copy_fixture(base)
    (task / "solution" / "kernel.py").rename(task / "solution" / "honest.py")
    shutil.copy(FIXTURES / "adversarial" / "kernel.py", task / "solution" / "kernel.py")
    shutil.copy(FIXTURES / "adversarial" / "workloads.toml", task / "bench" / "workloads.toml")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_s = 120", f"timeout_s = {HANG_TIMEOUT_S}"))
    run_dir = base / "run"
    done = run_agent(task, run_dir)
    return run_dir, done.returncode


@pytest.mark.parametrize(
    ("workload", "status", "kind", "text"),
    [
        ("writes_nan", INCORRECT, "nan", "NAN at [2, 60]"),
        ("partial_write", INCORRECT, "nan", "NAN at [2, 0] (never written, or written as NaN); 62 of 186"),
        ("wrong_shape", INCORRECT, "shape", "shape [3, 64], expected [3, 63]"),
        ("wrong_dtype", INCORRECT, "dtype", "dtype torch.float64, expected torch.float32"),
        ("raises", ERROR, None, "call_candidate: RuntimeError: adversarial candidate refuses to compute"),
        ("hangs", "TIMEOUT", None, f"no result within {HANG_TIMEOUT_S} s"),
        ("crashes", ERROR, None, "call_candidate: candidate side crashed: killed by SIGSEGV"),
        # The two CPU attacks of issue 11: both passed when the candidate shared the checker's process.
        ("zeros_blind_checker", INCORRECT, "tolerance", "candidate output 'out' is wrong: first mismatch at [0, 0]"),
        ("copies_expected", INCORRECT, "tolerance", "candidate output 'out' is wrong: first mismatch at [0, 0]"),
    ],
)
def test_each_misbehaviour_gets_its_status_and_is_not_timed(
    adversarial_run: tuple[Path, int], workload: str, status: str, kind: str | None, text: str
) -> None:
    run_dir, _ = adversarial_run
    row = rows_by_id(run_dir)[workload]
    assert row["status"] == status
    assert text in row["message"]
    if kind:
        assert row["correctness"]["mismatch"]["kind"] == kind
    assert row["timing"] is None and row["speedup"] is None


def test_the_run_goes_on_after_bad_rows_and_fails(adversarial_run: tuple[Path, int]) -> None:
    run_dir, exit_code = adversarial_run
    assert exit_code == 1
    rows = results_of(run_dir)["rows"]
    assert [r["workload"] for r in rows][-6:] == ["crashes", "zeros_blind_checker", "copies_expected",
                                                  "lazy_when_timed", "thread_when_timed", "honest"]
    honest = rows[-1]
    assert honest["status"] == PASSED and honest["timing"]["candidate"]["n"] > 0
    timed = {json.loads(line)["workload"] for line in (run_dir / "raw" / "samples.jsonl").read_text().splitlines()}
    assert timed == {"honest", "thread_when_timed"}  # timed, but its timing is invalid
    statuses = [e["status"] for e in events_of(run_dir) if e["event"] == "row"]
    assert statuses == [INCORRECT] * 4 + [ERROR, "TIMEOUT", ERROR, INCORRECT, INCORRECT, INCORRECT, PASSED, PASSED]
    head = results_of(run_dir)["headline"]  # no speedup claimed over a run with failed production rows
    assert head["geomean"] is None and (head["n"], head["of"]) == (0, 12)
    assert head["note"].startswith("withheld: writes_nan INCORRECT, partial_write INCORRECT")
    # why it failed, where `inv status` and `inv run --json`'s `error` read it (state.json's message)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "failed" and state["message"].startswith(
        "11 of 12 row(s) not passed: writes_nan INCORRECT, partial_write INCORRECT, wrong_shape INCORRECT and 8 more"
        " — writes_nan: "), state["message"]


def test_a_candidate_that_changes_behaviour_once_timed_is_incorrect(adversarial_run: tuple[Path, int]) -> None:
    run_dir, _ = adversarial_run
    row = rows_by_id(run_dir)["lazy_when_timed"]
    assert row["status"] == INCORRECT and row["correctness"]["status"] == PASSED  # it passed the gate...
    assert "candidate changed behaviour during timing" in row["message"]  # ...and was caught on a timed call
    assert "NAN" in row["message"] and row["timing"] is None and row["speedup"] is None


def test_a_thread_started_during_timing_makes_the_row_invalid(adversarial_run: tuple[Path, int]) -> None:
    run_dir, _ = adversarial_run
    row = rows_by_id(run_dir)["thread_when_timed"]
    assert row["status"] == PASSED and row["invalid"] == "the candidate side started 1 thread(s) during timing"
    before, after = row["side_threads"]["before"], row["side_threads"]["after"]
    assert after["candidate"] == before["candidate"] + 1 and after["baseline"] == before["baseline"]
    honest = rows_by_id(run_dir)["honest"]
    assert not honest.get("invalid") and honest["side_threads"]["after"] == honest["side_threads"]["before"]


def test_asymmetric_flags_are_refused_before_anything_runs(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("flags = []", 'flags = []\nflags_candidate = ["--use_fast_math"]'))
    run_dir = tmp_path / "run"
    done = run_agent(task, run_dir)
    assert done.returncode == 2
    results = results_of(run_dir)
    assert results["status"] == "error" and "per-side build settings are refused" in results["message"]
    assert results["rows"] == []
    assert not (run_dir / "raw" / "build").exists() and not (run_dir / "raw" / "prepare.log").exists()
    assert [e["event"] for e in events_of(run_dir)][-3:] == ["phase", "headline", "done"]


def test_a_self_building_candidate_is_refused_before_anything_runs(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path)
    kernel = task / "solution" / "kernel.py"
    kernel.write_text("from torch.utils.cpp_extension import load_inline\n" + kernel.read_text())
    done = run_agent(task, tmp_path / "run")
    assert done.returncode == 2
    assert "solution/kernel.py:1: builds or loads its own binary" in results_of(tmp_path / "run")["message"]


# --------------------------------------------------------------------------------------------- the gate itself


def double_it(inputs: dict[str, Any], out: torch.Tensor) -> None:
    torch.mul(inputs["x"], 2, out=out)


def adapter(candidate: Any, *, dtype: torch.dtype = torch.float32, reference: Any = None, baseline: Any = double_it,
            atol: float = 1e-6) -> types.SimpleNamespace:
    def make_case(workload: dict, *, device: str, seed: int) -> Case:
        x = (torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)) * 10).to(dtype)
        return Case({"x": x}, {"out": torch.empty_like(x)}, {"out": torch.empty_like(x)}, atol=atol, rtol=0.0)

    namespace = types.SimpleNamespace(
        make_case=make_case,
        call_baseline=lambda workload, inputs, outputs: baseline(inputs, outputs["out"]),
        call_candidate=lambda workload, inputs, outputs: candidate(inputs, outputs),
    )
    if reference is not None:
        namespace.reference = reference
    return namespace


def gate(candidate: Any, **options: Any) -> Any:
    row_tolerance = {k: options.pop(k) for k in ("row_atol",) if k in options}
    return check_workload(adapter(candidate, **options), {"id": "w"}, device="cpu", seeds=3,
                          atol=row_tolerance.get("row_atol"))


def test_an_honest_candidate_passes_every_seed() -> None:
    verdict = gate(lambda inputs, outputs: double_it(inputs, outputs["out"]))
    assert verdict.status == PASSED and verdict.seeds_checked == 3 and verdict.max_abs_err == {"out": 0.0}


def test_writing_into_an_input_is_incorrect() -> None:
    def sneaky(inputs: dict, outputs: dict) -> None:
        double_it(inputs, outputs["out"])
        inputs["x"].zero_()

    verdict = gate(sneaky)
    assert verdict.status == INCORRECT and "modified input 'x'" in verdict.message


def test_replacing_the_output_instead_of_writing_it_is_incorrect() -> None:
    def allocates(inputs: dict, outputs: dict) -> None:
        outputs["out"] = inputs["x"] * 2  # right values, but a fresh tensor: not destination-passing

    verdict = gate(allocates)
    assert verdict.status == INCORRECT and "replaced output 'out'" in verdict.message


def test_an_unwritten_integer_output_shows_the_poison_value() -> None:
    def half_done(inputs: dict, outputs: dict) -> None:
        double_it(inputs, outputs["out"])
        outputs["out"][0, 0] = -17

    verdict = gate(half_done, dtype=torch.int64)
    assert verdict.status == INCORRECT and verdict.mismatch["index"] == [0, 0]
    assert "still the poison value" in verdict.message


def test_a_tolerance_miss_reports_the_first_mismatch_and_the_largest_error() -> None:
    def off(inputs: dict, outputs: dict) -> None:
        double_it(inputs, outputs["out"])
        outputs["out"][1, 2] += 0.5
        outputs["out"][3, 3] += 2.0

    verdict = gate(off)
    assert verdict.status == INCORRECT
    assert verdict.mismatch["index"] == [1, 2] and verdict.mismatch["max_abs_err"] == pytest.approx(2.0)
    assert gate(off, row_atol=3.0).status == PASSED  # the row's override beats the Case's tolerance


def test_a_baseline_that_is_not_finite_cannot_be_the_reference() -> None:
    def nan_baseline(inputs: dict, out: torch.Tensor) -> None:
        double_it(inputs, out)
        out[0, 1] = float("nan")

    verdict = gate(lambda inputs, outputs: double_it(inputs, outputs["out"]), baseline=nan_baseline)
    assert verdict.status == ERROR and "cannot serve as the reference" in verdict.message


def test_with_a_reference_the_baseline_must_agree_with_it_too() -> None:
    def reference(workload: dict, inputs: dict) -> dict:
        return {"out": inputs["x"].double() * 2}

    def off_by_one(inputs: dict, out: torch.Tensor) -> None:
        double_it(inputs, out)
        out += 1

    honest = lambda inputs, outputs: double_it(inputs, outputs["out"])  # noqa: E731
    assert gate(honest, reference=reference).status == PASSED
    verdict = gate(honest, reference=reference, baseline=off_by_one)
    assert verdict.status == ERROR and "baseline output 'out' disagrees with the reference" in verdict.message
