"""Baseline: a local port of SGLang's Triton scale/shift modulation kernels.

Follows python/sglang/jit_kernel/diffusion/triton/scale_shift.py (sgl-project/sglang, main):
``fuse_scale_shift_kernel`` (the 3-D broadcast kernel on a (L/128, C/128, B) grid and the autotuned
per-row 4-D kernel) and ``fuse_scale_shift_gate_select01_kernel``. Written for this task from the
upstream semantics and launch structure (block sizes, warps, stages, grids, wrapper-side reshapes);
docs/baseline_source.md says what differs. The one ABI change, mirrored by the candidate: outputs
are passed in last instead of being allocated inside the call.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Two concessions to the CPU smoke run (TRITON_INTERPRET=1), neither active on a GPU: the
# interpreter has no benchmarker, so the autotuner gets a single config; and its bf16 arithmetic
# works on raw bits, so operands are upcast to fp32 before the math (UPCAST) where a GPU run keeps
# upstream's arithmetic in the operands' own precision.
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
_ROW_CONFIGS = [
    triton.Config({"BLOCK_N": 64}, num_warps=2),
    triton.Config({"BLOCK_N": 128}, num_warps=4),
    triton.Config({"BLOCK_N": 256}, num_warps=4),
    triton.Config({"BLOCK_N": 512}, num_warps=4),
    triton.Config({"BLOCK_N": 1024}, num_warps=8),
]


@triton.autotune(configs=_ROW_CONFIGS[-1:] if _INTERPRETING else _ROW_CONFIGS, key=["inner_dim"])
@triton.jit
def _scale_shift_per_frame_kernel(
    out_ptr,
    x_ptr,
    scale_ptr,  # [B*F, C] compact, one row per frame
    shift_ptr,  # [B*L, C], one row per token
    scale_constant: tl.constexpr,
    rows,
    inner_dim,
    seq_len,
    num_frames,
    frame_seqlen,
    UPCAST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_row = cols < inner_dim

    batch = row // seq_len
    frame = (row % seq_len) // frame_seqlen
    scale_row = batch * num_frames + frame

    x = tl.load(x_ptr + row * inner_dim + cols, mask=in_row, other=0.0)
    scale = tl.load(scale_ptr + scale_row * inner_dim + cols, mask=in_row, other=0.0)
    shift = tl.load(shift_ptr + row * inner_dim + cols, mask=in_row, other=0.0)
    if UPCAST:
        x, scale, shift = x.to(tl.float32), scale.to(tl.float32), shift.to(tl.float32)
    constant = tl.full([BLOCK_N], scale_constant, dtype=scale.dtype)
    tl.store(out_ptr + row * inner_dim + cols, x * (constant + scale) + shift, mask=in_row)


@triton.jit
def _scale_shift_blc_kernel(
    x_ptr,
    shift_ptr,
    scale_ptr,
    scale_constant: tl.constexpr,
    y_ptr,
    B,
    L,
    C,
    stride_x_b,
    stride_x_l,
    stride_x_c,
    stride_sh_b,
    stride_sh_l,
    stride_sh_c,
    stride_sc_b,
    stride_sc_l,
    stride_sc_c,
    SCALE_IS_SCALAR: tl.constexpr,
    SHIFT_IS_SCALAR: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_l = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_b = tl.program_id(2)
    l_idx = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    c_idx = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (l_idx < L)[:, None] & (c_idx < C)[None, :]

    x_off = pid_b * stride_x_b + l_idx[:, None] * stride_x_l + c_idx[None, :] * stride_x_c
    x = tl.load(x_ptr + x_off, mask=mask, other=0)

    if SHIFT_IS_SCALAR:
        shift_value = tl.load(shift_ptr)
        shift = tl.full((BLOCK_L, BLOCK_C), shift_value, dtype=shift_value.dtype)
    else:
        sh_off = pid_b * stride_sh_b + l_idx[:, None] * stride_sh_l + c_idx[None, :] * stride_sh_c
        shift = tl.load(shift_ptr + sh_off, mask=mask, other=0)

    if SCALE_IS_SCALAR:
        scale_value = tl.load(scale_ptr)
        scale = tl.full((BLOCK_L, BLOCK_C), scale_value, dtype=scale_value.dtype)
    else:
        sc_off = pid_b * stride_sc_b + l_idx[:, None] * stride_sc_l + c_idx[None, :] * stride_sc_c
        scale = tl.load(scale_ptr + sc_off, mask=mask, other=0)

    if UPCAST:
        x, scale, shift = x.to(tl.float32), scale.to(tl.float32), shift.to(tl.float32)
    # Upstream arithmetic: in the operands' own precision (bf16 stays bf16), no fp32 upcast.
    tl.store(y_ptr + x_off, x * (scale_constant + scale) + shift, mask=mask)


@triton.jit
def _gate_select01_kernel(
    x_ptr,
    shift0_ptr,
    scale0_ptr,
    gate0_ptr,
    shift1_ptr,
    scale1_ptr,
    gate1_ptr,
    index_ptr,
    y_ptr,
    gate_out_ptr,
    B,
    L,
    C,
    stride_x_b,
    stride_x_l,
    stride_x_c,
    stride_sh0_b,
    stride_sh0_c,
    stride_sc0_b,
    stride_sc0_c,
    stride_g0_b,
    stride_g0_c,
    stride_sh1_b,
    stride_sh1_c,
    stride_sc1_b,
    stride_sc1_c,
    stride_g1_b,
    stride_g1_c,
    stride_i_b,
    stride_i_l,
    stride_go_b,
    stride_go_l,
    stride_go_c,
    UPCAST: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid_l = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_b = tl.program_id(2)
    l_idx = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    c_idx = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_l = l_idx < L
    in_c = (c_idx < C)[None, :]
    mask = in_l[:, None] & in_c

    x_off = pid_b * stride_x_b + l_idx[:, None] * stride_x_l + c_idx[None, :] * stride_x_c
    x = tl.load(x_ptr + x_off, mask=mask, other=0)
    use_second = tl.load(index_ptr + pid_b * stride_i_b + l_idx * stride_i_l, mask=in_l, other=0)
    use_second = use_second.to(tl.int1)[:, None]

    cols = c_idx[None, :]
    shift0 = tl.load(shift0_ptr + pid_b * stride_sh0_b + cols * stride_sh0_c, mask=in_c, other=0)
    scale0 = tl.load(scale0_ptr + pid_b * stride_sc0_b + cols * stride_sc0_c, mask=in_c, other=0)
    gate0 = tl.load(gate0_ptr + pid_b * stride_g0_b + cols * stride_g0_c, mask=in_c, other=0)
    shift1 = tl.load(shift1_ptr + pid_b * stride_sh1_b + cols * stride_sh1_c, mask=in_c, other=0)
    scale1 = tl.load(scale1_ptr + pid_b * stride_sc1_b + cols * stride_sc1_c, mask=in_c, other=0)
    gate1 = tl.load(gate1_ptr + pid_b * stride_g1_b + cols * stride_g1_c, mask=in_c, other=0)

    shift = tl.where(use_second, shift1, shift0)
    scale = tl.where(use_second, scale1, scale0)
    gate = tl.where(use_second, gate1, gate0)
    if UPCAST:
        x, scale, shift = x.to(tl.float32), scale.to(tl.float32), shift.to(tl.float32)
    tl.store(y_ptr + x_off, x * (1 + scale) + shift, mask=mask)

    go_off = pid_b * stride_go_b + l_idx[:, None] * stride_go_l + c_idx[None, :] * stride_go_c
    tl.store(gate_out_ptr + go_off, gate, mask=mask)


def _as_blc(t: torch.Tensor) -> torch.Tensor:
    """Upstream's broadcast normalisation: scalar stays 1-element, [B,C] gains an L axis."""
    if t.dim() == 0 or (t.dim() == 1 and t.numel() == 1):
        return t.reshape(1)
    if t.dim() == 2:
        return t[:, None, :]
    if t.dim() == 3:
        return t
    raise ValueError("scale/shift must be 0-D, 1-element, 2-D [B,C], 3-D [B,L,C] or 4-D [B,F,1,C]")


