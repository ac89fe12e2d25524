"""The judge's cases: seeds derived from the run's secret, and each case copied into memory each side may see.

Every case is built in the judge by the adapter's make_case with a seed no side can predict (HMAC of the run's
secret). Each side gets its own copy of the inputs and its own outputs: CUDA IPC from a memory pool of its own,
or memfd shared memory on the CPU; the judge keeps the pristine inputs and the expected outputs to itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .channel import share_cpu_tensor
from .correctness import clone_tensors, restore_mutated, results_of
from ..task.taskspec import SIDES

SEED_BITS = 63


def allocation_order(index: int) -> tuple[str, ...]:
    """Which side goes first for the index-th case (its copies, its context's state) or process pair (its processes
    started, warmed up, primed, their graphs captured): the order alternates, so neither side's memory is always
    placed first. How much of a row's data stays in the L2 depends on where it was placed (one timing case ~0.9 %
    from the next in the warm regime, the same in every pair); harness 2.19 always placed the baseline's first. The
    alternation did not remove the warm regime's offset on the dial's ~18 us A/A row (benchmarks/README.md, "harness
    2.20 and 2.21"), but keeps any first-placed offset from falling on one side only."""
    return SIDES if index % 2 == 0 else tuple(reversed(SIDES))


def per_side(index: int, make: Callable[[str], Any]) -> dict[str, Any]:
    """make(side) for each side, called in allocation_order(index), keyed in SIDES order."""
    made = {side: make(side) for side in allocation_order(index)}
    return {side: made[side] for side in SIDES}


def derive_seed(secret: bytes, workload_id: str, purpose: str, index: int) -> int:
    """A seed nobody can predict without the run's secret (HMAC-SHA256), 63 bits."""
    message = f"{workload_id}\0{purpose}\0{index}".encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big") >> (64 - SEED_BITS)


def make_case_guarded(adapter: Any, params: dict[str, Any], device: str, seed: int, label: str) -> Any:
    """adapter.make_case for one seed, with whatever it raises turned into this row's ERROR at `label`."""
    from .correctness import guarded

    return guarded(f"{label}, make_case", lambda: adapter.make_case(params, device=device, seed=seed))


@dataclass
class SharedCase:
    """One case built by the judge: each side's private copy of the inputs, its outputs, and the truth."""

    id: int
    label: str
    seed: int
    case: Any  # the adapter's Case
    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    pristine: dict[str, Any]
    keep: list[Any] = field(default_factory=list)  # (shared tensor, memfd handle) pairs of CPU tensors
    expected: dict[str, Any] | None = None
    generation: int = 0  # bumped by each in-place refresh of the inputs
    mutates: tuple[str, ...] = ()  # inputs a call rewrites in place: restored from `pristine` before every call
    context: Any = None  # a row with a context: this case's (regimes.ContextCase), once its cold samples are taken

    def results(self, side: str) -> dict[str, Any]:
        return results_of(self.outputs[side], self.inputs[side], self.mutates)

    def restore(self, side: str) -> None:
        restore_mutated(self.pristine, self.inputs[side], self.mutates)

    def close(self) -> None:
        for _tensor, handle in self.keep:
            os.close(handle.fd)
        self.keep.clear()


class Sharing:
    """Copies a case's tensors into memory each side may see: its own CUDA memory pool, or memfd on the CPU.

    A CUDA IPC handle opens a whole allocator segment, not one tensor: without a pool per side, a side could
    read whatever else the judge keeps in the same segment (another side's outputs, the expected ones).
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.pools: dict[str, Any] = {}
        self.isolation = "memfd" if device == "cpu" else "none"
        if device == "cuda":
            import torch

            if hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"):
                self.pools = {side: torch.cuda.MemPool() for side in SIDES}
                self.isolation = "a CUDA memory pool per side"

    @contextmanager
    def pool(self, side: str) -> Iterator[None]:
        if side in self.pools:
            import torch

            with torch.cuda.use_mem_pool(self.pools[side]):
                yield
        else:
            with nullcontext():
                yield

    def copy(self, value: Any, side: str, keep: list[Any]) -> Any:
        import torch

        if not torch.is_tensor(value):
            return value
        if value.device.type == "cpu":
            shared, handle = share_cpu_tensor(value.detach())
            keep.append((shared, handle))
            return shared
        with self.pool(side):
            return copy_with_layout(value.detach())

    def share(self, case: Any, case_id: int, label: str, seed: int, index: int = 0) -> SharedCase:
        """Each side's copy of the case's inputs and its outputs, the sides allocated in allocation_order(index)."""
        keep: list[Any] = []

        def copies(side: str) -> tuple[dict[str, Any], dict[str, Any]]:
            side_outputs = case.outputs_baseline if side == "baseline" else case.outputs_candidate
            return ({name: self.copy(v, side, keep) for name, v in case.inputs.items()},
                    {name: self.copy(v, side, keep) for name, v in side_outputs.items()})

        both = per_side(index, copies)
        inputs, outputs = ({side: pair[k] for side, pair in both.items()} for k in (0, 1))
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return SharedCase(case_id, label, seed, case, inputs, outputs, clone_tensors(case.inputs), keep)


def copy_with_layout(tensor: Any) -> Any:
    """A copy with the same shape, strides and storage offset (a view stays a view of its own whole storage)."""
    import torch

    storage = tensor.untyped_storage()
    fresh = torch.empty(max(1, storage.nbytes()), dtype=torch.uint8, device=tensor.device).untyped_storage()
    if storage.nbytes():
        fresh.copy_(storage)
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(fresh, tensor.storage_offset(), tensor.shape,
                                                                        tensor.stride())
