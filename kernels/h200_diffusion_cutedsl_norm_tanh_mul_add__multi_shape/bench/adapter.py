"""Adapter for the Z-Image norm modulation task (docs/task-contract.md): two calls of one bf16-native RMSNorm.

  function = "tanh_residual"  out = residual + tanh(gate) * (RMSNorm(x) * weight)   the residual modulation
  function = "scale"          out = (RMSNorm(x) * weight) * scale                   the norm before attention / FFN
as SGLang's rmsnorm_tanh_residual / rmsnorm_scale (Z-Image's zimage_rmsnorm_tanh_mul_add / zimage_rmsnorm_scale).
RMSNorm(x) = x * rsqrt(mean(x^2) + eps) over the last dim. Destination-passing: `out` is allocated here, never
inside a call.

A row's keys (bench/workloads.toml):
  function     "tanh_residual" | "scale"
  shape        [B, S, D] of x (bfloat16, the only dtype upstream takes; D <= 8192)
  mod_rows     rows of the modulation (gate or scale), each the [D] vector of S * B / mod_rows consecutive rows of x:
               "batch" (B rows, Z-Image's [B, 1, D]) | "token" (B * S rows, [B, S, D]) | "one" (1 row, [1, 1, D])
  mod_layout   "chunk4": the modulation is the second of four chunks along the last dim of one [rows, 4D] tensor
               (Z-Image's gate: adaLN_modulation(...).unsqueeze(1).chunk(4, dim=2), non-contiguous);
               "contiguous": a tensor of its own (Z-Image's scale: 1.0 + scale_msa)
  eps, atol, rtol
Both sides expose rmsnorm_tanh_residual(x, gate, residual, weight, eps, out) and
rmsnorm_scale(x, weight, scale, eps, out).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from kpremote.agent.contract import Case

_TOLERANCE = 5e-2  # the correctness contract's bf16 tolerance (norm_infer), atol and rtol
_FUNCTIONS = ("tanh_residual", "scale")
_sides: dict[str, ModuleType] = {}


def bind(*, baseline: ModuleType, candidate: ModuleType) -> None:
    _sides["baseline"] = baseline
    _sides["candidate"] = candidate


def _function(workload: dict) -> str:
    function = workload.get("function")
    if function not in _FUNCTIONS:
        raise ValueError(f"bench/workloads.toml: row {workload.get('id')}: function = {function!r}, "
                         f"allowed: {', '.join(_FUNCTIONS)}")
    return function


def modulation_rows(workload: dict) -> int:
    B, S, _ = workload["shape"]
    form = workload.get("mod_rows", "batch")
    rows = {"batch": B, "token": B * S, "one": 1}
    if form not in rows:
        raise ValueError(f"bench/workloads.toml: row {workload.get('id')}: mod_rows = {form!r}, "
                         f"allowed: {', '.join(rows)}")
    return rows[form]


def _modulation(workload: dict, randn, mean: float, std: float) -> torch.Tensor:
    """The gate or scale, [rows, 1, D] (or [B, S, D] per token), in the row's layout."""
    B, S, D = workload["shape"]
    rows = modulation_rows(workload)
    shape = (B, S) if rows == B * S else (rows, 1)
    layout = workload.get("mod_layout", "contiguous")
    if layout == "chunk4":
        return randn((*shape, 4 * D), mean, std).chunk(4, dim=-1)[1]
    if layout == "contiguous":
        return randn((*shape, D), mean, std)
    raise ValueError(f"bench/workloads.toml: row {workload.get('id')}: mod_layout = {layout!r}, "
                     "allowed: chunk4, contiguous")


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    B, S, D = workload["shape"]
    function = _function(workload)

    def randn(shape: tuple[int, ...], mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return (values * std + mean).to(torch.bfloat16)

    inputs: dict[str, Any] = {"x": randn((B, S, D), mean=0.25), "weight": randn((D,), mean=1.0, std=0.5)}
    if function == "tanh_residual":
        inputs["gate"] = _modulation(workload, randn, 0.0, 1.0)
        inputs["residual"] = randn((B, S, D))
    else:
        inputs["scale"] = _modulation(workload, randn, 1.0, 0.5)
    return Case(
        inputs=inputs,
        outputs_baseline={"out": torch.empty_like(inputs["x"])},
        outputs_candidate={"out": torch.empty_like(inputs["x"])},
        atol=float(workload.get("atol", _TOLERANCE)),
        rtol=float(workload.get("rtol", _TOLERANCE)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    eps = float(workload["eps"])
    if _function(workload) == "tanh_residual":
        module.rmsnorm_tanh_residual(inputs["x"], inputs["gate"], inputs["residual"], inputs["weight"], eps,
                                     outputs["out"])
    else:
        module.rmsnorm_scale(inputs["x"], inputs["weight"], inputs["scale"], eps, outputs["out"])


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def _per_row(modulation: torch.Tensor, B: int, S: int, D: int) -> torch.Tensor:
    """A gate or scale as [B, S, D] float64: row r of x takes modulation row r // (B * S / rows)."""
    rows = modulation.reshape(-1, D).double()
    return rows.repeat_interleave(B * S // rows.shape[0], dim=0).reshape(B, S, D)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Round float64 values to bf16 and back: a step of upstream's bf16 arithmetic."""
    return t.to(torch.bfloat16).double()


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Z-Image's bf16-native formula (ZImageRMSNorm in bf16, then the modulation), what upstream's kernels claim to
    match: float64 arithmetic rounded to bf16 after each step where they round (each square, the mean square,
    + eps, rstd, x * rstd, * weight, tanh(gate), the gated product, the sum, the scale product). The sum of the
    squares is exact here; the kernels' own accumulation order and precision are what the tolerance covers."""
    x = inputs["x"].double()
    B, S, D = x.shape
    mean_square = _bf16(_bf16(x.square()).sum(dim=-1, keepdim=True) / D)
    rstd = _bf16(torch.rsqrt(_bf16(mean_square + float(workload["eps"]))))
    normed = _bf16(_bf16(x * rstd) * inputs["weight"].double())
    if _function(workload) == "tanh_residual":
        gated = _bf16(_bf16(torch.tanh(_per_row(inputs["gate"], B, S, D))) * normed)
        return {"out": _bf16(inputs["residual"].double() + gated)}
    return {"out": _bf16(normed * _per_row(inputs["scale"], B, S, D))}


def bytes_moved(workload: dict) -> int:
    """x read and out written once (and residual read, for tanh_residual); the modulation rows and weight once."""
    B, S, D = workload["shape"]
    streams = 3 if _function(workload) == "tanh_residual" else 2
    return 2 * (streams * B * S * D + modulation_rows(workload) * D + D)
