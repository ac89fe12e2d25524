"""Baseline: SGLang's own Triton rotary embedding, behind the task's destination-passing ABI.

The kernel is upstream's, unmodified: the autotuned `_rotary_embedding_kernel` of
sglang/kernels/ops/diffusion/rope/rotary_triton.py in the sglang 0.5.23 wheel (task.toml pins it and the file it
imports by sha256; docs/baseline_source.md), imported from baseline/upstream/ through _sglang.py.

`apply_rotary_embedding` below is upstream's host wrapper of the same name, statement for statement, with these
differences (docs/baseline_source.md lists them too):
- the output is the caller's `out` (destination-passing, as the candidate), where upstream allocates
  `output = torch.empty_like(x)` and returns it;
- `interleaved` is upstream's default False (the path the task's rows take: cos/sin are [T, D/2]), so cos and sin
  are only made contiguous;
- Triton's interpreter only (TRITON_INTERPRET=1, the CPU smoke run): the autotuner needs a GPU benchmarker, so the
  kernel under it (`.fn`) is launched with upstream's first config (BLOCK_HEADS 1, BLOCK_HS_HALF 32, 2 warps).
  On a GPU the autotuner picks among upstream's five configs, keyed on (num_heads, head_size), as in SGLang.
The task ABI rotates q and k in one call; like SGLang's rotary embedding layers (query, then key), that is two
upstream launches, one per tensor.
"""

from __future__ import annotations

import os

import torch
import triton

from ._sglang import load_upstream

_upstream = load_upstream("sglang.kernels.ops.diffusion.rope.rotary_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def _launch(grid, *args) -> None:
    kernel = _upstream._rotary_embedding_kernel
    if not _INTERPRETING:
        kernel[grid](*args)
        return
    config = kernel.configs[0]
    kernel.fn[grid(config.kwargs)](*args, **config.kwargs, num_warps=config.num_warps)


def apply_rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
    """Upstream's apply_rotary_embedding(x, cos, sin) into `out`: x [T, H, D] or [B, T, H, D], cos/sin [T, D/2]."""
    assert out.shape == x.shape and out.dtype == x.dtype
    output = out

    if x.dim() > 3:
        bsz, num_tokens, num_heads, head_size = x.shape
    else:
        num_tokens, num_heads, head_size = x.shape
        bsz = 1

    assert head_size % 2 == 0, "head_size must be divisible by 2"

    x_reshaped = x.view(bsz * num_tokens, num_heads, head_size)
    output_reshaped = output.view(bsz * num_tokens, num_heads, head_size)

    cos = cos.contiguous()
    sin = sin.contiguous()

    _launch(
        lambda META: (bsz * num_tokens, triton.cdiv(num_heads, META["BLOCK_HEADS"])),
        output_reshaped,
        x_reshaped,
        cos,
        sin,
        num_heads,
        head_size,
        num_tokens,
        output_reshaped.stride(0),
        output_reshaped.stride(1),
        x_reshaped.stride(0),
        x_reshaped.stride(1),
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
