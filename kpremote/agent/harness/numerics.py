"""SGLang's numerical contract for a row: the candidate's error against a float64 evaluation, next to the baseline's.

A fixed atol/rtol (correctness.py, the floor) says only that the candidate is near the reference. SGLang 0.5.23
admits a diffusion fast path by a stricter rule, relative to the implementation it replaces: both are scored
against the same math evaluated in float64, and the candidate passes when
  - its RMS error and its largest error are each at most ERROR_RATIO (1.5) times the baseline's (a baseline that is
    exact against float64 holds the candidate to exact too);
  - its signed mean error is at most BIAS_IN_RMS (0.25) of its own RMS error: a rounding that leans one way adds up
    over layers and steps. Where the baseline itself leans further than that, the candidate may lean at most
    ERROR_RATIO times as far as the baseline does (a candidate equal to the baseline always passes). On a small
    output the mean of honest, unbiased rounding errors strays by chance (its spread is about RMS / sqrt(n)), so
    the limit is never below BIAS_NOISE_SIGMAS (3) such spreads: 3 / sqrt(n) of the RMS, above 0.25 only for
    outputs of fewer than 144 elements;
  - it has NaN, +Inf and -Inf exactly where the float64 reference has them.
This is what catches a candidate that computes in lower precision than upstream (float16 or bfloat16 arithmetic
for float32 data, TF32 matmuls): it stays inside a loose atol/rtol, but its error is many times the baseline's.

A row whose upstream contract is bitwise (contract = "exact" in bench/workloads.toml) needs no reference: the
candidate must equal the baseline bit for bit, and the first element that differs is named with its distance in
units in the last place.

The float64 reference is the adapter's `reference` run on float64 copies of the case's floating inputs. Where it
cannot serve (it raises on float64 inputs, or hands back a tensor that is not float64, or puts NaN/Inf where the
baseline has none), the contract is NOT CHECKED for the row and the record says why; the row then stands on the
floor alone, never reported as having met the contract. A row's outputs that are not real floating point
(integers, booleans) are left to the floor. Under Triton's interpreter (the CPU smoke run) a bfloat16 output's breach
is NOT CHECKED too, its ratios kept: the interpreter rounds float32 to bfloat16 by truncation (Triton 3.x
interpreter.py, cast_impl), where a GPU rounds to nearest even, so a Triton side's RMS error there is about twice
a GPU's (2.0x on the fuse_scale_shift task's bfloat16 rows against a baseline rounded by torch).

The record (Verdict.numerics, results.json rows' correctness.numerics) keeps, per output, the worst of each ratio
over every case the gate checked. torch is imported lazily: report.py reads the record without it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .comparison import unravel
from ..task.taskrecords import CLOSE, EXACT  # a contract's names: the task's words (workloads.toml)

ERROR_RATIO = 1.5
BIAS_IN_RMS = 0.25
BIAS_NOISE_SIGMAS = 3.0  # on n elements an unbiased rounding's mean error strays ~RMS / sqrt(n) by chance
_BITS = {2: "int16", 4: "int32", 8: "int64"}


def new_record(contract: str) -> dict[str, Any]:
    """The row's numerics record before any case: filled by check() case after case."""
    record: dict[str, Any] = {"contract": contract, "checked": True, "reason": None, "outputs": {}}
    if contract == CLOSE:
        record["limits"] = {"error_ratio": ERROR_RATIO, "bias_in_rms": BIAS_IN_RMS,
                            "bias_noise_sigmas": BIAS_NOISE_SIGMAS}
    return record


def check(record: dict[str, Any], baseline: dict[str, Any], candidate: dict[str, Any],
          reference64: Callable[[], Any] | None, label: str, interpreted: bool = False) -> dict[str, Any] | None:
    """One case under the row's contract: the first problem ({output, kind, detail}) of the candidate, or None.

    reference64 runs the adapter's reference on float64 inputs (None: the adapter has none); an exception it
    raises, or an unusable result, marks the record NOT CHECKED instead of failing the candidate. interpreted: the
    sides ran under Triton's interpreter, whose bfloat16 rounding is not a GPU's."""
    if not record["checked"]:
        return None
    problem = _check_case(record, baseline, candidate, reference64, label)
    if problem is not None and interpreted and str(baseline[problem["output"]].dtype) == "torch.bfloat16":
        record["checked"] = False
        record["reason"] = (f"{label}: {problem['detail']} — under Triton's interpreter, which rounds float32 to "
                            "bfloat16 by truncation (a GPU rounds to nearest even): judged on a GPU only")
        return None
    return problem


def _check_case(record: dict[str, Any], baseline: dict[str, Any], candidate: dict[str, Any],
                reference64: Callable[[], Any] | None, label: str) -> dict[str, Any] | None:
    if record["contract"] == EXACT:
        return _check_exact(record, baseline, candidate)
    expected = _reference64(record, reference64, baseline, label)
    if expected is None:
        return None
    for name, base in baseline.items():
        if not _real_floating(base):
            record["outputs"][name] = {"scored": False, "why": f"{str(base.dtype).removeprefix('torch.')} output: "
                                                                  "the floor alone judges it"}
            continue
        problem = _check_close(record, name, expected[name], base, candidate[name], label)
        if problem is not None or not record["checked"]:
            return problem
    return None


