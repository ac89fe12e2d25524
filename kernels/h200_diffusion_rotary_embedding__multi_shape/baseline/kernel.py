"""Baseline: SGLang's own Triton rotary embedding, behind the task's destination-passing ABI.

The host wrapper and its kernel are upstream's, unmodified and called as they are: `apply_rotary_embedding` and
its autotuned `_rotary_embedding_kernel` of sglang/kernels/ops/diffusion/rope/rotary_triton.py in the sglang 0.5.23
wheel (task.toml pins it and the file it imports by sha256; docs/baseline_source.md), imported from
baseline/upstream/ through _sglang.py. What differs from SGLang calling it:
- the output is the caller's `out` (destination-passing, as the candidate): _sglang.call_into hands upstream's
  `torch.empty_like(x)` the caller's tensor, so nothing more is allocated or copied;
- `interleaved` is upstream's default False (the path the task's rows take: cos/sin are [T, D/2]);
- Triton's interpreter only (TRITON_INTERPRET=1, the CPU smoke run): the autotuner needs a GPU benchmarker, so for
  the call the module's kernel is the one under the autotuner (`.fn`), launched with upstream's first config
  (BLOCK_HEADS 1, BLOCK_HS_HALF 32, 2 warps). On a GPU the autotuner picks among upstream's five configs, keyed on
  (num_heads, head_size), as in SGLang.
The task ABI rotates q and k in one call; like SGLang's rotary embedding layers (query, then key), that is two
upstream calls, one per tensor.
"""

from __future__ import annotations

import os

import torch

from ._sglang import call_into, load_upstream

_upstream = load_upstream("sglang.kernels.ops.diffusion.rope.rotary_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


class _FirstConfig:
    """Triton's interpreter only: the autotuned kernel launched with its first config, no benchmarking."""

    def __init__(self, autotuned) -> None:
        self.autotuned = autotuned

    def __getitem__(self, grid):
        config = self.autotuned.configs[0]
        launch = self.autotuned.fn[grid(config.kwargs)]
        return lambda *args: launch(*args, **config.kwargs, num_warps=config.num_warps)


if _INTERPRETING:
    _upstream._rotary_embedding_kernel = _FirstConfig(_upstream._rotary_embedding_kernel)


def rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
) -> None:
    """Task ABI: rotate q and k [T, H, D] by the same cos/sin [T, D/2] into q_out and k_out."""
    call_into(q_out, _upstream.apply_rotary_embedding, q, cos, sin)
    call_into(k_out, _upstream.apply_rotary_embedding, k, cos, sin)
