"""Where the production rows' kernel runs in the model (harness 2.18: a row's `context` key; docs/task-contract.md,
"In-context rows"; docs/model-context.md names the call sites in the sglang 0.5.23 wheel).

qwen_residual_qkv: Qwen-Image's `img_norm1` / `txt_norm1` (LayerNormScaleShift -> fused_norm_scale_shift: a
LayerNorm without affine, eps 1e-6, then * (1 + scale) + shift), in every block after the first. Around it, by data
flow:
- before: the previous block's gated residual, MulAdd: x = mlp_output * gate2 + residual (bf16, the gate [1, 1, C]);
- after: the attention's QKV projection (`to_qkv` for the image stream, `to_added_qkv` for the text stream: one
  Linear C -> 3C with its bias, bf16) reads out.
The neighbours are plain torch ops written here (addcmul, addmm), not SGLang's code; in the model the gated residual
is the fuse_scale_shift task's Triton kernel. The first block reads `img_in` / `txt_in` instead; Wan's norm1 runs in
block 0 only (blocks 1..39 use another kernel), so the wan row has no context. Weights are random, seeded by the
judge's secret: timing does not depend on their values.
"""

from __future__ import annotations

import torch

from kpremote.agent.contract import Context

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype,
           std: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def qwen_state(workload: dict, inputs: dict, *, device: str, seed: int) -> dict:
    """The previous block's MLP output, gate and residual stream; the QKV projection and its output buffer."""
    B, S, D = workload["shape"]
    dtype = _DTYPES[workload["dtype"]]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return {
        "mlp_output": _randn((B, S, D), gen, device, dtype, std=0.5),
        "gate": _randn((1, 1, D), gen, device, dtype, std=0.5),
        "residual": _randn((B, S, D), gen, device, dtype),
        "qkv_weight": _randn((3 * D, D), gen, device, dtype, std=D ** -0.5),
        "qkv_bias": _randn((3 * D,), gen, device, dtype, std=0.02),
        "qkv": torch.empty((B, S, 3 * D), dtype=dtype, device=device),
    }


def qwen_before(workload: dict, state: dict, inputs: dict) -> None:
    """The previous block's gated residual, written into x: mlp_output * gate + residual."""
    torch.addcmul(state["residual"], state["mlp_output"], state["gate"], out=inputs["x"])


def qwen_after(workload: dict, state: dict, results: dict) -> None:
    """The attention's QKV projection of the modulated norm (out)."""
    out, qkv = results["out"], state["qkv"]
    torch.addmm(state["qkv_bias"], out.view(-1, out.shape[-1]), state["qkv_weight"].t(),
                out=qkv.view(-1, qkv.shape[-1]))


CONTEXTS = {
    "qwen_residual_qkv": Context(state=qwen_state, before=qwen_before, after=qwen_after, writes=("x",),
                                 results=("qkv",)),
}
