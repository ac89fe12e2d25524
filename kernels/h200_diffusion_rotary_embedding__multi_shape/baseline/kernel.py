"""Baseline: a local port of SGLang's diffusion Triton rotary embedding.

Follows python/sglang/jit_kernel/diffusion/triton/rotary.py (sgl-project/sglang, main):
``apply_rotary_embedding`` and its autotuned ``_rotary_embedding_kernel``. Upstream's default
(and the path SGLang's diffusion models take for non-neox RoPE) rotates adjacent pairs
(x[2i], x[2i+1]) by cos[t, i] / sin[t, i], in fp32 with fma, one program per (token, head) row
looping over the half head in BLOCK_HS_HALF chunks. Written for this task from those semantics
and that launch structure. The task ABI rotates q and k in one call; like SGLang's
rotary_embedding (query, then key) this side makes one upstream launch per tensor. Outputs are
passed in instead of being allocated inside the call.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The interpreter has no benchmarker, so the autotuner must not be asked to choose (CPU smoke
# run only); GPU runs keep the upstream list.
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
_CONFIGS = [
    triton.Config({"BLOCK_HS_HALF": 32}, num_warps=2),
    triton.Config({"BLOCK_HS_HALF": 64}, num_warps=4),
    triton.Config({"BLOCK_HS_HALF": 128}, num_warps=4),
    triton.Config({"BLOCK_HS_HALF": 256}, num_warps=8),
]


@triton.autotune(configs=_CONFIGS[1:2] if _INTERPRETING else _CONFIGS, key=["head_size"])
@triton.jit
def _rotary_row_kernel(
    out_ptr,
    x_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    head_size,
    num_tokens,
    stride_x_row,
    stride_cos_row,
    stride_sin_row,
    BLOCK_HS_HALF: tl.constexpr,
):
    row = tl.program_id(0)
    token = (row // num_heads) % num_tokens
    x_row = x_ptr + row * stride_x_row
    out_row = out_ptr + row * stride_x_row
    cos_row = cos_ptr + token * stride_cos_row
    sin_row = sin_ptr + token * stride_sin_row

    half = head_size // 2
    for start in range(0, half, BLOCK_HS_HALF):
        pairs = start + tl.arange(0, BLOCK_HS_HALF)
        mask = pairs < half
        cos = tl.load(cos_row + pairs, mask=mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_row + pairs, mask=mask, other=0.0).to(tl.float32)
        x1_raw = tl.load(x_row + 2 * pairs, mask=mask, other=0.0)
        x2_raw = tl.load(x_row + 2 * pairs + 1, mask=mask, other=0.0)
        x1 = x1_raw.to(tl.float32)
        x2 = x2_raw.to(tl.float32)
        o1 = tl.fma(-x2, sin, x1 * cos)
        o2 = tl.fma(x1, sin, x2 * cos)
        tl.store(out_row + 2 * pairs, o1.to(x1_raw.dtype), mask=mask)
        tl.store(out_row + 2 * pairs + 1, o2.to(x2_raw.dtype), mask=mask)


def apply_rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
    """Upstream's wrapper for one tensor: x [T, H, D] (or [B, T, H, D]), cos/sin [T, D/2]."""
    if x.dim() > 3:
        _, num_tokens, num_heads, head_size = x.shape
    else:
        num_tokens, num_heads, head_size = x.shape
    assert head_size % 2 == 0, "head_size must be divisible by 2"
    rows_in = x.view(-1, head_size)
    rows_out = out.view(-1, head_size)
    cos = cos.contiguous()
    sin = sin.contiguous()
    _rotary_row_kernel[(rows_in.shape[0],)](
        rows_out,
        rows_in,
        cos,
        sin,
        num_heads,
        head_size,
        num_tokens,
        rows_in.stride(0),
        cos.stride(0),
        sin.stride(0),
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
    apply_rotary_embedding(q, cos, sin, q_out)
    apply_rotary_embedding(k, cos, sin, k_out)
