"""Adapter for the norm_infer task (docs/task-contract.md).

A row's keys (bench/workloads.toml):
  norm        "layer" (LayerNorm) | "rms" (RMSNorm)
  shape       [M, N], or [B, L, C] (flattened to [B*L, C] rows, as the model calls it)
  dtype       x, weight, bias and output dtype
  eps         epsilon inside the square root
  weight      true: per-channel weight [N]; false: none
  bias        true: per-channel bias [N]; false: none
  atol, rtol  tolerance against the float64 reference
Both sides expose norm_infer(x, weight, bias, eps, is_rms_norm, out) (None for an absent
weight or bias), built from <side>/kernel.cu by the agent with the task's one flag list.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from kpremote.agent.contract import Case

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_TOLERANCE = {torch.float16: 5e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}  # correctness contract
_sides: dict[str, ModuleType] = {}


def bind(*, baseline: ModuleType, candidate: ModuleType) -> None:
    _sides["baseline"] = baseline
    _sides["candidate"] = candidate


def _rows_and_channels(workload: dict) -> tuple[int, int]:
    *leading, channels = workload["shape"]
    rows = 1
    for d in leading:
        rows *= d
    return rows, channels


def _dtype(workload: dict) -> torch.dtype:
    return _DTYPES[workload["dtype"]]


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    rows, channels = _rows_and_channels(workload)
    dtype = _dtype(workload)

    def randn(*shape: int, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (values * std + mean).to(dtype)

    # A non-zero mean makes LayerNorm's centring matter.
    inputs = {"x": randn(rows, channels, mean=0.25)}
    if workload["weight"]:
        inputs["weight"] = randn(channels, mean=1.0, std=0.5)
    if workload["bias"]:
        inputs["bias"] = randn(channels, std=0.5)
    default_tol = _TOLERANCE[dtype]
    return Case(
        inputs=inputs,
        outputs_baseline={"out": torch.empty_like(inputs["x"])},
        outputs_candidate={"out": torch.empty_like(inputs["x"])},
        atol=float(workload.get("atol", default_tol)),
        rtol=float(workload.get("rtol", default_tol)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    module.norm_infer(
        inputs["x"],
        inputs.get("weight"),
        inputs.get("bias"),
        float(workload["eps"]),
        workload["norm"] == "rms",
        outputs["out"],
    )


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Exact result in float64: biased variance, as upstream."""
    x = inputs["x"].double()
    if workload["norm"] == "rms":
        y = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + workload["eps"])
    else:
        centred = x - x.mean(dim=-1, keepdim=True)
        y = centred * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + workload["eps"])
    if "weight" in inputs:
        y = y * inputs["weight"].double()
    if "bias" in inputs:
        y = y + inputs["bias"].double()
    return {"out": y}


def bytes_moved(workload: dict) -> int:
    """x read once, out written once, weight and bias read once."""
    rows, channels = _rows_and_channels(workload)
    size = _dtype(workload).itemsize
    vectors = int(bool(workload["weight"])) + int(bool(workload["bias"]))
    return (2 * rows * channels + vectors * channels) * size
