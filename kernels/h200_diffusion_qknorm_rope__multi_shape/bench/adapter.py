"""Adapter for the in-place QKNorm + RoPE task (docs/task-contract.md, docs/benchmark_method.md).

The call is SGLang's fused_inplace_qknorm_rope: it rewrites q and k in place and has no output
tensor. The row declares `mutates = ["q", "k"]`; this adapter assumes the harness then
  - hands every call fresh copies of q and k (cloned from the case's pristine inputs),
  - compares the mutated q and k after the call like outputs (shape, dtype, finite, tolerance
    against `reference`), and
  - checks that every other input (weights, cos_sin_cache, positions) is unchanged.
Outputs are therefore empty dicts on both sides.

A row's keys (bench/workloads.toml):
  tokens, q_heads, k_heads, head_dim, rope_dim     q: [tokens, q_heads, head_dim], k likewise
  dtype, cache_dtype, position_dtype               activations/weights, cos_sin_cache, positions
  is_neox, round_norm_before_rope, cache_has_full_width, use_pdl    upstream template arguments
  eps, atol, rtol
Both sides are tvm-ffi (task.toml [build]): each side's `load(*template_args(row))` is the module built
for that row's compile-time arguments, exporting qknorm_rope(q, k, q_weight, k_weight, cos_sin_cache,
positions, eps) = QKNormRopeKernel<args>::run, as SGLang's load_jit builds it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from kpremote.agent.contract import Case

MUTATES = ("q", "k")
_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
}
_sides: dict[str, Any] = {}


def bind(*, baseline: Any, candidate: Any) -> None:
    _sides["baseline"] = baseline
    _sides["candidate"] = candidate


def _dtype(workload: dict, key: str) -> torch.dtype:
    return _DTYPES[workload[key]]


def cache_width(workload: dict) -> int:
    rope_dim = int(workload["rope_dim"])
    return 2 * rope_dim if workload["cache_has_full_width"] else rope_dim


def _cos_sin_cache(workload: dict, gen: torch.Generator, device: str) -> torch.Tensor:
    """One row per position. Half width: [cos | sin] of standard RoPE angles (base 10000).
    Full width: [cos | sin] with an independent angle per entry, so that an element reading its
    neighbour's entry shows up as a mismatch instead of hiding behind duplicated values."""
    rope_dim = int(workload["rope_dim"])
    positions = int(workload["tokens"])
    if workload["cache_has_full_width"]:
        angles = torch.rand((positions, rope_dim), generator=gen, device=device, dtype=torch.float64)
        angles = angles * (2 * math.pi)
    else:
        half = rope_dim // 2
        inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=device, dtype=torch.float64) / half))
        angles = torch.arange(positions, device=device, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return cache.to(_dtype(workload, "cache_dtype")).contiguous()


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = _dtype(workload, "dtype")
    tokens, head_dim = int(workload["tokens"]), int(workload["head_dim"])

    def randn(*shape: int, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (values * std + mean).to(dtype)

    # positions: a permutation, so a kernel that ignores them (uses the token index) fails
    order = torch.randperm(tokens, generator=gen, device=device)
    inputs = {
        "q": randn(tokens, int(workload["q_heads"]), head_dim, std=2.0),
        "k": randn(tokens, int(workload["k_heads"]), head_dim, std=2.0),
        "q_weight": randn(head_dim, mean=1.0, std=0.25),
        "k_weight": randn(head_dim, mean=1.0, std=0.25),
        "cos_sin_cache": _cos_sin_cache(workload, gen, device),
        "positions": order.to(_dtype(workload, "position_dtype")),
    }
    case = Case(
        inputs=inputs,
        outputs_baseline={},
        outputs_candidate={},
        atol=float(workload["atol"]),
        rtol=float(workload["rtol"]),
        bytes_moved=bytes_moved(workload),
    )
    if any(field.name == "mutates" for field in dataclasses.fields(Case)):
        case.mutates = list(MUTATES)  # type: ignore[attr-defined]
    return case


def template_args(workload: dict) -> tuple:
    """QKNormRopeKernel's template arguments, in the order _jit_qknorm_rope_module passes them to
    make_cpp_args (qknorm_rope_jit.py): use_pdl is is_arch_support_pdl() there (true on CC 9.0), and
    half_warp its default, true."""
    return (
        int(workload["head_dim"]),
        int(workload["rope_dim"]),
        bool(workload["is_neox"]),
        bool(workload["use_pdl"]),
        _dtype(workload, "dtype"),
        _dtype(workload, "cache_dtype"),
        bool(workload["round_norm_before_rope"]),
        bool(workload["cache_has_full_width"]),
        True,
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    loader = _sides.get(side)
    if loader is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    loader.load(*template_args(workload)).qknorm_rope(
        inputs["q"],
        inputs["k"],
        inputs["q_weight"],
        inputs["k_weight"],
        inputs["cos_sin_cache"],
        inputs["positions"],
        float(workload["eps"]),
    )


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def _qknorm_rope(workload: dict, x: torch.Tensor, weight: torch.Tensor, inputs: dict) -> torch.Tensor:
    """RMSNorm over head_dim, then RoPE on the first rope_dim elements, in float64. With
    round_norm_before_rope the normed value is rounded to the activation dtype first, as upstream."""
    eps = float(workload["eps"])
    rope_dim = int(workload["rope_dim"])
    half = rope_dim // 2
    full = bool(workload["cache_has_full_width"])
    xd = x.double()
    normed = xd * torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps) * weight.double()
    if workload["round_norm_before_rope"]:
        normed = normed.to(x.dtype).double()

    cache = inputs["cos_sin_cache"].double()[inputs["positions"].long()]  # [tokens, width]
    cos = cache[:, None, : (rope_dim if full else half)]
    sin = cache[:, None, (rope_dim if full else half) :]
    out = normed.clone()
    if workload["is_neox"]:
        lo, hi = normed[..., :half], normed[..., half:rope_dim]
        cos_lo, sin_lo = cos[..., :half], sin[..., :half]
        cos_hi, sin_hi = (cos[..., half:], sin[..., half:]) if full else (cos_lo, sin_lo)
        out[..., :half] = lo * cos_lo - hi * sin_lo
        out[..., half:rope_dim] = hi * cos_hi + lo * sin_hi
    else:
        even, odd = normed[..., 0:rope_dim:2], normed[..., 1:rope_dim:2]
        if full:
            cos_e, cos_o, sin_e, sin_o = cos[..., 0::2], cos[..., 1::2], sin[..., 0::2], sin[..., 1::2]
        else:
            cos_e = cos_o = cos
            sin_e = sin_o = sin
        out[..., 0:rope_dim:2] = even * cos_e - odd * sin_e
        out[..., 1:rope_dim:2] = odd * cos_o + even * sin_o
    return out


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What q and k must hold after the call, in float64 (inputs are the pristine ones)."""
    return {
        "q": _qknorm_rope(workload, inputs["q"], inputs["q_weight"], inputs),
        "k": _qknorm_rope(workload, inputs["k"], inputs["k_weight"], inputs),
    }


def bytes_moved(workload: dict) -> int:
    """q and k read and written once; per token its position and one cos/sin row; both weights."""
    tokens, head_dim = int(workload["tokens"]), int(workload["head_dim"])
    heads = int(workload["q_heads"]) + int(workload["k_heads"])
    size = _dtype(workload, "dtype").itemsize
    per_token = _dtype(workload, "position_dtype").itemsize
    per_token += cache_width(workload) * _dtype(workload, "cache_dtype").itemsize
    return 2 * tokens * heads * head_dim * size + tokens * per_token + 2 * head_dim * size
