"""The correctness gate (correctness.py) in one process: both sides called from the adapter itself on `seeds` fresh
cases, as the judge's side processes would be; for tests of the gate's rules (tests/agent/test_inplace.py,
test_adversarial.py). A run never imports it: its gate is the judge's (judge.py drives correctness.check_case over
the side processes)."""

from __future__ import annotations

from typing import Any

from . import numerics
from ..task.taskrecords import DEFAULT_CONTRACT
from .correctness import (PASSED, CaseView, Refused, Verdict, changed_output, check_case, clone_tensors, guarded,
                          layout_of, mutated_inputs)


def check_workload(
    adapter: Any,
    workload: dict[str, Any],
    *,
    device: str,
    seeds: int,
    atol: float | None = None,
    rtol: float | None = None,
) -> Verdict:
    """In one process: run both sides on `seeds` fresh cases and compare (the judge uses check_case directly)."""
    base_seed = int(workload.get("seed", 0))
    mutates = workload.get("mutates")
    largest: dict[str, float] = {}
    record = numerics.new_record(workload.get("contract", DEFAULT_CONTRACT))
    for k in range(seeds):
        seed = base_seed + k
        try:
            case = guarded(f"seed {seed}, make_case", lambda: adapter.make_case(workload, device=device, seed=seed))
            view = in_process_view(adapter, workload, case, f"seed {seed}", atol, rtol,
                                   mutated_inputs(mutates, case, f"seed {seed}"), record["contract"])
            check_case(adapter, workload, view, device=device, largest=largest, record=record)
        except Refused as refused:
            refused.verdict.seeds_checked = k
            return refused.verdict
    return Verdict(PASSED, seeds_checked=seeds, max_abs_err=largest, numerics=record)


def in_process_view(adapter: Any, workload: dict[str, Any], case: Any, label: str, atol: float | None,
                    rtol: float | None, mutates: tuple[str, ...] = (),
                    contract: str = DEFAULT_CONTRACT) -> CaseView:
    """Both sides share the case's inputs, except the mutated ones: each side has its own copy of those."""
    outputs = {"baseline": case.outputs_baseline, "candidate": case.outputs_candidate}
    functions = {"baseline": adapter.call_baseline, "candidate": adapter.call_candidate}
    inputs = {side: {**case.inputs, **{name: case.inputs[name].clone() for name in mutates}} for side in outputs}

    def call(side: str) -> dict[str, Any] | None:
        before = {name: layout_of(t) for name, t in outputs[side].items()}
        held = dict(outputs[side])
        functions[side](workload, dict(inputs[side]), outputs[side])  # a rebound input is not what gets judged
        return changed_output(before, held, outputs[side])

    return CaseView(label, inputs, outputs, clone_tensors(case.inputs), call,
                    float(case.atol if atol is None else atol), float(case.rtol if rtol is None else rtol), mutates,
                    contract)
