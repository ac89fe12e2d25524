"""A row's context regimes (issue 45): the kernel timed where the model runs it, beside the cold regime.

A row that names a context (its `context` key: an entry of bench/context.py's CONTEXTS, a contract.Context) is timed
in three regimes, each with its own samples, median, interval and verdict (docs/task-contract.md, "In-context rows"):
- `cold`: alone, the L2 flushed before every sample: as every row is (and as it was before contexts existed);
- `warm`: alone, its inputs as the model's previous op leaves them: after the judge's flush the side runs the
  context's before() (untimed) and then times the call alone, so the inputs before() wrote sit in the L2;
- `context`: before() -> call -> after() as one CUDA graph per side (plain calls on the CPU), its replays timed.
The same process pairs, sandbox, seal, ABBA order and verdict rules apply to every regime.

This module is the judge's part of it (and the side's loader of the contexts): per timing case the context's state
(built here from a secret seed; each side gets its own copy, as it does a case's inputs), what before() writes into
the kernel's inputs (computed here, on the pristine inputs; an input the call rewrites in place may be one, as q and
k of an in-place RoPE are the QKV projection's) and the kernel's expected results on those inputs. Before
every sample in a context regime the judge poisons what before() writes (and, in `context`, what after() writes):
a side that skips either leaves the poison, and its checked samples fail. The checked samples compare the kernel's
results with the expected ones, the inputs before() wrote with what it should write, and (in `context`) after()'s
results with what the judge's own after() makes of the side's outputs. Up to MAX_REFRESHES times per regime, before a
checked candidate sample, the judge writes a fresh secret-seeded state into every copy (same addresses): a cache of the
neighbours' results keyed by address goes stale where it is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cases import derive_seed, per_side
from .contexts import COLD, CONTEXT, CONTEXT_REGIMES, REGIMES, WARM, ContextProblem, load_context  # noqa: F401
from .channel import encode_values
from .comparison import compare_output, describe, non_finite
from .correctness import (ERROR, INCORRECT, Refused, Verdict, clone_tensors, guarded, poison_outputs, reference_inputs,
                          run_side, same_bits)
from .rowjudge import RowJudge
from .sideprocess import request_guarded
from ..task.taskspec import SIDES

if TYPE_CHECKING:
    from .cases import SharedCase

HEADLINE_REGIME = COLD  # the regime the headline is computed from (docs/task-contract.md says why)
MAX_REFRESHES = 2  # per regime: times the context's state is rewritten in place before a checked candidate sample
# after()'s results are compared with what the judge's own after() makes of the side's outputs: the same op on the
# same values, in another process (another BLAS thread count on a CPU), so a loose tolerance: what it must catch is a
# skipped after() (the poison left) or one that computed something else.
AFTER_RTOL = 1e-2


@dataclass
class ContextCase:
    """One timing case's context, as the judge keeps it."""

    context: Any  # the contract.Context
    seed: int
    state: dict[str, dict[str, Any]]  # each side's own copy of the state (shared with its processes)
    pristine: dict[str, Any]  # the judge's copy of the state, as built
    written: dict[str, Any] = field(default_factory=dict)  # what before() writes into the kernel's inputs
    expected: dict[str, Any] = field(default_factory=dict)  # the kernel's results on those inputs


def _synchronize(device: str, where: str) -> None:
    """A device-wide sync on a GPU, so an asynchronous fault of the context's ops lands on `where`."""
    if device == "cuda":
        import torch

        guarded(where, torch.cuda.synchronize)


def _fail(side: str, message: str, where: str, mismatch: dict[str, Any]) -> None:
    raise Refused(Verdict(INCORRECT if side == "candidate" else ERROR, message, where, mismatch))


def _error(message: str, where: str) -> None:
    raise Refused(Verdict(ERROR, message, where, {"kind": "context"}))


