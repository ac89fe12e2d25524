"""Adapter of the dial task: destination-passing calls; the candidate is handed its row's spin."""

import torch

from kpremote.agent.contract import Case

_sides = {}


def bind(*, baseline, candidate):
    _sides.update(baseline=baseline, candidate=candidate)


def make_case(workload, *, device, seed):
    n = int(workload["n"])
    generator = torch.Generator().manual_seed(seed)
    x, scale, shift = (torch.randn(n, generator=generator).to(device) for _ in range(3))
    return Case(inputs={"x": x, "scale": scale, "shift": shift},
                outputs_baseline={"out": torch.empty_like(x)}, outputs_candidate={"out": torch.empty_like(x)},
                atol=1e-5, rtol=1e-5)


def call_baseline(workload, inputs, outputs):
    _sides["baseline"].scale_shift(inputs["x"], inputs["scale"], inputs["shift"], outputs["out"],
                                   spin=int(workload.get("spin", 0)))


def call_candidate(workload, inputs, outputs):
    _sides["candidate"].scale_shift(inputs["x"], inputs["scale"], inputs["shift"], outputs["out"],
                                    spin=int(workload.get("spin", 0)))


def bytes_moved(workload):
    return 4 * int(workload["n"]) * 4  # x, scale, shift read, out written, float32
