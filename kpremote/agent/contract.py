"""Types a task's bench/adapter.py shares with the agent (see docs/task-contract.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Case:
    """One workload instance for one seed: fresh inputs and one output dict per side."""

    inputs: dict[str, Any]
    outputs_baseline: dict[str, Any]
    outputs_candidate: dict[str, Any]
    atol: float
    rtol: float
    bytes_moved: int | None = None
    flops: int | None = None
