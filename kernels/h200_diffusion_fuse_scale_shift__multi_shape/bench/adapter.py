"""Adapter for the fuse_scale_shift task (docs/task-contract.md).

A row's keys (bench/workloads.toml):
  function        "fuse_scale_shift" (the only one: sglang 0.5.23 has no standalone gate_select01 scale/shift
                  kernel any more, docs/baseline_source.md)
  shape           [B, L, C] of x (contiguous, as upstream asserts)
  dtype           x and output dtype
  mod_dtype       scale/shift dtype; default = dtype
  layout          how scale and shift are laid out:
                    bcast11     [1, 1, C]            (production qwen / wan)
                    b1c         [B, 1, C]
                    bc          [B, C]               (2-D layout)
                    blc         [B, L, C]            (per token)
                    bf1c        scale [B, F, 1, C] per frame, shift [B, L, C] per token (4-D layout)
                    chunk2_b1c  both halves of one [B, 1, 2C] tensor (non-contiguous views)
                    chunk2_blc  both halves of one [B, L, 2C] tensor (non-contiguous views)
                    scalar      0-D tensors
                    gate_residual  scale [1, 1, C] (mod_dtype), shift [B, L, C] (dtype): the model's call on a CUDA
                                host, MulAdd: out = mlp_out * gate + residual (scale_constant 0; docs/model-context.md)
  num_frames      F for bf1c
  scale_constant  0 or 1: out = x * (scale_constant + scale) + shift
  atol, rtol      tolerance against the float64 reference
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


def _check_function(workload: dict) -> None:
    function = workload.get("function", "fuse_scale_shift")
    if function != "fuse_scale_shift":
        raise ValueError(f"function = {function!r}: this task times fuse_scale_shift only (SGLang 0.5.23 has no "
                         "standalone gate_select01 kernel; docs/baseline_source.md)")


def _dims(workload: dict) -> tuple[int, int, int]:
    batch, tokens, channels = workload["shape"]
    return batch, tokens, channels


def _dtype(workload: dict) -> torch.dtype:
    return _DTYPES[workload["dtype"]]


def _mod_dtype(workload: dict) -> torch.dtype:
    return _DTYPES[workload.get("mod_dtype", workload["dtype"])]


def _modulation_shapes(workload: dict) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]:
    """(scale shape, shift shape, shape of the one tensor both are chunked from, or None)."""
    B, L, C = _dims(workload)
    layout = workload["layout"]
    plain = {"bcast11": (1, 1, C), "b1c": (B, 1, C), "bc": (B, C), "blc": (B, L, C), "scalar": ()}
    if layout in plain:
        return plain[layout], plain[layout], None
    if layout == "bf1c":
        return (B, workload["num_frames"], 1, C), (B, L, C), None
    if layout == "gate_residual":
        return (1, 1, C), (B, L, C), None
    if layout == "chunk2_b1c":
        return (B, 1, C), (B, 1, C), (B, 1, 2 * C)
    if layout == "chunk2_blc":
        return (B, L, C), (B, L, C), (B, L, 2 * C)
    raise ValueError(f"unknown layout {layout!r}")


def _randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: str, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def _make_inputs(workload: dict, device: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    B, L, C = _dims(workload)
    inputs = {"x": _randn((B, L, C), _dtype(workload), gen, device)}
    mod = _mod_dtype(workload)
    scale_shape, shift_shape, chunked_from = _modulation_shapes(workload)
    if chunked_from is not None:
        inputs["scale"], inputs["shift"] = _randn(chunked_from, mod, gen, device, std=0.5).chunk(2, dim=-1)
    elif workload["layout"] == "gate_residual":  # the residual stream is a [B, L, C] activation of x's dtype
        inputs["scale"] = _randn(scale_shape, mod, gen, device, std=0.5)
        inputs["shift"] = _randn(shift_shape, _dtype(workload), gen, device)
    else:
        inputs["scale"] = _randn(scale_shape, mod, gen, device, std=0.5)
        inputs["shift"] = _randn(shift_shape, mod, gen, device, std=0.5)
    return inputs


def _empty_outputs(workload: dict, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"out": torch.empty_like(x)}


def make_case(workload: dict, *, device: str, seed: int) -> Case:
    _check_function(workload)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    inputs = _make_inputs(workload, device, gen)
    default_tol = _TOLERANCE[_dtype(workload)]
    return Case(
        inputs=inputs,
        outputs_baseline=_empty_outputs(workload, inputs["x"]),
        outputs_candidate=_empty_outputs(workload, inputs["x"]),
        atol=float(workload.get("atol", default_tol)),
        rtol=float(workload.get("rtol", default_tol)),
        bytes_moved=bytes_moved(workload),
    )


def _call(side: str, workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    module = _sides.get(side)
    if module is None:
        raise RuntimeError("bench/adapter.py: bind(baseline=..., candidate=...) was not called")
    module.fuse_scale_shift(inputs["x"], inputs["scale"], inputs["shift"], workload["scale_constant"], outputs["out"])


def call_baseline(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("baseline", workload, inputs, outputs)


def call_candidate(workload: dict, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    _call("candidate", workload, inputs, outputs)


def _broadcast_blc(t: torch.Tensor, B: int, L: int, C: int) -> torch.Tensor:
    """float64 [B, L, C] view of a modulation under upstream's broadcasting rules."""
    t = t.double()
    if t.dim() == 4:  # [B, F, 1, C] per frame
        return t.squeeze(2).repeat_interleave(L // t.shape[1], dim=1).expand(B, L, C)
    if t.dim() <= 1:
        return t.reshape(1, 1, 1).expand(B, L, C)
    if t.dim() == 2:
        return t[:, None, :].expand(B, L, C)
    return t.expand(B, L, C)


def reference(workload: dict, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Exact result in float64."""
    B, L, C = _dims(workload)
    x = inputs["x"].double()
    scale = _broadcast_blc(inputs["scale"], B, L, C)
    shift = _broadcast_blc(inputs["shift"], B, L, C)
    return {"out": x * (float(workload["scale_constant"]) + scale) + shift}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bytes_moved(workload: dict) -> int:
    """Each input read once (the modulation at its stored size), each output written once."""
    B, L, C = _dims(workload)
    x_bytes = B * L * C * _dtype(workload).itemsize
    mod_size = _mod_dtype(workload).itemsize
    scale_shape, shift_shape, _ = _modulation_shapes(workload)
    shift_size = _dtype(workload).itemsize if workload["layout"] == "gate_residual" else mod_size
    return 2 * x_bytes + _numel(scale_shape) * mod_size + _numel(shift_shape) * shift_size
