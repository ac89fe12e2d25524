"""Candidate side: Z-Image's bf16-native RMSNorm modulations in Triton, every load issued before the reduction.

Same ABI as baseline/kernel.py: rmsnorm_tanh_residual(x, gate, residual, weight, eps, out) writes
residual + tanh(gate) * (RMSNorm(x) * weight) into `out`, rmsnorm_scale(x, weight, scale, eps, out) writes
(RMSNorm(x) * weight) * scale, both on torch's current stream.

One program per row of D, as the baseline. What it does differently:
  - the row's residual, its modulation row and the weight are loaded together with x, before the mean-square
    reduction, so their memory latency overlaps the reduction and its barriers instead of following them (the
    baseline loads them after the reduction);
  - arithmetic is fp32 with an explicit round to bf16 wherever the baseline's bf16 arithmetic rounds (each square,
    the mean square, mean square + eps, rstd, x * rstd, * weight, tanh(gate), the gated product, the sum, the
    scale product), so the result follows the baseline's roundings; the one difference: the squares are summed
    in an fp32 accumulator (the baseline's tl.sum of bf16 values accumulates in bf16 in Triton 3.9's
    _pick_sum_dtype);
  - the warp count follows the row length (4 warps up to 1024 columns, 8 up to 4096, 16 above) instead of 8 for all.
Triton's interpreter (the CPU smoke run) computes bf16 arithmetic on raw 16-bit integers and truncates an fp32 -> bf16
cast; this kernel computes in fp32 and, under the interpreter only, rounds on the bits, so it also runs there with the
GPU's rounding.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

MAX_HIDDEN_SIZE = 8192  # one block per row, as the baseline
_ON_BITS = os.environ.get("TRITON_INTERPRET") == "1"  # round to bf16 on the bits: the interpreter's cast truncates


@triton.jit
def _bf16(value, ON_BITS: tl.constexpr):
    """Round an fp32 value to the nearest bf16 (ties to even), kept in fp32: where the baseline's bf16 arithmetic
    rounds. On a GPU a round trip through bf16 (cvt.rn); under Triton's interpreter, whose fp32 -> bf16 cast
    truncates, the same rounding done on the bits (finite values only: the inputs are)."""
    if ON_BITS:
        bits = value.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return value.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)


@triton.jit
def _normed_row(x, weight, D, eps, ON_BITS: tl.constexpr):
    """bf16(bf16(x * rstd) * weight), rstd rounded as the baseline rounds it."""
    mean_square = _bf16(tl.sum(_bf16(x * x, ON_BITS), axis=0) / D, ON_BITS)
    rstd = _bf16(tl.rsqrt(_bf16(mean_square + eps, ON_BITS)), ON_BITS)
    return _bf16(_bf16(x * rstd, ON_BITS) * weight, ON_BITS)


@triton.jit
def _tanh_residual_kernel(out_ptr, x_ptr, gate_ptr, residual_ptr, weight_ptr, x_row_stride, gate_row_stride,
                          residual_row_stride, rows_per_gate, D, eps, BLOCK_D: tl.constexpr, ON_BITS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + (row // rows_per_gate) * gate_row_stride + cols, mask=mask, other=0.0)
    residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    tanh_gate = _bf16(2.0 / (1.0 + tl.exp(-2.0 * g)) - 1.0, ON_BITS)
    y = _bf16(residual + _bf16(tanh_gate * _normed_row(x, weight, D, eps, ON_BITS), ON_BITS), ON_BITS)
    tl.store(out_ptr + row * D + cols, y.to(tl.bfloat16), mask=mask)  # exact: y is a bf16 value


@triton.jit
def _scale_kernel(out_ptr, x_ptr, weight_ptr, scale_ptr, x_row_stride, scale_row_stride, rows_per_scale, D, eps,
                  BLOCK_D: tl.constexpr, ON_BITS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + (row // rows_per_scale) * scale_row_stride + cols, mask=mask, other=0.0)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = _bf16(_normed_row(x, weight, D, eps, ON_BITS) * scale.to(tl.float32), ON_BITS)
    tl.store(out_ptr + row * D + cols, y.to(tl.bfloat16), mask=mask)  # exact: y is a bf16 value


def _row_stride(t: torch.Tensor, name: str) -> int:
    """The stride between consecutive rows of D when `t` is read as [rows, D] (its rows evenly spaced)."""
    rows = t.reshape(-1, t.shape[-1]) if t.stride(-1) == 1 else None
    if rows is None or rows.data_ptr() != t.data_ptr() or rows.stride(-1) != 1:
        raise ValueError(f"{name} must be a stack of rows of its last dim with unit stride, got strides {t.stride()}")
    return rows.stride(0)


def _rows(x: torch.Tensor, weight: torch.Tensor, modulation: torch.Tensor, out: torch.Tensor,
          name: str) -> tuple[int, int, int]:
    """(rows of x, rows of x per modulation row, block size), the operands checked."""
    D = x.shape[-1]
    if weight.shape != (D,) or weight.stride(0) != 1 or weight.dtype != torch.bfloat16:
        raise ValueError(f"weight must be a contiguous bfloat16 [{D}], got {tuple(weight.shape)} {weight.dtype}")
    if x.dtype != torch.bfloat16 or modulation.dtype != torch.bfloat16 or not 0 < D <= MAX_HIDDEN_SIZE:
        raise ValueError(f"x and {name} must be bfloat16 with 0 < D <= {MAX_HIDDEN_SIZE}, got {x.dtype}, "
                         f"{modulation.dtype}, D = {D}")
    if modulation.shape[-1] != D or x.numel() % modulation.numel() != 0:
        raise ValueError(f"{name} {tuple(modulation.shape)} is not a whole number of rows of x {tuple(x.shape)}")
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    rows = x.numel() // D
    return rows, rows // (modulation.numel() // D), triton.next_power_of_2(D)


def _warps(block_d: int) -> int:
    return 4 if block_d <= 1024 else 8 if block_d <= 4096 else 16


def rmsnorm_tanh_residual(x: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float, out: torch.Tensor) -> None:
    """out = residual + tanh(gate) * (RMSNorm(x) * weight), bf16-native; each gate row serves a run of x's rows."""
    rows, rows_per_gate, block_d = _rows(x, weight, gate, out, "gate")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual must be {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    if rows == 0:
        return
    _tanh_residual_kernel[(rows,)](
        out, x, gate, residual, weight, _row_stride(x, "x"), _row_stride(gate, "gate"),
        _row_stride(residual, "residual"), rows_per_gate, x.shape[-1], eps, BLOCK_D=block_d, ON_BITS=_ON_BITS,
        num_warps=_warps(block_d))


def rmsnorm_scale(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """out = (RMSNorm(x) * weight) * scale, bf16-native; each scale row serves a run of x's rows."""
    rows, rows_per_scale, block_d = _rows(x, weight, scale, out, "scale")
    if rows == 0:
        return
    _scale_kernel[(rows,)](
        out, x, weight, scale, _row_stride(x, "x"), _row_stride(scale, "scale"), rows_per_scale, x.shape[-1], eps,
        BLOCK_D=block_d, ON_BITS=_ON_BITS, num_warps=_warps(block_d))
