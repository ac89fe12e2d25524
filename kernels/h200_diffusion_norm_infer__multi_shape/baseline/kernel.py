"""Baseline: SGLang's own Triton norm kernels, chosen as SGLang's diffusion layers choose them, behind the task's ABI.

The kernels are upstream's, unmodified, from the sglang 0.5.23 wheel (task.toml pins the files by sha256;
docs/baseline_source.md), imported from baseline/upstream/ through _sglang.py:
- LayerNorm: `norm_infer` of sglang/kernels/ops/diffusion/norm/norm_triton.py (its `_norm_infer_kernel`), what
  SGLang's diffusion `LayerNorm.forward_cuda` calls (multimodal_gen/runtime/layers/layernorm.py). It already takes
  `out`, so it is called as is.
- RMSNorm of fp16/bf16 rows with a weight and at most 128 channels: `_rms_norm_tiled_onepass` of
  sglang/kernels/ops/diffusion/norm/rmsnorm_onepass_triton.py, what `RMSNorm.forward_cuda` calls for
  `x.shape[-1] <= 128` (`triton_one_pass_rms_norm`), through its own host wrapper `_triton_one_pass_rms_norm_cuda`, called
  as it is by _sglang.call_into, which hands its `y = torch.empty_like(x)` the caller's `out` (and, on CPU tensors
  under Triton's interpreter only, makes its device guard a no-op: torch.cpu has no device()).
- every other RMSNorm row: `norm_infer(..., is_rms_norm=True)` of norm_triton.py. SGLang's `RMSNorm.forward_cuda`
  sends wider fp16/bf16 rows to sgl-kernel's CUDA `rmsnorm` (a separate package, not in this wheel) and fp32 rows to
  torch; `norm_infer(is_rms_norm=True)` is SGLang's Triton RMSNorm for such rows (its LingBot video RMSNorm site
  uses it for rows wider than 128). docs/baseline_source.md says which row takes which kernel.
The candidate (solution/kernel.cu) is CUDA C++ behind the same Python signature: `[build] kind = {baseline =
"triton", candidate = "cuda"}`, as the rule sheet allows for a Triton baseline.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._sglang import call_into, load_upstream

_norm = load_upstream("sglang.kernels.ops.diffusion.norm.norm_triton")
_onepass = load_upstream("sglang.kernels.ops.diffusion.norm.rmsnorm_onepass_triton")
ONE_PASS_MAX_CHANNELS = 128  # RMSNorm.forward_cuda: `if x.shape[-1] <= 128: triton_one_pass_rms_norm(...)`


def uses_one_pass(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], is_rms_norm: bool) -> bool:
    """The rows SGLang's RMSNorm sends to triton_one_pass_rms_norm."""
    return (is_rms_norm and weight is not None and bias is None and x.dtype in (torch.float16, torch.bfloat16)
            and x.shape[-1] <= ONE_PASS_MAX_CHANNELS)


def norm_infer(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    is_rms_norm: bool,
    out: torch.Tensor,
) -> None:
    """Task ABI: LayerNorm / RMSNorm of x [M, N] into out (weight/bias [N] or None)."""
    if uses_one_pass(x, weight, bias, is_rms_norm):
        call_into(out, _onepass._triton_one_pass_rms_norm_cuda, x, weight, eps)
    else:
        _norm.norm_infer(x, weight, bias, eps, is_rms_norm=is_rms_norm, out=out)
