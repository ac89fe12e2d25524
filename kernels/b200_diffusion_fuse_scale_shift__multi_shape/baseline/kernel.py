"""Baseline: SGLang's own Triton scale/shift kernels, behind the task's destination-passing ABI.

The kernels are upstream's, unmodified: `fuse_scale_shift_kernel_blc_opt` and `_fused_scale_shift_4d_kernel` of
sglang/kernels/ops/diffusion/modulate/scale_shift_triton.py in the sglang 0.5.23 wheel (task.toml pins it and the
files it imports by sha256; docs/baseline_source.md), imported from baseline/upstream/ through _sglang.py.

`fuse_scale_shift` below is upstream's host wrapper `fuse_scale_shift_kernel` on an NVIDIA GPU, statement for
statement, with these differences (docs/baseline_source.md lists them too):
- the output is the caller's `out` (destination-passing, as the candidate), where upstream allocates
  `output = torch.empty_like(x)` and returns it;
- upstream's platform branches are resolved for an NVIDIA GPU: not the gfx1250 torch fallback, the 4-D shift is the
  per-token [B, L, C] one (the [B, F, 1, C] expansion is its ROCm/XPU branch), and the 3-D tile is always
  `block_c = min(1024, next_pow2(C))`, `block_l = max(1, 4096 // block_c)` (upstream's `x.is_cuda and not is_hip()`
  branch), also when Triton's interpreter runs it on CPU tensors;
- Triton's interpreter only (TRITON_INTERPRET=1, the CPU smoke run): its bfloat16 arithmetic is wrong (it computes on
  the raw bits: NaN), so when any operand is bfloat16 the same kernels run on float32 copies and the result is
  rounded into `out`. On a GPU the kernels always run on the caller's tensors as given.
"""

from __future__ import annotations

import os

import torch
import triton

from ._sglang import load_upstream

_upstream = load_upstream("sglang.kernels.ops.diffusion.modulate.scale_shift_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def fuse_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    scale_constant: float,
    out: torch.Tensor,
) -> None:
    """out = x * (scale_constant + scale) + shift: upstream's fuse_scale_shift_kernel into `out`."""
    if _INTERPRETING and torch.bfloat16 in (x.dtype, scale.dtype, shift.dtype):
        wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        fuse_scale_shift(x.float(), scale.float(), shift.float(), scale_constant, wide)
        out.copy_(wide)
        return
    assert x.is_contiguous()
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()

    B, L, C = x.shape
    output = out
    if x.numel() == 0:
        return

    if scale.dim() == 4:
        # scale/shift: [B, F, 1, C]
        rows = B * L
        x_2d = x.view(rows, C)
        output_2d = output.view(rows, C)
        block_n = max(64, min(512, triton.next_power_of_2(C)))
        num_warps = 2 if block_n == 64 else 4
        grid = (rows, triton.cdiv(C, block_n))
        num_frames = scale.shape[1]
        assert L % num_frames == 0, "seq_len must be divisible by num_frames for 4D scale/shift"
        frame_seqlen = L // num_frames
        # Compact scale [B, F, 1, C] -> [B*F, C] (per-frame)
        scale_reshaped = scale.squeeze(2).reshape(-1, C).contiguous()
        # shift is per-token [B, L, C] -> [B*L, C]
        shift_reshaped = shift.reshape(rows, C).contiguous()
        _upstream._fused_scale_shift_4d_kernel[grid](
            output_2d,
            x_2d,
            scale_reshaped,
            shift_reshaped,
            scale_constant,
            C,
            L,
            num_frames,
            frame_seqlen,
            BLOCK_N=block_n,
            num_warps=num_warps,
        )
        return

    if scale.dim() == 0 or (scale.dim() == 1 and scale.numel() == 1):
        scale_blc = scale.reshape(1)
    elif scale.dim() == 2:
        scale_blc = scale[:, None, :]
    elif scale.dim() == 3:
        scale_blc = scale
    else:
        raise ValueError("scale must be 0D/1D(1)/2D/3D or 4D")

    if shift.dim() == 0 or (shift.dim() == 1 and shift.numel() == 1):
        shift_blc = shift.reshape(1)
    elif shift.dim() == 2:
        shift_blc = shift[:, None, :]
    elif shift.dim() == 3:
        shift_blc = shift
    else:
        shift_blc = shift

    need_scale_scalar = scale_blc.dim() == 1 and scale_blc.numel() == 1
    need_shift_scalar = shift_blc.dim() == 1 and shift_blc.numel() == 1

    if not need_scale_scalar:
        scale_exp = scale_blc.expand(B, L, C)
        s_sb, s_sl, s_sc = scale_exp.stride()
    else:
        s_sb = s_sl = s_sc = 0

    if not need_shift_scalar:
        shift_exp = shift_blc.expand(B, L, C)
        sh_sb, sh_sl, sh_sc = shift_exp.stride()
    else:
        sh_sb = sh_sl = sh_sc = 0

    # If both scalars and both zero, copy fast-path
    if need_scale_scalar and need_shift_scalar:
        if not (scale_blc.any().to("cpu", non_blocking=True) or shift_blc.any().to("cpu", non_blocking=True)):
            output.copy_(x)
            return

    # NVIDIA: rows of up to 1024 channels, 4096 elements per program (upstream's `x.is_cuda and not is_hip()`)
    block_c = min(1024, triton.next_power_of_2(C))
    block_l = max(1, 4096 // block_c)
    grid = (triton.cdiv(L, block_l), triton.cdiv(C, block_c), B)
    _upstream.fuse_scale_shift_kernel_blc_opt[grid](
        x,
        shift_blc if need_shift_scalar else shift_exp,
        scale_blc if need_scale_scalar else scale_exp,
        scale_constant,
        output,
        B,
        L,
        C,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        sh_sb,
        sh_sl,
        sh_sc,
        s_sb,
        s_sl,
        s_sc,
        SCALE_IS_SCALAR=need_scale_scalar,
        SHIFT_IS_SCALAR=need_shift_scalar,
        BLOCK_L=block_l,
        BLOCK_C=block_c,
        num_warps=4,
        num_stages=2,
    )
