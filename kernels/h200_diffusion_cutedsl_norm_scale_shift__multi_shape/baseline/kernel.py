"""Baseline side: SGLang's CuTe DSL fused_norm_scale_shift behind the task's destination-passing ABI.

The kernel code is upstream's, unchanged, under ./upstream (sglang 0.5.23, each file
sha256-pinned in docs/baseline_source.md). This file is the local adapter the rule sheet asks for: it runs the same steps as
upstream's `fused_norm_scale_shift` after its Blackwell-only KDA pre-dispatch (validate, broadcast
scale/shift to the BSFD view, scalar placeholders for absent weight/bias, compile once per
ScaleResidualNormScaleShift.make_hash_key, call on torch's current stream), except that the output
is the caller's `out` instead of a torch.empty_like inside the call, as on the candidate side.

The upstream modules import each other as `sglang.kernels.ops.diffusion.norm....`; the packages
above them are registered here as bare namespace packages over ./upstream, so no SGLang package
__init__ runs (and an installed sglang is never used).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Optional

import torch

_UPSTREAM = Path(__file__).resolve().parent / "upstream"
_PACKAGES = (
    "sglang",
    "sglang.kernels",
    "sglang.kernels.ops",
    "sglang.kernels.ops.diffusion",
    "sglang.kernels.ops.diffusion.norm",
    "sglang.kernels.ops.diffusion.norm.cutedsl_common",
)
_modules: dict[str, types.ModuleType] = {}


def _upstream() -> types.ModuleType:
    if "main" not in _modules:
        for name in _PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [str(_UPSTREAM.joinpath(*name.split(".")))]
            sys.modules[name] = package
        _modules["main"] = importlib.import_module("sglang.kernels.ops.diffusion.norm.scale_residual_norm_cutedsl")
        _modules["fusion"] = importlib.import_module("sglang.kernels.ops.diffusion.norm.cutedsl_common.norm_fusion")
    return _modules["main"]


def fused_norm_scale_shift(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                           scale: torch.Tensor, shift: torch.Tensor, norm_type: str, eps: float,
                           out: torch.Tensor) -> None:
    """out = norm(x) * (1 + scale) + shift, norm "layer" or "rms" over the last dim of x [B, S, D]."""
    up = _upstream()
    import cuda.bindings.driver as cuda
    from cutlass import cute

    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    shape = x.shape
    up.validate_x(x, *shape)
    up.validate_weight_bias(weight, shape[-1])
    up.validate_weight_bias(bias, shape[-1])
    up.validate_scale_shift(scale, *shape)
    up.validate_scale_shift(shift, *shape)
    if norm_type not in ("layer", "rms"):
        raise ValueError('norm_type must be one of "layer" and "rms"')
    D = shape[-1]
    if D % 256 != 0 or D > 8192:
        raise ValueError(f"D={D} not supported, must be multiple of 256 and <= 8192")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must be {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    fusion = _modules["fusion"]
    scale = fusion.broadcast_tensor_for_bsfd(scale, *shape)
    shift = fusion.broadcast_tensor_for_bsfd(shift, *shape)
    weight = 1 if weight is None else weight
    bias = 0 if bias is None else bias
    res_out, residual, gate = 0, 0, 1
    torch_tensors = [out, res_out, residual, x, gate, weight, bias, scale, shift]
    chunks_per_warp = up._chunks_per_warp(D, gated_affine=False)
    key = up.ScaleResidualNormScaleShift.make_hash_key(norm_type, chunks_per_warp, *torch_tensors)
    compiled = up._COMPILE_CACHE.get(key)
    if compiled is None:
        kernel = up.ScaleResidualNormScaleShift(D, norm_type, chunks_per_warp)
        fake_args = [up.to_fake_cute_args(t) for t in torch_tensors]
        compiled = cute.compile(kernel, *fake_args, options="--enable-tvm-ffi")
        up._COMPILE_CACHE[key] = compiled
    compiled(*torch_tensors, eps, stream)
