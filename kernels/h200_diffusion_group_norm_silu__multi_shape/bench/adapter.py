"""Adapter for the group_norm_silu task (docs/task-contract.md).

A row's keys (bench/workloads.toml):
  shape       [B, C, *spatial]: 2-D [B, C], 3-D [B, C, L], 4-D [B, C, H, W] (image) or 5-D [B, C, T, H, W] (video)
  groups      GroupNorm's num_groups (divides C)
  dtype       x, weight, bias and output dtype
  eps         epsilon inside the square root
  atol, rtol  tolerance against the float64 reference
Both sides expose group_norm_silu(x, weight, bias, num_groups, eps, out): out = silu(group_norm(x)), with an affine
weight and bias [C] (SGLang's fused path is taken only for an affine GroupNorm).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from kpremote.agent.contract import Case

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# The diffusion correctness contract's GroupNorm + SiLU tolerances (atol, rtol).
_TOLERANCE = {torch.float16: (3e-3, 3e-3), torch.bfloat16: (7e-2, 2e-2), torch.float32: (1e-5, 1e-5)}
_sides: dict[str, ModuleType] = {}


def bind(*, baseline: ModuleType, candidate: ModuleType) -> None:
    _sides["baseline"] = baseline
    _sides["candidate"] = candidate


def _dtype(workload: dict) -> torch.dtype:
    return _DTYPES[workload["dtype"]]


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = _dtype(workload)
    channels = workload["shape"][1]

    def randn(shape: list[int], mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (values * std + mean).to(dtype)

    # A non-zero mean makes the centring matter; weight around 1 and bias around 0, as trained norms are.
    inputs = {"x": randn(workload["shape"], mean=0.25), "weight": randn([channels], mean=1.0, std=0.5),
              "bias": randn([channels], std=0.5)}
    atol, rtol = _TOLERANCE[dtype]
    return Case(
        inputs=inputs,
        outputs_baseline={"out": torch.empty_like(inputs["x"])},
        outputs_candidate={"out": torch.empty_like(inputs["x"])},
        atol=float(workload.get("atol", atol)),
        rtol=float(workload.get("rtol", rtol)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    module.group_norm_silu(inputs["x"], inputs["weight"], inputs["bias"], int(workload["groups"]),
                           float(workload["eps"]), outputs["out"])


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Exact result in float64: torch's group_norm (biased variance), then SiLU."""
    y = F.group_norm(inputs["x"].double(), int(workload["groups"]), inputs["weight"].double(),
                     inputs["bias"].double(), float(workload["eps"]))
    return {"out": F.silu(y)}


def bytes_moved(workload: dict) -> int:
    """x read once, out written once, weight and bias read once (the floor: both sides read x more than once)."""
    elements = math.prod(workload["shape"])
    return (2 * elements + 2 * workload["shape"][1]) * _dtype(workload).itemsize
