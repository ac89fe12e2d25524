"""Adapter for the CuTe DSL norm_scale_shift task (docs/task-contract.md).

out = norm(x) * (1 + scale) + shift, norm = LayerNorm or RMSNorm over the last dim (optional
per-channel weight and bias), as SGLang's fused_norm_scale_shift. Destination-passing: `out` is
allocated here, never inside a call.

A row's keys (bench/workloads.toml):
  shape        [B, S, D] of x (D a multiple of 256, <= 8192: upstream's limit)
  dtype        x, out, weight, bias
  norm_type    "layer" | "rms"
  weight, bias true: a [D] tensor; false: absent from the inputs (None to the call)
  scale_shape  "scalar" [1] | "d" [D] | "bd" [B, D] | "b1d" [B, 1, D] | "bsd" [B, S, D] | "bf1d" [B, F, 1, D]
  frames       F for "bf1d" (S % F == 0)
  scale_dtype  scale and shift dtype
  eps, atol, rtol
Both sides expose fused_norm_scale_shift(x, weight, bias, scale, shift, norm_type, eps, out).
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


def _dtype(workload: dict, key: str = "dtype") -> torch.dtype:
    return _DTYPES[workload[key]]


def modulation_shape(workload: dict) -> tuple[int, ...]:
    B, S, D = workload["shape"]
    form = workload["scale_shape"]
    shapes = {
        "scalar": (1,),
        "d": (D,),
        "bd": (B, D),
        "b1d": (B, 1, D),
        "bsd": (B, S, D),
        "bf1d": (B, int(workload.get("frames", 1)), 1, D),
    }
    if form not in shapes:
        raise ValueError(f"bench/workloads.toml: row {workload.get('id')}: scale_shape = {form!r}")
    return shapes[form]


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    B, S, D = workload["shape"]
    dtype = _dtype(workload)

    def randn(shape: tuple[int, ...], dt: torch.dtype, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (values * std + mean).to(dt)

    mod_shape, mod_dtype = modulation_shape(workload), _dtype(workload, "scale_dtype")
    # a non-zero mean makes LayerNorm's centring matter
    inputs: dict[str, Any] = {
        "x": randn((B, S, D), dtype, mean=0.25),
        "scale": randn(mod_shape, mod_dtype, std=0.5),
        "shift": randn(mod_shape, mod_dtype, std=0.5),
    }
    if workload["weight"]:
        inputs["weight"] = randn((D,), dtype, mean=1.0, std=0.5)
    if workload["bias"]:
        inputs["bias"] = randn((D,), dtype, std=0.5)
    tol = _TOLERANCE[dtype]
    return Case(
        inputs=inputs,
        outputs_baseline={"out": torch.empty_like(inputs["x"])},
        outputs_candidate={"out": torch.empty_like(inputs["x"])},
        atol=float(workload.get("atol", tol)),
        rtol=float(workload.get("rtol", tol)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    module.fused_norm_scale_shift(
        inputs["x"],
        inputs.get("weight"),
        inputs.get("bias"),
        inputs["scale"],
        inputs["shift"],
        workload["norm_type"],
        float(workload["eps"]),
        outputs["out"],
    )


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def _broadcast(t: torch.Tensor, B: int, S: int, D: int) -> torch.Tensor:
    """A scale/shift form as a [B, S, D] float64 view (frames repeated along S)."""
    t = t.double()
    if t.ndim == 4:
        return t[:, :, 0, :].repeat_interleave(S // t.shape[1], dim=1)
    if t.ndim == 2:
        t = t[:, None, :]
    return t.expand(B, S, D)


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Exact result in float64 (biased variance), with the normed value rounded to x's dtype, as
    upstream rounds it before the modulation."""
    x = inputs["x"]
    B, S, D = x.shape
    xd = x.double()
    eps = float(workload["eps"])
    if workload["norm_type"] == "rms":
        y = xd * torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    else:
        centred = xd - xd.mean(dim=-1, keepdim=True)
        y = centred * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
    if "weight" in inputs:
        y = y * inputs["weight"].double()
    if "bias" in inputs:
        y = y + inputs["bias"].double()
    y = y.to(x.dtype).double()
    scale = _broadcast(inputs["scale"], B, S, D)
    shift = _broadcast(inputs["shift"], B, S, D)
    return {"out": y * (1.0 + scale) + shift}


def bytes_moved(workload: dict) -> int:
    """x read and out written once; scale/shift as stored (broadcasts read once); weight, bias."""
    B, S, D = workload["shape"]
    size = _dtype(workload).itemsize
    mod = 1
    for d in modulation_shape(workload):
        mod *= d
    vectors = int(bool(workload["weight"])) + int(bool(workload["bias"]))
    return 2 * B * S * D * size + 2 * mod * _dtype(workload, "scale_dtype").itemsize + vectors * D * size
