"""Types a task's bench/adapter.py shares with the agent (see docs/task-contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Case:
    """One workload instance for one seed: fresh inputs and one output dict per side.

    `mutates` names the inputs a call rewrites in place (added to the row's `mutates` key): each call gets fresh
    copies of them and they are compared like outputs; every other input must stay bit-identical.
    """

    inputs: dict[str, Any]
    outputs_baseline: dict[str, Any]
    outputs_candidate: dict[str, Any]
    atol: float
    rtol: float
    bytes_moved: int | None = None
    flops: int | None = None
    mutates: tuple[str, ...] = ()


@dataclass(frozen=True)
class Context:
    """A row's context (a row's `context` key names one in bench/context.py's CONTEXTS): the op of the model that
    runs before the kernel and the op that runs after it, so the harness can time the kernel where the model runs it
    (docs/task-contract.md, "In-context rows"). Plain functions of explicit tensors: the judge builds the state,
    hands each side its own copy, poisons what they write and checks it, as it does a case's.

    state(workload, inputs, *, device, seed) -> dict: the context's own tensors (what the previous op reads, the next
        op's weights, the buffers it writes), from its seed, once per timing case; `inputs` are the case's (read only)
    before(workload, state, inputs): the previous op, writing the kernel's inputs named in `writes` in place, the way
        the model's previous op leaves them (e.g. a LayerNorm of a hidden state into x)
    after(workload, state, results): the next op, consuming the kernel's results (its outputs and the inputs it
        rewrites in place) and writing the state tensors named in `results` (e.g. the projection's output)
    """

    state: Callable[..., dict[str, Any]]
    before: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], None]
    after: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], None]
    writes: tuple[str, ...]
    results: tuple[str, ...]