def prepare(judge: RowJudge, shared: SharedCase, context: Any, index: int) -> None:
    """The case's context: its state built from a secret seed, each side's copy handed to every process of that
    side, and what before() writes and the kernel's expected results on it."""
    import torch

    label = f"{shared.label}, bench/context.py"
    tensors = {name for name, value in shared.case.inputs.items() if torch.is_tensor(value)}
    for name in context.writes:  # an input the call rewrites in place may be one (e.g. q and k of an in-place RoPE)
        if name not in tensors:
            _error(f"bench/context.py: writes {name!r}, which is no tensor input of the case (tensor inputs: "
                   f"{', '.join(sorted(tensors)) or 'none'})", label)
    seed = derive_seed(judge.secret, judge.workload.id, "context", index)
    judge.seeds.setdefault("context", []).append(seed)
    state = _build_state(judge, shared, context, seed, label)
    keep = shared.keep
    copies = per_side(index, lambda side: {name: judge.sharing.copy(value, side, keep) for name, value in state.items()})
    if judge.device == "cuda":
        torch.cuda.synchronize()
    shared.context = ContextCase(context, seed, copies, clone_tensors(state) | _values(state))
    for process in judge.bench.every_process():
        fds: list[int] = []
        command = {"op": "context", "id": shared.id,
                   "state": encode_values(copies[process.side], fds, shared.keep)}
        request_guarded(process, command, f"{label}, handing the context to the {process.side}", fds)
    expect(judge, shared)


