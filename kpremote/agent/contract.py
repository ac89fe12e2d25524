"""Types a task's bench/adapter.py shares with the agent (see docs/task-contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