def _is_scalar(t: torch.Tensor) -> bool:
    return t.dim() == 1 and t.numel() == 1


def fuse_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    scale_constant: float,
    out: torch.Tensor,
) -> None:
    """out = x * (scale_constant + scale) + shift, with upstream's broadcasting rules."""
    assert x.is_contiguous() and out.is_contiguous()
    assert out.shape == x.shape and out.dtype == x.dtype
    B, L, C = x.shape
    if x.numel() == 0:
        return

    if scale.dim() == 4:
        # scale [B, F, 1, C] per frame; shift per token, viewable as [B*L, C].
        rows = B * L
        num_frames = scale.shape[1]
        assert L % num_frames == 0, "seq_len must be divisible by num_frames for 4-D scale"
        scale_rows = scale.squeeze(2).reshape(-1, C).contiguous()
        shift_rows = shift.reshape(rows, C).contiguous()
        grid = lambda meta: (rows, triton.cdiv(C, meta["BLOCK_N"]))  # noqa: E731
        _scale_shift_per_frame_kernel[grid](
            out.view(rows, C),
            x.view(rows, C),
            scale_rows,
            shift_rows,
            scale_constant,
            rows,
            C,
            L,
            num_frames,
            L // num_frames,
            UPCAST=_INTERPRETING,
        )
        return

    scale_blc = _as_blc(scale)
    shift_blc = _as_blc(shift)
    scale_scalar = _is_scalar(scale_blc)
    shift_scalar = _is_scalar(shift_blc)
    sc_strides = (0, 0, 0) if scale_scalar else scale_blc.expand(B, L, C).stride()
    sh_strides = (0, 0, 0) if shift_scalar else shift_blc.expand(B, L, C).stride()
    if scale_scalar and shift_scalar:
        # Upstream's copy fast path when both scalars are zero (it syncs to read them).
        if not (bool(scale_blc.any().cpu()) or bool(shift_blc.any().cpu())):
            out.copy_(x)
            return

    block_l, block_c = 128, 128
    grid = (triton.cdiv(L, block_l), triton.cdiv(C, block_c), B)
    _scale_shift_blc_kernel[grid](
        x,
        shift_blc if shift_scalar else shift_blc.expand(B, L, C),
        scale_blc if scale_scalar else scale_blc.expand(B, L, C),
        scale_constant,
        out,
        B,
        L,
        C,
        *x.stride(),
        *sh_strides,
        *sc_strides,
        SCALE_IS_SCALAR=scale_scalar,
        SHIFT_IS_SCALAR=shift_scalar,
        UPCAST=_INTERPRETING,
        BLOCK_L=block_l,
        BLOCK_C=block_c,
        num_warps=4,
        num_stages=2,
    )


