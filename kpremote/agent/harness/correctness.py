"""The correctness gate: several seeds of fresh inputs, poisoned outputs, every output checked.

A row is timed only if it PASSED here. The reference is the adapter's `reference` when it has one, else the
baseline's outputs; either way the reference must itself be finite, and with an adapter reference the
baseline must agree with it too (a baseline outside the tolerance makes the comparison meaningless).
An in-place call's mutated inputs (the row's `mutates`, Case.mutates) are restored from the pristine copy before
each call and then judged like outputs; every other input must come back bit-identical.
On top of that floor, the row's numerical contract (numerics.py: SGLang's float64 test, or bitwise equality to the
baseline) judges the candidate once per case, at one place (_require_contract).
torch is imported lazily: the runner reads the status names without it.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from . import numerics
from .comparison import INT_POISON, compare_output, describe, non_finite
from ..task.taskrecords import DEFAULT_CONTRACT

PASSED = "PASSED"
INCORRECT = "INCORRECT"
ERROR = "ERROR"
TIMEOUT = "TIMEOUT"
SKIPPED = "SKIPPED"
NOT_CHECKED = "NOT CHECKED"  # a check that could not run here: never a pass
STATUSES = (PASSED, INCORRECT, ERROR, TIMEOUT, SKIPPED, NOT_CHECKED)

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
    numerics: dict[str, Any] | None = None  # the row's numerical contract: its worst ratios, or why not checked

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Refused(Exception):
    """Stops the gate with a verdict: raised from deep inside the checks, caught once by whoever drives the gate
    (the judge; gateinprocess.check_workload in tests)."""

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


@dataclass
class CaseView:
    """One case as the gate sees it: each side's inputs and outputs, the pristine inputs, and how to call a side.

    In the judge each side's tensors are shared with that side's process and `call` is a round trip to it;
    in-process (gateinprocess.py, for tests) both sides share the case and `call` is the adapter's function.
    `call(side)` runs one call and returns the problem the call itself reported (an output it replaced,
    reshaped or retyped), or None.
    """

    label: str  # "seed 3", "timing case 2": where a failure happened
    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    pristine: dict[str, Any]
    call: Callable[[str], dict[str, Any] | None]
    atol: float
    rtol: float
    mutates: tuple[str, ...] = ()  # inputs a call rewrites in place: restored before it, judged like outputs
    contract: str = DEFAULT_CONTRACT  # the row's `contract`: numerics.CLOSE or numerics.EXACT

    def results(self, side: str) -> dict[str, Any]:
        """What a side's call produced: its outputs and its mutated inputs, by name."""
        return results_of(self.outputs[side], self.inputs[side], self.mutates)


def results_of(outputs: dict[str, Any], inputs: dict[str, Any], mutates: tuple[str, ...]) -> dict[str, Any]:
    return {**outputs, **{name: inputs[name] for name in mutates}}


def mutated_inputs(declared: Any, case: Any, label: str) -> tuple[str, ...]:
    """The inputs a call rewrites in place: the row's `mutates` and the Case's, each a tensor input of the case."""
    import torch

    names = tuple(dict.fromkeys([*(declared or ()), *(getattr(case, "mutates", None) or ())]))
    tensors = [name for name, value in case.inputs.items() if torch.is_tensor(value)]
    outputs = {*case.outputs_baseline, *case.outputs_candidate}
    for name in names:
        if name not in tensors or name in outputs:
            why = "is also an output name" if name in outputs else "is no tensor input of the case"
            _fail(ERROR, f"mutates {name!r} (bench/workloads.toml `mutates` or Case.mutates): {why} — tensor inputs: "
                         f"{', '.join(tensors) or 'none'}", f"{label}, make_case",
                  {"output": name, "kind": "unknown_mutated_input"})
    return names


def restore_mutated(pristine: dict[str, Any], inputs: dict[str, Any], mutates: tuple[str, ...]) -> None:
    """Fresh copies of the mutated inputs, written into the side's own tensors (same addresses)."""
    for name in mutates:
        inputs[name].copy_(pristine[name])


