"""The correctness gate: several seeds of fresh inputs, poisoned outputs, every output checked.

A row is timed only if it PASSED here. The reference is the adapter's `reference` when it has one, else the
baseline's outputs; either way the reference must itself be finite, and with an adapter reference the
baseline must agree with it too (a baseline outside the tolerance makes the comparison meaningless).
torch is imported lazily: the runner reads the status names without it.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

PASSED = "PASSED"
INCORRECT = "INCORRECT"
ERROR = "ERROR"
TIMEOUT = "TIMEOUT"
SKIPPED = "SKIPPED"
STATUSES = (PASSED, INCORRECT, ERROR, TIMEOUT, SKIPPED)

INT_POISON = -17
TRACEBACK_LINES = 20


@dataclass
class Verdict:
    status: str
    message: str | None = None
    where: str | None = None  # "seed 1, candidate output 'out'", "make_case", ...
    mismatch: dict[str, Any] | None = None  # the first bad element: output, kind, index, expected, got, max_abs_err
    seeds_checked: int = 0
    max_abs_err: dict[str, float] = field(default_factory=dict)  # per output, over all seeds (candidate vs ref)
    traceback: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Refused(Exception):
    """Stops the gate with a verdict: raised from deep inside the checks, caught once in check_workload."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict


# --------------------------------------------------------------------------------------------- poisoning


def poison_value(dtype: Any) -> float | int | bool:
    """NaN for floating outputs, -17 for integers (wrapped for unsigned ones), True for booleans."""
    import torch

    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return INT_POISON % (info.max + 1) if info.min == 0 else INT_POISON


def poison_outputs(outputs: dict[str, Any]) -> None:
    import torch

    for tensor in outputs.values():
        if torch.is_tensor(tensor):
            tensor.fill_(poison_value(tensor.dtype))


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality: NaN equals NaN where both hold the same NaN, unlike ==."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


# --------------------------------------------------------------------------------------------- the gate


def check_workload(
    adapter: Any,
    workload: dict[str, Any],
    *,
    device: str,
    seeds: int,
    atol: float | None = None,
    rtol: float | None = None,
) -> Verdict:
    """Run both sides on `seeds` fresh cases and compare; atol/rtol (the row's overrides) beat the Case's."""
    base_seed = int(workload.get("seed", 0))
    largest: dict[str, float] = {}
    for k in range(seeds):
        seed = base_seed + k
        try:
            _check_one_seed(adapter, workload, device=device, seed=seed, atol=atol, rtol=rtol, largest=largest)
        except _Refused as refused:
            refused.verdict.seeds_checked = k
            return refused.verdict
    return Verdict(PASSED, seeds_checked=seeds, max_abs_err=largest)


def _check_one_seed(
    adapter: Any,
    workload: dict[str, Any],
    *,
    device: str,
    seed: int,
    atol: float | None,
    rtol: float | None,
    largest: dict[str, float],
) -> None:
    case = _guarded(f"seed {seed}, make_case", lambda: adapter.make_case(workload, device=device, seed=seed))
    tol_abs = float(case.atol if atol is None else atol)
    tol_rel = float(case.rtol if rtol is None else rtol)
    pristine = _clone_tensors(case.inputs)
    addresses = {}
    for side, call, outputs in (
        ("baseline", adapter.call_baseline, case.outputs_baseline),
        ("candidate", adapter.call_candidate, case.outputs_candidate),
    ):
        addresses[side] = _run_side(side, seed, device, lambda: call(workload, case.inputs, outputs), outputs)
        _require_inputs_untouched(side, seed, pristine, case.inputs)
    has_reference = callable(getattr(adapter, "reference", None))
    if has_reference:
        expected = _guarded(f"seed {seed}, reference", lambda: adapter.reference(workload, case.inputs))
        _sync(device, f"seed {seed}, reference")
        _require_usable_reference("reference", seed, expected, case.outputs_baseline)
        _require_agreement("baseline", seed, expected, case.outputs_baseline, case.outputs_baseline, tol_abs, tol_rel,
                           status=ERROR, largest={})
    else:
        expected = case.outputs_baseline
        _require_usable_reference("baseline", seed, expected, case.outputs_baseline)
    _require_in_place("baseline", seed, case.outputs_baseline, addresses["baseline"])
    _require_agreement("candidate", seed, expected, case.outputs_candidate, case.outputs_baseline, tol_abs, tol_rel,
                       status=INCORRECT, largest=largest)
    _require_in_place("candidate", seed, case.outputs_candidate, addresses["candidate"])


