"""Adapter for the rotary embedding task (docs/task-contract.md).

A row's keys (bench/workloads.toml):
  tokens      T
  heads       query heads H
  k_heads     key heads (default: heads)
  head_dim    D (a power of two)
  dtype       q, k and output dtype
  atol, rtol  tolerance against the float64 reference
Inputs: q [T, H, D], k [T, H_k, D], cos/sin [T, D/2] float32 (of random angles). Outputs q_out and
k_out. Both sides expose rotary_qk(q, k, cos, sin, q_out, k_out), which rotates adjacent pairs
(x[2i], x[2i+1]) -- upstream's default, the non-neox path of SGLang's diffusion models.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch

from kpremote.agent.contract import Case

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_TOLERANCE = 1e-2  # correctness contract, rotary embedding
_sides: dict[str, ModuleType] = {}


def bind(*, baseline: ModuleType, candidate: ModuleType) -> None:
    _sides["baseline"] = baseline
    _sides["candidate"] = candidate


def _shapes(workload: dict) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int]]:
    tokens, dim = workload["tokens"], workload["head_dim"]
    heads = workload["heads"]
    return (tokens, heads, dim), (tokens, workload.get("k_heads", heads), dim), (tokens, dim // 2)


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = _DTYPES[workload["dtype"]]
    q_shape, k_shape, cs_shape = _shapes(workload)
    angles = torch.rand(cs_shape, generator=gen, device=device, dtype=torch.float32) * (2 * math.pi)
    inputs = {
        "q": torch.randn(q_shape, generator=gen, device=device, dtype=torch.float32).to(dtype),
        "k": torch.randn(k_shape, generator=gen, device=device, dtype=torch.float32).to(dtype),
        "cos": torch.cos(angles),
        "sin": torch.sin(angles),
    }

    def fresh_outputs() -> dict[str, torch.Tensor]:
        return {"q_out": torch.empty_like(inputs["q"]), "k_out": torch.empty_like(inputs["k"])}

    return Case(
        inputs=inputs,
        outputs_baseline=fresh_outputs(),
        outputs_candidate=fresh_outputs(),
        atol=float(workload.get("atol", _TOLERANCE)),
        rtol=float(workload.get("rtol", _TOLERANCE)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    module.rotary_qk(inputs["q"], inputs["k"], inputs["cos"], inputs["sin"], outputs["q_out"], outputs["k_out"])


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", inputs, outputs)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x = x.double()
    cos = cos.double()[:, None, :]
    sin = sin.double()[:, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Exact result in float64."""
    return {
        "q_out": _rotate(inputs["q"], inputs["cos"], inputs["sin"]),
        "k_out": _rotate(inputs["k"], inputs["cos"], inputs["sin"]),
    }


def bytes_moved(workload: dict) -> int:
    """q and k read once and written once; cos and sin (float32) read once."""
    q_shape, k_shape, cs_shape = _shapes(workload)
    size = _DTYPES[workload["dtype"]].itemsize
    return 2 * (math.prod(q_shape) + math.prod(k_shape)) * size + 2 * math.prod(cs_shape) * 4
