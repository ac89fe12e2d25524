"""Candidate: rotary embedding of q and k in one launch, tiles of whole (token, head) rows.

Same ABI as baseline/kernel.py: rotary_qk(q, k, cos, sin, q_out, k_out). What changes
(docs/benchmark_method.md has the reasoning):
- one launch for q and k (programs below the q count take q, the rest k);
- a program takes BLOCK_R consecutive (token, head) rows of the flattened [T*H, D] tensor, ~2K
  elements, instead of one 64-pair row; the tile is loaded as one contiguous [BLOCK_R, D] block
  (16-byte accesses) and split into even/odd lanes in registers, where the baseline issues two
  stride-2 loads and two stride-2 stores;
- cos/sin rows are indexed per (token, head) row and hit L1/L2 across the heads of a token;
- 64-bit offsets only where the tensor needs them.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

_TILE_ELEMS = 2048
_INT32_LIMIT = 2**31
# The CPU interpreter runs programs one after another: fewer, larger tiles there.
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _rotate_rows(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    block,
    rows,
    num_heads,
    stride_cos,
    stride_sin,
    HEAD_DIM: tl.constexpr,
    INDEX_64: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    row = block * BLOCK_R + tl.arange(0, BLOCK_R)
    if INDEX_64:
        row = row.to(tl.int64)
    in_rows = row < rows
    token = row // num_heads

    pair = tl.arange(0, HALF)
    cs_mask = in_rows[:, None]
    cos = tl.load(cos_ptr + token[:, None] * stride_cos + pair[None, :], mask=cs_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token[:, None] * stride_sin + pair[None, :], mask=cs_mask, other=0.0).to(tl.float32)

    offs = row[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    x_raw = tl.load(x_ptr + offs, mask=in_rows[:, None], other=0.0)
    x1, x2 = tl.split(tl.reshape(x_raw.to(tl.float32), [BLOCK_R, HALF, 2]))
    o1 = tl.fma(-x2, sin, x1 * cos)
    o2 = tl.fma(x1, sin, x2 * cos)
    out = tl.reshape(tl.join(o1, o2), [BLOCK_R, HEAD_DIM])
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=in_rows[:, None])


@triton.jit
def _rotary_qk_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cos_ptr,
    sin_ptr,
    q_rows,
    k_rows,
    q_heads,
    k_heads,
    q_blocks,
    stride_cos,
    stride_sin,
    HEAD_DIM: tl.constexpr,
    INDEX_64: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < q_blocks:
        _rotate_rows(q_ptr, q_out_ptr, cos_ptr, sin_ptr, pid, q_rows, q_heads, stride_cos, stride_sin, HEAD_DIM, INDEX_64, BLOCK_R)
    else:
        _rotate_rows(
            k_ptr, k_out_ptr, cos_ptr, sin_ptr, pid - q_blocks, k_rows, k_heads, stride_cos, stride_sin, HEAD_DIM, INDEX_64, BLOCK_R
        )


@functools.lru_cache(maxsize=64)
def _block_rows(head_dim: int, total_rows: int) -> tuple[int, int]:
    """(BLOCK_R, num_warps): ~2K elements per program with 4 warps (16 elements, two 16-byte bf16
    accesses per thread); 16K-element tiles on the interpreter, which runs programs one by one."""
    tile = _TILE_ELEMS * (8 if _INTERPRETING else 1)
    block_r = max(1, min(triton.next_power_of_2(total_rows), tile // head_dim))
    return block_r, max(1, min(8, block_r * head_dim // 512))


class _Plan(NamedTuple):
    grid: tuple[int]
    args: tuple[int, ...]  # q_rows, k_rows, q_heads, k_heads, q_blocks, cos row stride, sin row stride
    constexprs: dict


_plans: dict[tuple, _Plan] = {}


def _make_plan(q_shape, k_shape, cos_shape, cos_strides, sin_shape, sin_strides) -> _Plan:
    tokens, q_heads, head_dim = q_shape
    k_heads = k_shape[1]
    assert len(k_shape) == 3 and k_shape[0] == tokens and k_shape[2] == head_dim, "k must be [T, H_k, D] like q"
    assert head_dim % 2 == 0 and triton.next_power_of_2(head_dim) == head_dim, "head_dim must be a power of two"
    assert tuple(cos_shape) == (tokens, head_dim // 2) == tuple(sin_shape), "cos/sin must be [T, D/2]"
    assert cos_strides[1] == 1 and sin_strides[1] == 1, "cos/sin rows must be contiguous"
    q_rows, k_rows = tokens * q_heads, tokens * k_heads
    block_r, num_warps = _block_rows(head_dim, max(q_rows, k_rows))
    q_blocks = triton.cdiv(q_rows, block_r)
    return _Plan(
        grid=(q_blocks + triton.cdiv(k_rows, block_r),),
        args=(q_rows, k_rows, q_heads, k_heads, q_blocks, cos_strides[0], sin_strides[0]),
        constexprs=dict(
            HEAD_DIM=head_dim,
            INDEX_64=max(q_rows, k_rows) * head_dim >= _INT32_LIMIT,
            BLOCK_R=block_r,
            num_warps=num_warps,
        ),
    )


def rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
) -> None:
    """Task ABI: rotate q and k [T, H, D] by the same cos/sin [T, D/2] into q_out and k_out."""
    assert q.is_contiguous() and k.is_contiguous() and q_out.is_contiguous() and k_out.is_contiguous()
    # Shapes and strides decide everything but the pointers: validated and planned once per key.
    key = (q.shape, k.shape, cos.shape, cos.stride(), sin.shape, sin.stride())
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _make_plan(*key)
    _rotary_qk_kernel[plan.grid](q, k, q_out, k_out, cos, sin, *plan.args, **plan.constexprs)