def _run_side(
    side: str, seed: int, device: str, call: Callable[[], None], outputs: dict[str, Any]
) -> dict[str, tuple[Any, int | None]]:
    """Poison, call, and sync (so an asynchronous CUDA fault lands on this call); returns where outputs were."""
    poison_outputs(outputs)
    where_before = {name: (t, _address(t)) for name, t in outputs.items()}
    _sync(device, f"seed {seed}, before {side}")
    _guarded(f"seed {seed}, call_{side}", call)
    _sync(device, f"seed {seed}, call_{side}")
    return where_before


def _require_in_place(side: str, seed: int, outputs: dict[str, Any], where_before: dict[str, Any]) -> None:
    """Right values in a tensor the call allocated itself still break destination-passing (and its timing)."""
    for name, (tensor, address) in where_before.items():
        now = outputs.get(name)
        if now is not tensor or _address(now) != address:
            _fail(
                INCORRECT if side == "candidate" else ERROR,
                f"{side} replaced output {name!r} instead of writing into it (calls are destination-passing)",
                f"seed {seed}, {side} output {name!r}",
                {"output": name, "kind": "replaced"},
            )


def _require_inputs_untouched(side: str, seed: int, pristine: dict[str, Any], inputs: dict[str, Any]) -> None:
    for name, original in pristine.items():
        if not same_bits(original, inputs[name]):
            _fail(
                INCORRECT if side == "candidate" else ERROR,
                f"{side} modified input {name!r}: calls may write only their outputs",
                f"seed {seed}, {side} input {name!r}",
                {"output": name, "kind": "input_modified"},
            )


def _require_usable_reference(label: str, seed: int, expected: dict[str, Any], layout: dict[str, Any]) -> None:
    """The reference has every output and is finite; otherwise nothing can be judged against it."""
    import torch

    for name in layout:
        value = expected.get(name) if isinstance(expected, dict) else None
        if not torch.is_tensor(value):
            _fail(ERROR, f"{label} gives no tensor for output {name!r}", f"seed {seed}, {label} output {name!r}",
                  {"output": name, "kind": "missing"})
        if tuple(value.shape) != tuple(layout[name].shape):
            _fail(ERROR, f"{label} output {name!r} has shape {list(value.shape)}, the outputs {list(layout[name].shape)}",
                  f"seed {seed}, {label} output {name!r}", {"output": name, "kind": "shape"})
        bad = _non_finite(value)
        if bad is not None:
            _fail(
                ERROR,
                f"{label} output {name!r} is not finite at {bad['index']} ({bad['got']}): it cannot serve as the "
                f"reference{' (unwritten elements stay NaN)' if label == 'baseline' else ''}",
                f"seed {seed}, {label} output {name!r}",
                {"output": name, **bad},
            )


def _require_agreement(
    side: str,
    seed: int,
    expected: dict[str, Any],
    got: dict[str, Any],
    layout: dict[str, Any],
    atol: float,
    rtol: float,
    *,
    status: str,
    largest: dict[str, float],
) -> None:
    for name, reference_layout in layout.items():
        where = f"seed {seed}, {side} output {name!r}"
        mismatch = compare_output(expected[name], got[name], reference_layout, atol=atol, rtol=rtol, largest=largest,
                                  name=name)
        if mismatch is not None:
            what = "disagrees with the reference" if side == "baseline" else "is wrong"
            _fail(status, f"{side} output {name!r} {what}: {describe(mismatch)}", where, {"output": name, **mismatch})