def float64_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Fresh float64 copies of the floating tensors (complex ones as complex128), the other values as they are."""
    import torch

    def widened(value: Any) -> Any:
        if not torch.is_tensor(value):
            return value
        if value.dtype.is_complex:
            return value.detach().to(torch.complex128, copy=True)
        if value.dtype.is_floating_point:
            return value.detach().to(torch.float64, copy=True)
        return value.detach().clone()

    return {name: widened(value) for name, value in inputs.items()}


# --------------------------------------------------------------------------------------------- close


def _reference64(record: dict[str, Any], reference64: Callable[[], Any] | None, layout: dict[str, Any],
                 label: str) -> dict[str, Any] | None:
    """The float64 reference's outputs, or None with the record marked NOT CHECKED and why."""
    import torch

    if reference64 is None:
        return _not_checked(record, "bench/adapter.py has no `reference`: no float64 evaluation to score against")
    try:
        expected = reference64()
    except Exception as exc:  # noqa: BLE001 - a reference that cannot run in float64: recorded, not a failure
        return _not_checked(record, f"{label}: the adapter's reference raised on float64 inputs: "
                                    f"{type(exc).__name__}: {str(exc)[:200]}")
    for name, base in layout.items():
        value = expected.get(name) if isinstance(expected, dict) else None
        if not _real_floating(base):
            continue
        if not torch.is_tensor(value) or tuple(value.shape) != tuple(base.shape):
            return _not_checked(record, f"{label}: the reference on float64 inputs gives no tensor of the outputs' "
                                        f"shape for {name!r}")
        if value.dtype != torch.float64:
            return _not_checked(record, f"{label}: the reference on float64 inputs gives {name!r} as "
                                        f"{str(value.dtype).removeprefix('torch.')}, not float64")
    return expected


def _check_close(record: dict[str, Any], name: str, expected: Any, base: Any, cand: Any,
                 label: str) -> dict[str, Any] | None:
    moved = _special_values_moved(expected, base)
    if moved is not None:
        _not_checked(record, f"{label}: the float64 reference has {moved} where the baseline's output {name!r} does "
                             "not: it is not the baseline's math")
        return None
    moved = _special_values_moved(expected, cand)
    if moved is not None:
        return {"output": name, "kind": "special_values",
                "detail": f"{moved} where the float64 reference has none (NaN and Inf must sit exactly where the "
                          "reference has them)"}
    b, c = _score(expected, base), _score(expected, cand)
    entry = {"rms_ratio": _ratio(c["rms"], b["rms"]), "max_ratio": _ratio(c["max"], b["max"]),
             "bias": _ratio(c["mean"], c["rms"], zero=0.0), "baseline_bias": _ratio(b["mean"], b["rms"], zero=0.0),
             "candidate_rms": c["rms"], "baseline_rms": b["rms"], "candidate_max": c["max"], "baseline_max": b["max"]}
    _keep_worst(record["outputs"], name, entry)
    for metric in ("rms", "max"):
        if c[metric] > ERROR_RATIO * b[metric]:
            return {"output": name, "kind": "error_ratio", "metric": metric, "ratio": entry[f"{metric}_ratio"],
                    "detail": _ratio_text(metric, c[metric], b[metric])}
    return _bias_problem(name, b, c, entry)


def _bias_problem(name: str, b: dict[str, float], c: dict[str, float], entry: dict[str, Any]) -> dict[str, Any] | None:
    """The candidate's mean error beyond its limit: 0.25 of its RMS (wider on a small output, where chance leans
    that far), or 1.5x the baseline's own mean error where that is more."""
    limit = max(BIAS_IN_RMS, BIAS_NOISE_SIGMAS / math.sqrt(c["n"])) if c["n"] else BIAS_IN_RMS
    if abs(c["mean"]) <= max(limit * c["rms"], ERROR_RATIO * abs(b["mean"])):
        return None
    return {"output": name, "kind": "bias", "ratio": entry["bias"],
            "detail": f"its error leans one way: mean error {c['mean']:+.3g} is {abs(entry['bias']):.2f}x its RMS error "
                      f"{c['rms']:.3g} (at most {limit:.2f}x over its {c['n']} elements; the baseline's mean error is "
                      f"{b['mean']:+.3g}, {abs(entry['baseline_bias']):.2f}x its RMS)"}


def _ratio_text(metric: str, cand: float, base: float) -> str:
    what = "RMS error" if metric == "rms" else "largest error"
    if base == 0:
        return (f"its {what} against float64 is {cand:.3g} where the baseline's is 0 (exact in the output dtype): "
                "the contract holds the candidate to exact too")
    return (f"its {what} against float64 is {cand / base:.2f}x the baseline's ({cand:.3g} vs {base:.3g}; at most "
            f"{ERROR_RATIO}x): more error than the implementation it replaces, as from computing in lower precision")


