"""Baseline: SGLang's own Z-Image norm modulation kernels (Triton), behind the task's destination-passing ABI.

The host wrappers and their kernels are upstream's, unmodified and called as they are: `rmsnorm_tanh_residual`
and `rmsnorm_scale` of sglang/kernels/ops/diffusion/norm/native_bf16_rmsnorm_triton.py in the sglang 0.5.23 wheel
(task.toml pins it, and the common/fast_launch.py it imports, by sha256; docs/baseline_source.md), imported from
baseline/upstream/ through _sglang.py. They are what Z-Image's `zimage_rmsnorm_tanh_mul_add` (the residual
modulation, x = residual + tanh(gate) * RMSNorm(attn_out)) and `zimage_rmsnorm_scale` (the norm before attention
and FFN, RMSNorm(x) * (1 + scale)) call in runtime/models/dits/zimage.py.

What differs from SGLang calling them:
- the output is the caller's `out` (destination-passing, as the candidate): _sglang.call_into hands upstream's one
  `torch.empty_like` (its output) the caller's tensor;
- the wrappers are called undecorated (`__wrapped__`): upstream's @replay_launches host cache would, from the
  second call of a signature on, relaunch the recorded kernels on an output it allocates itself
  (torch.empty_strided inside fast_launch.py), which no caller's `out` can take. It saves host time only (same
  kernels, grids and arguments: its docstring); docs/benchmark_method.md says what that means for the timings;
- a wrapper that returns None (an operand its guards refuse: not bf16, D > 8192, ...) is an error here, where
  SGLang would fall back to torch ops: call_into refuses a call that did not write into `out`;
- not under Triton's interpreter (TRITON_INTERPRET=1, the CPU smoke run): triton 3.9's interpreter keeps bfloat16
  values as raw 16-bit integers and computes on those bits (interpreter.py: "bfloat16 types are stored as uint16"),
  and upstream's kernels do their arithmetic in bf16 on purpose, so every call there raises, in one line, instead
  of returning numbers that are not upstream's. The baseline is checked on a GPU only.
"""

from __future__ import annotations

import os

import torch

from ._sglang import call_into, load_upstream

_upstream = load_upstream("sglang.kernels.ops.diffusion.norm.native_bf16_rmsnorm_triton")
_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
INTERPRETER_REFUSAL = ("the baseline cannot run under Triton's interpreter: it computes bfloat16 arithmetic on raw "
                       "16-bit integers, and upstream's kernels compute in bf16; check this task on a GPU")


def _refuse_under_the_interpreter() -> None:
    if _INTERPRETING:
        raise RuntimeError(INTERPRETER_REFUSAL)


def rmsnorm_tanh_residual(x: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float, out: torch.Tensor) -> None:
    """Task ABI: out = residual + tanh(gate) * (RMSNorm(x) * weight), bf16-native; each gate row serves a run of x's rows."""
    _refuse_under_the_interpreter()
    call_into(out, _upstream.rmsnorm_tanh_residual.__wrapped__, x, gate, residual, weight, eps)


def rmsnorm_scale(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Task ABI: out = (RMSNorm(x) * weight) * scale, bf16-native; each scale row serves a run of x's rows."""
    _refuse_under_the_interpreter()
    call_into(out, _upstream.rmsnorm_scale.__wrapped__, x, weight, scale, eps)