def check_case(adapter: Any, workload: dict[str, Any], view: CaseView, *, device: str,
               largest: dict[str, float], record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both sides on one case, poisoned first, inputs checked after; returns the expected results (detached).

    The results are the outputs and the mutated inputs (restored from the pristine copy before each call).
    record: the row's numerics record (numerics.new_record), filled case after case; None: this case's alone."""
    label = view.label
    for side in ("baseline", "candidate"):
        restore_mutated(view.pristine, view.inputs[side], view.mutates)
        run_side(view, side, device)
        require_inputs_untouched(side, label, view.pristine, view.inputs[side], skip=view.mutates)
    baseline_out, candidate_out = view.results("baseline"), view.results("candidate")
    expected = judge_results(adapter, workload, label, reference_inputs(view.inputs["baseline"], view.pristine),
                             baseline_out, baseline_out, candidate_out, view.atol, view.rtol, device=device,
                             largest=largest)
    _require_contract(adapter, workload, view, device, largest,
                      record if record is not None else numerics.new_record(view.contract))
    return {name: expected[name].detach().clone() for name in baseline_out}


def judge_results(adapter: Any, workload: dict[str, Any], label: str, fresh_inputs: dict[str, Any],
                  layout: dict[str, Any], baseline_out: dict[str, Any], candidate_out: dict[str, Any], atol: float,
                  rtol: float, *, device: str, largest: dict[str, float]) -> dict[str, Any]:
    """The rule for one case's results, wherever the calls ran (the judge's sides, the audit's profiled calls): the
    adapter's reference on `fresh_inputs` when it has one, which the baseline must agree with (else ERROR), or
    else the baseline's results; the candidate's must agree with it (else INCORRECT). `layout` gives each result's
    name, shape and dtype. Returns the expected results."""
    if callable(getattr(adapter, "reference", None)):
        expected = guarded(f"{label}, reference", lambda: adapter.reference(workload, fresh_inputs))
        _sync(device, f"{label}, reference")
        _require_usable_reference("reference", label, expected, layout)
        _require_agreement("baseline", label, expected, baseline_out, layout, atol, rtol, status=ERROR, largest={})
    else:
        expected = baseline_out
        _require_usable_reference("baseline", label, expected, layout)
    _require_agreement("candidate", label, expected, candidate_out, layout, atol, rtol, status=INCORRECT,
                       largest=largest)
    return expected


def _require_contract(adapter: Any, workload: dict[str, Any], view: CaseView, device: str, largest: dict[str, float],
                      record: dict[str, Any]) -> None:
    """The row's numerical contract on top of the floor (numerics.check); a breach is the candidate's INCORRECT,
    its verdict carrying the contract's record and the floor's largest errors (which passed)."""
    reference = getattr(adapter, "reference", None)

    def reference64() -> Any:
        pristine = {name: view.pristine.get(name, value) for name, value in view.inputs["baseline"].items()}
        expected = reference(workload, numerics.float64_inputs(pristine))
        _sync(device, f"{view.label}, float64 reference")
        return expected

    interpreted = not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") == "1"
    problem = numerics.check(record, view.results("baseline"), view.results("candidate"),
                             reference64 if callable(reference) else None, view.label, interpreted)
    if problem is not None:
        name = problem["output"]
        raise Refused(Verdict(INCORRECT, f"candidate output {name!r} breaks the row's numerical contract "
                                         f"({record['contract']}): {problem['detail']}",
                              f"{view.label}, candidate output {name!r}", problem, max_abs_err=dict(largest),
                              numerics=record))


def reference_inputs(inputs: dict[str, Any], pristine: dict[str, Any]) -> dict[str, Any]:
    """The inputs as make_case made them: fresh clones of the pristine tensors, the other values as they are."""
    return {name: pristine[name].clone() if name in pristine else value for name, value in inputs.items()}


def run_side(view: CaseView, side: str, device: str) -> None:
    """Poison, call, and sync (so an asynchronous CUDA fault lands on this call); a reported problem fails it."""
    poison_outputs(view.outputs[side])
    _sync(device, f"{view.label}, before {side}")
    problem = guarded(f"{view.label}, call_{side}", lambda: view.call(side))
    _sync(device, f"{view.label}, call_{side}")
    if problem:
        fail_on_problem(side, view.label, problem)


def fail_on_problem(side: str, label: str, problem: dict[str, Any]) -> None:
    status = INCORRECT if side == "candidate" else ERROR
    name = problem.get("output")
    where = f"{label}, {side} output {name!r}"
    if problem.get("kind") == "replaced":
        _fail(status, f"{side} replaced output {name!r} instead of writing into it (calls are destination-passing)",
              where, {"output": name, "kind": "replaced"})
    _fail(status, f"{side} output {name!r} is wrong: {problem.get('detail') or problem.get('kind')}", where,
          {"output": name, "kind": problem.get("kind"), "detail": problem.get("detail")})


def layout_of(tensor: Any) -> tuple[Any, ...] | None:
    try:
        return (int(tensor.data_ptr()), tuple(tensor.shape), str(tensor.dtype))
    except Exception:  # noqa: BLE001 - not a tensor
        return None


def changed_output(before: dict[str, Any], held: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any] | None:
    """The first output a call replaced, reshaped or retyped instead of writing into it."""
    for name, layout in before.items():
        now = outputs.get(name)
        if now is not held[name]:
            return {"output": name, "kind": "replaced"}
        after = layout_of(now)
        if after is None or layout is None:
            continue
        if after[1] != layout[1]:
            return {"output": name, "kind": "shape", "detail": f"shape {list(after[1])}, expected {list(layout[1])}"}
        if after[2] != layout[2]:
            return {"output": name, "kind": "dtype", "detail": f"dtype {after[2]}, expected {layout[2]}"}
        if after[0] != layout[0]:
            return {"output": name, "kind": "replaced"}
    return None


def require_inputs_untouched(side: str, label: str, pristine: dict[str, Any], inputs: dict[str, Any],
                             skip: tuple[str, ...] = ()) -> None:
    """Every input but the declared mutated ones (`skip`) is bit-identical to the pristine copy."""
    for name, original in pristine.items():
        if name not in skip and not same_bits(original, inputs[name]):
            _fail(
                INCORRECT if side == "candidate" else ERROR,
                f"{side} modified input {name!r}: calls may write only their outputs"
                f"{' and the inputs the row declares in `mutates`' if skip else ''}",
                f"{label}, {side} input {name!r}",
                {"output": name, "kind": "input_modified"},
            )


def _require_usable_reference(label: str, where_label: str, expected: dict[str, Any], layout: dict[str, Any]) -> None:
    """The reference has every output and is finite; otherwise nothing can be judged against it."""
    import torch

    for name in layout:
        value = expected.get(name) if isinstance(expected, dict) else None
        if not torch.is_tensor(value):
            _fail(ERROR, f"{label} gives no tensor for output {name!r}", f"{where_label}, {label} output {name!r}",
                  {"output": name, "kind": "missing"})
        if tuple(value.shape) != tuple(layout[name].shape):
            _fail(ERROR, f"{label} output {name!r} has shape {list(value.shape)}, the outputs {list(layout[name].shape)}",
                  f"{where_label}, {label} output {name!r}", {"output": name, "kind": "shape"})
        bad = non_finite(value)
        if bad is not None:
            _fail(
                ERROR,
                f"{label} output {name!r} is not finite at {bad['index']} ({bad['got']}): it cannot serve as the "
                f"reference{' (unwritten elements stay NaN)' if label == 'baseline' else ''}",
                f"{where_label}, {label} output {name!r}",
                {"output": name, **bad},
            )


def _require_agreement(
    side: str,
    label: str,
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
        where = f"{label}, {side} output {name!r}"
        mismatch = compare_output(expected[name], got[name], reference_layout, atol=atol, rtol=rtol, largest=largest,
                                  name=name)
        if mismatch is not None:
            what = "disagrees with the reference" if side == "baseline" else "is wrong"
            _fail(status, f"{side} output {name!r} {what}: {describe(mismatch)}", where, {"output": name, **mismatch})


# --------------------------------------------------------------------------------------------- helpers


def guarded(where: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the task raises becomes this row's ERROR
        _raise_error(where, exc)


def _sync(device: str, where: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    guarded(where, torch.cuda.synchronize)


class SideFailed(Exception):
    """A side process raised, crashed or broke the protocol: `message` says what, as the side told it."""

    def __init__(self, message: str, traceback_text: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.traceback_text = traceback_text


def _raise_error(where: str, exc: BaseException) -> None:
    if isinstance(exc, SideFailed):  # the exception happened in a side process: its own words and traceback
        raise Refused(Verdict(ERROR, f"{where}: {exc.message}", where, traceback=exc.traceback_text))
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(lines).splitlines()[-TRACEBACK_LINES:]
    raise Refused(Verdict(ERROR, f"{where}: {type(exc).__name__}: {exc}", where, traceback="\n".join(text)))


def _fail(status: str, message: str, where: str, mismatch: dict[str, Any]) -> None:
    raise Refused(Verdict(status, message, where, mismatch))


def _address(tensor: Any) -> int | None:
    try:
        return int(tensor.data_ptr())
    except Exception:  # noqa: BLE001 - not a tensor: reported by the comparison
        return None


def clone_tensors(values: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {name: v.detach().clone() for name, v in values.items() if torch.is_tensor(v)}
