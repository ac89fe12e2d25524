"""Baseline: SGLang's own `fuse_scale_shift_kernel`, behind the task's destination-passing ABI.

The host wrapper and its kernels are upstream's, unmodified and called as they are: `fuse_scale_shift_kernel` of
sglang/kernels/ops/diffusion/modulate/scale_shift_triton.py in the sglang 0.5.23 wheel (task.toml pins it and the
files it imports by sha256; docs/baseline_source.md), imported from baseline/upstream/ through _sglang.py, which
also resolves upstream's platform checks for an NVIDIA GPU. What differs from SGLang calling it:
- the output is the caller's `out` (destination-passing, as the candidate): _sglang.call_into hands upstream's
  `torch.empty_like(x)` the caller's tensor, so nothing more is allocated or copied;
- Triton's interpreter only (TRITON_INTERPRET=1, the CPU smoke run): x and scale are given as views that report
  is_cuda (upstream asserts CUDA tensors and picks its NVIDIA tile on x.is_cuda), and its bfloat16 arithmetic is
  wrong there (it computes on the raw bits: NaN), so when any operand is bfloat16 the wrapper runs on float32 copies
  and the result is rounded into `out`. On a GPU the wrapper always runs on the caller's tensors as given.
"""

from __future__ import annotations

import os

import torch

from ._sglang import call_into, load_upstream, seen_as_cuda

_upstream = load_upstream("sglang.kernels.ops.diffusion.modulate.scale_shift_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def fuse_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    scale_constant: float,
    out: torch.Tensor,
) -> None:
    """out = x * (scale_constant + scale) + shift: upstream's fuse_scale_shift_kernel into `out`."""
    if not _INTERPRETING:
        call_into(out, _upstream.fuse_scale_shift_kernel, x, scale, shift, scale_constant)
        return
    if torch.bfloat16 in (x.dtype, scale.dtype, shift.dtype):
        wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        fuse_scale_shift(x.float(), scale.float(), shift.float(), scale_constant, wide)
        out.copy_(wide)
        return
    call_into(out, _upstream.fuse_scale_shift_kernel, seen_as_cuda(x), seen_as_cuda(scale), shift, scale_constant)
