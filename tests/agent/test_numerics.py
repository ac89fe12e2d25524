"""The row's numerical contract (kpremote/agent/harness/numerics.py) through the gate: SGLang's float64 error test on
top of the fixed atol/rtol floor, and bitwise equality where a row declares `contract = "exact"`.

Every adapter here computes out = x * (1 + scale) + shift; the baseline in float32 arithmetic, as upstream does for
16-bit data, the candidates as each test says. The floors are loose on purpose: what fails, fails on the contract.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kpremote.agent.contract import Case
from kpremote.agent.harness import numerics
from kpremote.agent.harness.correctness import INCORRECT, PASSED
from kpremote.agent.harness.gateinprocess import check_workload
from kpremote.agent.task.taskspec import TaskSpecError, load_workloads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def modulate(inputs: dict, math: torch.dtype) -> torch.Tensor:
    x, scale, shift = (inputs[k].to(math) for k in ("x", "scale", "shift"))
    return x * (1 + scale) + shift


def adapter(candidate, *, atol: float = 5e-2, magnitude: float = 1.0, reference="float64"):
    """candidate(inputs) -> the values the candidate writes (cast to the output dtype by the adapter)."""

    def make_case(workload: dict, *, device: str, seed: int) -> Case:
        gen = torch.Generator().manual_seed(seed)
        dtype = DTYPES[workload.get("dtype", "bfloat16")]
        inputs = {"x": (torch.randn(8, 1024, generator=gen) * magnitude).to(dtype),
                  "scale": (torch.randn(1, 1024, generator=gen) * 0.5).to(dtype),
                  "shift": (torch.randn(1, 1024, generator=gen) * 0.5 * magnitude).to(dtype)}
        out = {"out": torch.empty(8, 1024, dtype=dtype)}
        return Case(inputs, out, {"out": out["out"].clone()}, atol=atol, rtol=atol)

    def write(values: torch.Tensor, outputs: dict) -> None:
        outputs["out"].copy_(values.to(outputs["out"].dtype))

    namespace = types.SimpleNamespace(
        make_case=make_case,
        call_baseline=lambda workload, inputs, outputs: write(modulate(inputs, torch.float32), outputs),
        call_candidate=lambda workload, inputs, outputs: write(candidate(inputs), outputs),
    )
    if reference == "float64":
        namespace.reference = lambda workload, inputs: {"out": modulate(inputs, torch.float64)}
    elif reference == "rounds":  # hands back its result in the row's dtype, whatever it is given
        namespace.reference = lambda workload, inputs: {"out": modulate(inputs, torch.float32).to(torch.bfloat16)}
    elif reference == "raises_on_float64":
        def refuses(workload: dict, inputs: dict) -> dict:
            if inputs["x"].dtype == torch.float64:
                raise TypeError("this reference takes bfloat16 only")
            return {"out": modulate(inputs, torch.float64)}
        namespace.reference = refuses
    return namespace


def judged(candidate, workload: dict | None = None, **kwargs):
    return check_workload(adapter(candidate, **kwargs), {"id": "w", **(workload or {})}, device="cpu", seeds=2)


def test_an_honest_candidate_passes_with_its_ratios_recorded() -> None:
    # float32 arithmetic in another order than the baseline's: other roundings, the same precision
    verdict = judged(lambda inputs: inputs["x"].float() * inputs["scale"].float() + inputs["x"].float()
                     + inputs["shift"].float())
    assert verdict.status == PASSED, verdict.message
    entry = verdict.numerics["outputs"]["out"]
    assert verdict.numerics["contract"] == "close" and verdict.numerics["checked"]
    assert 0.5 < entry["rms_ratio"] <= 1.5 and 0.5 < entry["max_ratio"] <= 1.5 and abs(entry["bias"]) < 0.25


def test_float16_math_for_float32_data_fails_naming_the_ratio_though_the_floor_passes() -> None:
    verdict = judged(lambda inputs: modulate(inputs, torch.float16), {"dtype": "float32"}, atol=1e-2)
    assert verdict.status == INCORRECT and "numerical contract (close)" in verdict.message
    assert verdict.mismatch["kind"] == "error_ratio" and verdict.mismatch["ratio"] > 100
    assert f"{verdict.mismatch['ratio']:.2f}x the baseline's" in verdict.message
    assert verdict.max_abs_err["out"] < 1e-2  # the floor alone would have passed it


def test_float16_math_for_bfloat16_data_below_float16s_normal_range_fails() -> None:
    # float16 carries more mantissa than bfloat16: in its normal range it loses nothing (ratio ~1.04 here, within the
    # contract); bfloat16 data near 1e-6 falls into float16's subnormals and loses bits
    verdict = judged(lambda inputs: modulate(inputs, torch.float16), magnitude=1e-6)
    assert verdict.status == INCORRECT and verdict.mismatch["kind"] == "error_ratio", verdict.message
    assert verdict.mismatch["ratio"] > 1.5 and verdict.max_abs_err["out"] < 5e-2


def test_bfloat16_math_for_bfloat16_data_fails_on_its_error_ratio() -> None:
    verdict = judged(lambda inputs: modulate(inputs, torch.bfloat16))
    assert verdict.status == INCORRECT and verdict.mismatch["kind"] == "error_ratio", verdict.message
    assert verdict.mismatch["ratio"] > 1.5 and verdict.max_abs_err["out"] < 5e-2


def test_a_biased_candidate_fails_on_its_bias() -> None:
    # float32 data: the exact result nudged up by 2e-8, about the baseline's own RMS error (a rounding that leans)
    verdict = judged(lambda inputs: modulate(inputs, torch.float64) + 2e-8, {"dtype": "float32"}, atol=1e-5)
    assert verdict.status == INCORRECT and verdict.mismatch["kind"] == "bias", verdict.message
    assert "leans one way" in verdict.message and verdict.mismatch["ratio"] > 0.25


def test_a_candidate_equal_to_a_leaning_baseline_passes() -> None:
    leaning = adapter(lambda inputs: modulate(inputs, torch.float64) + 2e-8)
    leaning.call_baseline = leaning.call_candidate
    verdict = check_workload(leaning, {"id": "w", "dtype": "float32"}, device="cpu", seeds=1)
    assert verdict.status == PASSED, verdict.message
    assert abs(verdict.numerics["outputs"]["out"]["baseline_bias"]) > 0.25


def test_nan_where_the_float64_reference_has_none_fails() -> None:
    expected = torch.randn(4, 8, dtype=torch.float64)
    baseline = expected.float()
    candidate = baseline.clone()
    candidate[2, 3] = float("nan")
    problem = numerics.check(numerics.new_record("close"), {"out": baseline}, {"out": candidate},
                             lambda: {"out": expected}, "seed 0")
    assert problem["kind"] == "special_values" and "NaN moved" in problem["detail"] and "[2, 3]" in problem["detail"]
    assert numerics.check(numerics.new_record("close"), {"out": baseline}, {"out": baseline.clone()},
                          lambda: {"out": expected}, "seed 0") is None


def test_exact_refuses_a_one_ulp_difference_the_floor_lets_through() -> None:
    def one_ulp_off(inputs: dict) -> torch.Tensor:
        out = modulate(inputs, torch.float32).to(torch.bfloat16)
        bits = out.view(torch.int16)
        bits[3, 5] += 1
        return out

    verdict = judged(one_ulp_off, {"contract": "exact"})
    assert verdict.status == INCORRECT and verdict.mismatch["kind"] == "not_bitwise", verdict.message
    assert "first difference at [3, 5]" in verdict.message and "1 ulp apart" in verdict.message
    assert "1 of 8192 elements differ" in verdict.message
    same = judged(lambda inputs: modulate(inputs, torch.float32), {"contract": "exact"})
    assert same.status == PASSED and same.numerics["outputs"] == {"out": {"bitwise_equal": True}}


@pytest.mark.parametrize("reference, why", [("rounds", "gives 'out' as bfloat16, not float64"),
                                            ("raises_on_float64", "raised on float64 inputs: TypeError"),
                                            (None, "has no `reference`")])
def test_a_reference_that_cannot_run_in_float64_leaves_the_contract_not_checked(reference, why) -> None:
    verdict = judged(lambda inputs: modulate(inputs, torch.bfloat16), reference=reference)
    assert verdict.status == PASSED  # the floor alone judged it ...
    assert verdict.numerics["checked"] is False and why in verdict.numerics["reason"]  # ... and the record says so
    assert numerics.summary(verdict.numerics).startswith("NOT CHECKED")


def test_the_summary_line_shows_the_ratios() -> None:
    record = {"contract": "close", "checked": True, "outputs": {"out": {"rms_ratio": 1.04, "max_ratio": 1.13,
                                                                        "bias": -0.012}}}
    assert numerics.summary(record) == "`out` RMS 1.04x, max 1.13x the baseline's error, bias -0.01 of RMS"


@pytest.mark.parametrize("value", ['"bitwise"', "true", '["exact"]'])
def test_the_contract_key_allows_close_or_exact_only(tmp_path: Path, value: str) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(f'[[workload]]\nid = "r"\ncontract = {value}\n')
    with pytest.raises(TaskSpecError, match=r'\[\[workload\]\] #1 \(r\) contract = .* allowed: "close", "exact"'):
        load_workloads(path)


def test_the_contract_key_is_read_from_the_row_or_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text('[defaults]\ncontract = "exact"\n\n[[workload]]\nid = "r"\n\n[[workload]]\nid = "s"\n'
                    'contract = "close"\n')
    assert [w.contract for w in load_workloads(path)] == ["exact", "close"]
    path.write_text('[[workload]]\nid = "r"\n')
    assert [w.contract for w in load_workloads(path)] == ["close"]


def test_under_triton_s_interpreter_a_bfloat16_breach_is_not_checked_and_a_float32_one_still_fails() -> None:
    # the interpreter truncates float32 -> bfloat16 (a GPU rounds to nearest even): its bfloat16 error is its own
    expected = torch.randn(64, 64, dtype=torch.float64)
    chopped = (expected.float().view(torch.int32) & -65536).view(torch.float32)  # float32 -> bfloat16 by truncation
    for dtype, checked in ((torch.bfloat16, False), (torch.float32, True)):
        baseline = expected.to(dtype)
        truncated = chopped.to(dtype)  # about twice the baseline's RMS error as bfloat16, far more as float32
        record = numerics.new_record("close")
        problem = numerics.check(record, {"out": baseline}, {"out": truncated}, lambda: {"out": expected}, "seed 0",
                                 interpreted=True)
        assert record["checked"] is checked and (problem is None) is not checked
        if not checked:
            assert "Triton's interpreter" in record["reason"] and record["outputs"]["out"]["rms_ratio"] > 1.5
    record = numerics.new_record("close")
    assert numerics.check(record, {"out": expected.bfloat16()}, {"out": chopped.bfloat16()},
                          lambda: {"out": expected}, "seed 0")["kind"] == "error_ratio"  # on a GPU: enforced


def test_the_bias_limit_allows_for_chance_on_a_small_output_only() -> None:
    # 11 errors of +u and 5 of -u: mean 0.375 of the RMS, what chance gives 16 honest roundings now and then;
    # the same lean over 1600 elements is no chance (its spread there is 0.025 of the RMS)
    u = 2.0 ** -20
    for repeat, fails in ((1, False), (100, True)):
        expected = torch.linspace(1, 2, 16 * repeat, dtype=torch.float64)
        lean = torch.tensor([1.0] * 11 + [-1.0] * 5, dtype=torch.float64).repeat(repeat) * u
        even = torch.tensor([1.0, -1.0] * 8, dtype=torch.float64).repeat(repeat) * u
        problem = numerics.check(numerics.new_record("close"), {"out": expected + even}, {"out": expected + lean},
                                 lambda: {"out": expected}, "seed 0")
        assert (problem is not None and problem["kind"] == "bias") is fails, problem


def tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits (to nearest, ties away), as a tensor core reads its operands."""
    bits = t.view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def test_a_tf32_matmul_for_float32_data_fails_naming_the_ratio_though_the_floor_passes() -> None:
    def make_case(workload: dict, *, device: str, seed: int) -> Case:
        gen = torch.Generator().manual_seed(seed)
        inputs = {"a": torch.randn(64, 256, generator=gen), "b": torch.randn(256, 32, generator=gen)}
        return Case(inputs, {"out": torch.empty(64, 32)}, {"out": torch.empty(64, 32)}, atol=5e-2, rtol=5e-2)

    matmul = types.SimpleNamespace(
        make_case=make_case,
        call_baseline=lambda workload, inputs, outputs: torch.matmul(inputs["a"], inputs["b"], out=outputs["out"]),
        call_candidate=lambda workload, inputs, outputs: torch.matmul(tf32(inputs["a"]), tf32(inputs["b"]),
                                                                      out=outputs["out"]),
        reference=lambda workload, inputs: {"out": inputs["a"] @ inputs["b"]},
    )
    verdict = check_workload(matmul, {"id": "w"}, device="cpu", seeds=2)
    assert verdict.status == INCORRECT and verdict.mismatch["kind"] == "error_ratio", verdict.message
    assert verdict.mismatch["ratio"] > 100 and f"{verdict.mismatch['ratio']:.2f}x the baseline's" in verdict.message
    assert verdict.max_abs_err["out"] < 5e-2  # within the floor
