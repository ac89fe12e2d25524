"""How the agent drives __NAME__: fresh inputs per seed, and the same call path for both sides.

Without a `reference` function the baseline's outputs are the reference. Add
`def reference(workload, inputs) -> dict` for an exact (e.g. float64) result when the baseline itself may be off.
"""

import torch

from kpremote.agent.contract import Case

_sides = {}


def bind(*, baseline, candidate):
    """Receives the two built side modules (baseline/kernel.py and solution/kernel.py)."""
    _sides.update(baseline=baseline, candidate=candidate)


def make_case(workload, *, device, seed):
    rows, cols = workload["shape"]
    dtype = getattr(torch, workload["dtype"])
    generator = torch.Generator().manual_seed(seed)  # on the CPU, so every device sees the same inputs

    def random(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    x = random(rows, cols)
    return Case(
        inputs={"x": x, "scale": random(cols), "shift": random(cols)},
        outputs_baseline={"out": torch.empty_like(x)},  # outputs are allocated here, never inside a call
        outputs_candidate={"out": torch.empty_like(x)},
        atol=1e-5,  # a row may override these with atol / rtol in workloads.toml
        rtol=1e-5,
    )


def call_baseline(workload, inputs, outputs):
    _sides["baseline"].scale_shift(inputs["x"], inputs["scale"], inputs["shift"], outputs["out"])


def call_candidate(workload, inputs, outputs):
    _sides["candidate"].scale_shift(inputs["x"], inputs["scale"], inputs["shift"], outputs["out"])


def bytes_moved(workload):
    """Bytes a perfect kernel moves: x read, out written, scale and shift read once."""
    rows, cols = workload["shape"]
    element = torch.empty((), dtype=getattr(torch, workload["dtype"])).element_size()
    return (2 * rows * cols + 2 * cols) * element