def fuse_scale_shift_gate_select01(
    x: torch.Tensor,
    scale0: torch.Tensor,
    shift0: torch.Tensor,
    gate0: torch.Tensor,
    scale1: torch.Tensor,
    shift1: torch.Tensor,
    gate1: torch.Tensor,
    index: torch.Tensor,
    out: torch.Tensor,
    gate_out: torch.Tensor,
) -> None:
    """Per token pick modulation set 0 or 1 by index (non-zero = 1); out = x*(1+scale)+shift,
    gate_out = the picked gate broadcast over the token."""
    assert x.is_contiguous()
    assert out.shape == x.shape and gate_out.shape == x.shape
    B, L, C = x.shape
    if any(t.dim() != 2 for t in (scale0, shift0, gate0, scale1, shift1, gate1)):
        raise ValueError("scale0/shift0/gate0/scale1/shift1/gate1 must be 2-D [B, C]")
    if index.dim() != 2:
        raise ValueError("index must be 2-D [B, L]")

    block_l, block_c = 128, 128
    grid = (triton.cdiv(L, block_l), triton.cdiv(C, block_c), B)
    _gate_select01_kernel[grid](
        x,
        shift0,
        scale0,
        gate0,
        shift1,
        scale1,
        gate1,
        index,
        out,
        gate_out,
        B,
        L,
        C,
        *x.stride(),
        *shift0.stride(),
        *scale0.stride(),
        *gate0.stride(),
        *shift1.stride(),
        *scale1.stride(),
        *gate1.stride(),
        *index.stride(),
        *gate_out.stride(),
        UPCAST=_INTERPRETING,
        BLOCK_L=block_l,
        BLOCK_C=block_c,
        num_warps=4,
        num_stages=2,
    )