def compare_output(
    expected: Any,
    got: Any,
    layout: Any,
    *,
    atol: float,
    rtol: float,
    largest: dict[str, float] | None = None,
    name: str = "out",
) -> dict[str, Any] | None:
    """The first problem with `got` (shape and dtype against the baseline's `layout`, values against `expected`)."""
    import torch

    if not torch.is_tensor(got):
        return {"kind": "type", "detail": f"expected a tensor, got {type(got).__name__}"}
    if tuple(got.shape) != tuple(layout.shape):
        return {"kind": "shape", "detail": f"shape {list(got.shape)}, expected {list(layout.shape)}"}
    if got.dtype != layout.dtype:
        return {"kind": "dtype", "detail": f"dtype {got.dtype}, expected {layout.dtype}"}
    bad = _non_finite(got)
    if bad is not None:
        return bad
    wide = torch.float64 if torch.float64 in (got.dtype, expected.dtype) else torch.float32
    got_w = got.to(wide)
    expected_w = expected.to(device=got.device, dtype=wide)
    error = (got_w - expected_w).abs()
    if error.numel():
        worst = float(error.max())
        if largest is not None:
            largest[name] = max(largest.get(name, 0.0), worst)
    else:
        worst = 0.0
    outside = error > atol + rtol * expected_w.abs()
    if not bool(outside.any()):
        return None
    flat = int(outside.reshape(-1).to(torch.uint8).argmax())  # argmax returns the first maximal element
    index = _unravel(flat, tuple(got.shape))
    got_value, expected_value = got_w.reshape(-1)[flat].item(), expected_w.reshape(-1)[flat].item()
    hint = " (still the poison value: never written?)" if got_value == INT_POISON and not got.dtype.is_floating_point else ""
    return {
        "kind": "tolerance",
        "index": index,
        "got": got_value,
        "expected": expected_value,
        "max_abs_err": worst,
        "atol": atol,
        "rtol": rtol,
        "detail": f"first mismatch at {index}: got {got_value!r}, expected {expected_value!r}; max abs err {worst:.3g} "
        f"(atol {atol:g}, rtol {rtol:g}){hint}",
    }


def describe(mismatch: dict[str, Any]) -> str:
    return mismatch.get("detail") or mismatch["kind"]


def _non_finite(tensor: Any) -> dict[str, Any] | None:
    import torch

    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex) or tensor.numel() == 0:
        return None
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    flat = int((~finite).reshape(-1).to(torch.uint8).argmax())
    index = _unravel(flat, tuple(tensor.shape))
    value = tensor.reshape(-1)[flat].item()
    kind = "nan" if value != value else "inf"
    unwritten = " (never written, or written as NaN)" if kind == "nan" else ""
    count = int((~finite).sum())
    return {
        "kind": kind,
        "index": index,
        "got": repr(value),
        "count": count,
        "detail": f"{kind.upper()} at {index}{unwritten}; {count} of {tensor.numel()} elements are not finite",
    }


# --------------------------------------------------------------------------------------------- helpers


def _guarded(where: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except _Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the task raises becomes this row's ERROR
        _raise_error(where, exc)


def _sync(device: str, where: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    _guarded(where, torch.cuda.synchronize)


def _raise_error(where: str, exc: BaseException) -> None:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines).splitlines()[-TRACEBACK_LINES:]
    raise _Refused(Verdict(ERROR, f"{where}: {type(exc).__name__}: {exc}", where, traceback="\n".join(text)))


def _fail(status: str, message: str, where: str, mismatch: dict[str, Any]) -> None:
    raise _Refused(Verdict(status, message, where, mismatch))


def _address(tensor: Any) -> int | None:
    try:
        return int(tensor.data_ptr())
    except Exception:  # noqa: BLE001 - not a tensor: reported by the comparison
        return None


def _clone_tensors(values: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {name: v.detach().clone() for name, v in values.items() if torch.is_tensor(v)}


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))