def _score(expected: Any, actual: Any) -> dict[str, float]:
    """RMS, largest and signed mean error of `actual` against float64, over the n elements where the reference is
    finite."""
    import torch

    error = actual.to(torch.float64) - expected
    finite = torch.isfinite(expected)
    if not bool(finite.all()):  # NaN/Inf sit where the reference has them (checked before): not scored
        error = error[finite]
    if not error.numel():
        return {"rms": 0.0, "max": 0.0, "mean": 0.0, "n": 0}
    return {"rms": float(error.square().mean().sqrt()), "max": float(error.abs().max()), "mean": float(error.mean()),
            "n": int(error.numel())}


def _special_values_moved(expected: Any, actual: Any) -> str | None:
    """'NaN at [i]' (or +Inf, -Inf) where `actual` holds a special value that `expected` does not hold there."""
    import torch

    got = actual.to(torch.float64)
    for what, of in (("NaN", torch.isnan), ("+Inf", lambda t: t == float("inf")),
                     ("-Inf", lambda t: t == float("-inf"))):
        moved = of(got) != of(expected)
        if bool(moved.any()):
            flat = int(moved.reshape(-1).to(torch.uint8).argmax())
            where = unravel(flat, tuple(actual.shape))
            state = "has" if bool(of(got).reshape(-1)[flat]) else "lacks"
            return f"{what} moved: the output {state} one at {where} ({int(moved.sum())} positions differ)"
    return None


def _ratio(value: float, scale: float, zero: float | None = None) -> float | None:
    """value / scale; where scale is 0: `zero` if given, else 1.0 when value is 0 too, None (no ratio) otherwise."""
    if scale:
        return value / scale
    if zero is not None:
        return zero
    return 1.0 if value == 0 else None


def _keep_worst(outputs: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    """Each field's worst over the cases: the largest value, by magnitude for the signed biases; a ratio once None
    (the baseline exact, the candidate not) stays None."""
    held = outputs.get(name)
    if held is None:
        outputs[name] = entry
        return
    for key, value in entry.items():
        old = held.get(key)
        if key.endswith("_ratio") and (old is None or value is None):
            held[key] = None  # no ratio: a baseline exact against float64 that the candidate was not
        elif abs(value) > abs(old):
            held[key] = value


def _not_checked(record: dict[str, Any], reason: str) -> None:
    record["checked"] = False
    record["reason"] = reason
    record["outputs"] = {}
    return None


# --------------------------------------------------------------------------------------------- exact


def _check_exact(record: dict[str, Any], baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any] | None:
    """Bit for bit the baseline's outputs; else the first element that differs and how many ulps apart."""
    import torch

    for name, base in baseline.items():
        cand = candidate[name]
        a = base.detach().reshape(-1).contiguous()
        b = cand.detach().reshape(-1).contiguous()
        integer = getattr(torch, _BITS.get(a.element_size(), ""), None) if a.dtype.is_floating_point else None
        differs = (a.view(integer) != b.view(integer)) if integer is not None else (a != b)
        count = int(differs.sum()) if differs.numel() else 0
        earlier = record["outputs"].get(name, {}).get("bitwise_equal", True)
        record["outputs"][name] = {"bitwise_equal": earlier and not count}
        if not count:
            continue
        flat = int(differs.to(torch.uint8).argmax())
        where = unravel(flat, tuple(base.shape))
        ulps = f", {abs(int(a.view(integer)[flat]) - int(b.view(integer)[flat]))} ulp apart" if integer else ""
        return {"output": name, "kind": "not_bitwise", "index": where, "count": count,
                "detail": f"the row's contract is exact (bitwise equal to the baseline): first difference at {where}, "
                          f"got {b[flat].item()!r}, baseline {a[flat].item()!r}{ulps}; {count} of {a.numel()} "
                          "elements differ"}
    return None


# --------------------------------------------------------------------------------------------- helpers


def _real_floating(tensor: Any) -> bool:
    return bool(getattr(tensor, "dtype", None) is not None and tensor.dtype.is_floating_point)


def summary(record: dict[str, Any] | None) -> str | None:
    """One line for results.md: the row's worst ratios, or why the contract was not checked."""
    if not record:
        return None
    if not record.get("checked"):
        return f"NOT CHECKED: {record.get('reason')}"
    if record.get("contract") == EXACT:
        outputs = record.get("outputs") or {}
        equal = all(o.get("bitwise_equal") for o in outputs.values()) if outputs else None
        return "exact: bitwise equal to the baseline" if equal else "exact: NOT bitwise equal to the baseline"
    parts = []
    for name, entry in (record.get("outputs") or {}).items():
        if entry.get("scored") is False:
            parts.append(f"`{name}` floor only ({entry.get('why')})")
            continue
        parts.append(f"`{name}` RMS {_shown(entry.get('rms_ratio'))}, max {_shown(entry.get('max_ratio'))} "
                     f"the baseline's error, bias {_shown(entry.get('bias'), sign=True)} of RMS")
    return "; ".join(parts) or None


def _shown(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "n/a (baseline exact)"
    return f"{value:+.2f}" if sign else f"{value:.2f}x"