def _values(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {name: value for name, value in state.items() if not torch.is_tensor(value)}


def _build_state(judge: RowJudge, shared: SharedCase, context: Any, seed: int, label: str) -> dict[str, Any]:
    import torch

    inputs = reference_inputs(shared.inputs["baseline"], shared.pristine)
    state = guarded(f"{label}, state()", lambda: context.state(judge.params, inputs, device=judge.device, seed=seed))
    _synchronize(judge.device, f"{label}, state()")
    if not isinstance(state, dict) or not all(isinstance(name, str) for name in state):
        _error(f"bench/context.py: state() returned a {type(state).__name__}, not a dict of named tensors", label)
    for name in context.results:
        if not torch.is_tensor(state.get(name)):
            _error(f"bench/context.py: results names {name!r}, which is no tensor of its state "
                   f"({', '.join(sorted(state)) or 'empty'})", label)
    return state


def expect(judge: RowJudge, shared: SharedCase) -> None:
    """What before() writes from the case's pristine inputs (its only writes: every other input stays as it was),
    and the kernel's results on them (the adapter's reference, else the baseline's call)."""
    import torch

    ctx = shared.context
    label = f"{shared.label}, bench/context.py before()"
    inputs = reference_inputs(shared.inputs["baseline"], shared.pristine)
    state = {**ctx.pristine, **clone_tensors(ctx.pristine)}
    guarded(label, lambda: ctx.context.before(judge.params, state, inputs))
    _synchronize(judge.device, label)
    for name, value in inputs.items():
        if name not in ctx.context.writes and torch.is_tensor(value) and not same_bits(value, shared.pristine[name]):
            _error(f"bench/context.py: before() wrote input {name!r}, which its writes do not name", label)
    ctx.written = {name: inputs[name].detach().clone() for name in ctx.context.writes}
    layout = shared.results("baseline")
    if callable(getattr(judge.adapter, "reference", None)):
        expected = guarded(f"{shared.label}, reference (in context)", lambda: judge.adapter.reference(judge.params, inputs))
        _synchronize(judge.device, f"{shared.label}, reference (in context)")
        missing = [name for name in layout if not torch.is_tensor((expected or {}).get(name))]
        if missing:
            _error(f"the reference gave no tensor {missing[0]!r} for the inputs before() wrote", shared.label)
        ctx.expected = {name: expected[name].detach().clone() for name in layout}
    else:
        shared.restore("baseline")  # then what before() wrote: an input the call mutates holds it, not its pristine
        for name, value in ctx.written.items():
            shared.inputs["baseline"][name].copy_(value)
        run_side(judge.view(shared), "baseline", judge.device)
        ctx.expected = {name: t.detach().clone() for name, t in shared.results("baseline").items()}
    for name, value in ctx.expected.items():
        bad = non_finite(value)
        if bad is not None:
            _error(f"the expected result {name!r} on the inputs before() wrote is not finite: {bad['detail']}",
                   f"{shared.label}, in context")


def poison(shared: SharedCase, side: str, regime: str) -> None:
    """Before a sample in a context regime: the inputs before() writes, and in `context` the state after() writes,
    poisoned (the judge already poisoned the outputs): what a side skips stays poison."""
    ctx = shared.context
    poison_outputs({name: shared.inputs[side][name] for name in ctx.context.writes})
    if regime == CONTEXT:
        poison_outputs({name: ctx.state[side][name] for name in ctx.context.results})


def check_sample(judge: RowJudge, shared: SharedCase, side: str, regime: str, when: str) -> None:
    """The sample a side just took in `regime`, checked: the kernel's results, the inputs before() wrote, and in
    `context` what after() wrote."""
    ctx = shared.context
    view = judge.view(shared)
    layout = shared.results("baseline")
    got = shared.results(side)
    where = f"{shared.label}, {side} in its {regime} regime"
    for name, expected in ctx.expected.items():
        mismatch = compare_output(expected, got[name], layout[name], atol=view.atol, rtol=view.rtol, name=name)
        if mismatch is not None:
            _fail(side, f"{side} changed behaviour {when} in the {regime} regime: output {name!r} of a timed call is "
                        f"wrong ({shared.label}): {describe(mismatch)}", f"{where}, output {name!r}",
                  {"output": name, "regime": regime, **mismatch})
    for name, expected in ctx.written.items():
        if name in shared.mutates:  # the call rewrote it: its result, checked above, is the kernel's on what before()
            continue                # wrote (a side that skipped before() ran the kernel on the poison)
        mismatch = compare_output(expected, shared.inputs[side][name], expected, atol=view.atol, rtol=view.rtol,
                                  name=name)
        if mismatch is not None:
            _fail(side, f"{side}: input {name!r} after a sample in the {regime} regime is not what the context's "
                        f"before() writes ({shared.label}): {describe(mismatch)}", f"{where}, input {name!r}",
                  {"input": name, "regime": regime, **mismatch})
    if regime == CONTEXT:
        _check_after(judge, shared, side, got, where)


def _check_after(judge: RowJudge, shared: SharedCase, side: str, got: dict[str, Any], where: str) -> None:
    """after()'s results in the side's state against the judge's own after() on the side's results."""
    import torch

    ctx = shared.context
    state = {**ctx.pristine, **clone_tensors(ctx.pristine)}
    results = clone_tensors(got)
    guarded(f"{where}, the judge's after()", lambda: ctx.context.after(judge.params, state, results))
    _synchronize(judge.device, f"{where}, the judge's after()")
    view = judge.view(shared)
    for name in ctx.context.results:
        expected = state[name]
        scale = float(expected.detach().abs().max().to(torch.float64)) if expected.numel() else 0.0
        mismatch = compare_output(expected, ctx.state[side][name], expected, atol=max(view.atol, AFTER_RTOL * scale),
                                  rtol=max(view.rtol, AFTER_RTOL), name=name)
        if mismatch is not None:
            _fail(side, f"{side}: what the context's after() wrote into {name!r} in a timed context sample is not "
                        f"what it makes of the side's outputs ({shared.label}): {describe(mismatch)}",
                  f"{where}, context result {name!r}", {"context_result": name, "regime": CONTEXT, **mismatch})


def refresh(judge: RowJudge, shared: SharedCase, regime: str) -> None:
    """A fresh secret-seeded state written into the case's state tensors in place (every copy, same addresses), and
    what before() writes and the expected results recomputed: a cache keyed by address goes stale."""
    ctx = shared.context
    index = len(judge.seeds.get("context_refresh", []))
    seed = derive_seed(judge.secret, judge.workload.id, "context_refresh", index)
    fresh = _build_state(judge, shared, ctx.context, seed, f"{shared.label}, bench/context.py (refresh)")
    import torch

    if set(fresh) != set(ctx.pristine) or any(
            torch.is_tensor(v) and (tuple(v.shape) != tuple(fresh[n].shape) or v.dtype != fresh[n].dtype)
            for n, v in ctx.pristine.items()):
        return  # a state of another layout cannot go in place: no refresh
    judge.seeds.setdefault("context_refresh", []).append(seed)
    judge.regime_refreshes[regime] = judge.regime_refreshes.get(regime, 0) + 1
    shared.generation += 1
    for name, value in fresh.items():
        if torch.is_tensor(value):
            ctx.pristine[name].copy_(value)
            for side in SIDES:
                ctx.state[side][name].copy_(value)
    expect(judge, shared)
    if judge.device == "cuda":
        torch.cuda.synchronize()


def check_inputs_after(shared: SharedCase) -> None:
    """After a row's context regimes: the inputs before() writes hold what it writes (compared with the row's
    tolerance: another process's op); every state tensor but after()'s results is as built."""
    ctx = shared.context
    for side in SIDES:
        for name, value in ctx.pristine.items():
            import torch

            if name in ctx.context.results or not torch.is_tensor(value):
                continue
            if not same_bits(value, ctx.state[side][name]):
                _fail(side, f"{side} changed the context's state {name!r} during timing ({shared.label})",
                      f"{shared.label}, {side} context state {name!r}", {"context_state": name, "kind": "changed"})
