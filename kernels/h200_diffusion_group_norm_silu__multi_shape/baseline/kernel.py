"""Baseline: SGLang's own Triton GroupNorm + SiLU, behind the task's destination-passing ABI.

The host wrapper and its kernels are upstream's, unmodified and called as they are: `_triton_group_norm_silu_cuda`
of sglang/kernels/ops/diffusion/norm/group_norm_silu_triton.py in the sglang 0.5.23 wheel (task.toml pins it by
sha256; docs/baseline_source.md), imported from baseline/upstream/ through _sglang.py. It is what SGLang's
`apply_group_norm_silu` (norm/group_norm_silu.py, pinned too) reaches for an affine nn.GroupNorm followed by a
non-inplace nn.SiLU on CUDA tensors without grad (`triton_group_norm_silu` forwards to it); its registration as a
torch custom op is left out by the shim's stand-in, so the dispatcher layer around it is not timed. It takes the
one-pass kernel for groups of fewer than 2**18 elements and the chunked three-kernel path from there.

What differs from SGLang calling it:
- the output is the caller's `out` (destination-passing, as the candidate): _sglang.call_into hands upstream's
  first `torch.empty_like` (its output) the caller's tensor, as a flattened view where upstream flattens;
- the call runs under torch.no_grad(), as SGLang's inference does: upstream takes its Triton path only when grad is
  off (else it returns torch's F.silu(F.group_norm(...)), which call_into refuses: it is not written into `out`);
- Triton's interpreter only (TRITON_INTERPRET=1 without CUDA, the CPU smoke run): x, weight and bias are passed as
  views that report is_cuda (upstream's `_can_use_triton_group_norm_silu` asks for CUDA tensors) and its
  `torch.cuda.device` guard is a no-op; bfloat16 rows run on float32 copies (the interpreter computes bfloat16 on
  raw bits), rounded into `out`. On a GPU the wrapper always runs on the caller's tensors as given.
"""

from __future__ import annotations

import os

import torch

from ._sglang import call_into, load_upstream, seen_as_cuda

_upstream = load_upstream("sglang.kernels.ops.diffusion.norm.group_norm_silu_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def group_norm_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int, eps: float,
                    out: torch.Tensor) -> None:
    """Task ABI: out = silu(group_norm(x, num_groups, weight, bias, eps)), x [B, C, *spatial], weight/bias [C]."""
    if not _INTERPRETING:
        with torch.no_grad():
            call_into(out, _upstream._triton_group_norm_silu_cuda, x, weight, bias, num_groups, eps)
        return
    if x.dtype == torch.bfloat16:
        wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        group_norm_silu(x.float(), weight.float(), bias.float(), num_groups, eps, wide)
        out.copy_(wide)
        return
    with torch.no_grad():
        call_into(out, _upstream._triton_group_norm_silu_cuda, seen_as_cuda(x), seen_as_cuda(weight),
                  seen_as_cuda(bias), num_groups, eps)
