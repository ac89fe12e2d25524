"""Where the production rows' kernel runs in the model (harness 2.18: a row's `context` key; docs/task-contract.md,
"In-context rows"; docs/model-context.md names the call sites in the sglang 0.5.23 wheel).

qwen_residual_qkv: Qwen-Image's `img_norm1` / `txt_norm1` (LayerNormScaleShift -> fused_norm_scale_shift: a
LayerNorm without affine, eps 1e-6, then * (1 + scale) + shift), in every block after the first. Around it, by data
flow:
- before: the previous block's gated residual, MulAdd: x = mlp_output * gate2 + residual (bf16, the gate [1, 1, C]);
- after: the attention's QKV projection (`to_qkv` for the image stream, `to_added_qkv` for the text stream: one
  Linear C -> 3C with its bias, bf16) reads out.
The neighbours are plain torch ops written here (addcmul, addmm), not SGLang's code; in the model the gated residual
is the fuse_scale_shift task's Triton kernel. The first block reads `img_in` / `txt_in` instead.

wan_patch_embed_qkv (the wan row: x [1, 37800, 5120] bf16, scale/shift float32): Wan's `WanTransformerBlock.forward`
(`sglang/multimodal_gen/runtime/models/dits/wanvideo.py`) calls `self.norm1(hidden_states, shift_msa, scale_msa)` in
block 0 only when the FFN residuals are chained (a CUDA host: blocks 1..39 run `ffn_residual_norm1`, another kernel),
so this call runs once a forward. Around it, by data flow:
- before: `WanTransformer3DModel.forward`'s `patch_embedding(hidden_states, tokens=True)`: the patchify GEMM,
  token-major, of the latents' 16 channels x (1, 2, 2) patches (64 values a token) into 5120 with its bias, written
  into x;
- after: the block's `_project_qkv`, the fused QKV projection (Linear 5120 -> 3 x 5120 with its bias) of out.
Weights are random, seeded by the judge's secret: timing does not depend on their values.
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


WAN_PATCH_VALUES = 16 * 1 * 2 * 2  # the latents' channels x the patch (1, 2, 2): one token's patchify input


def wan_state(workload: dict, inputs: dict, *, device: str, seed: int) -> dict:
    """The latents' patches and the patchify weight; the QKV projection and its output buffer."""
    B, S, D = workload["shape"]
    dtype = _DTYPES[workload["dtype"]]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return {
        "patches": _randn((B * S, WAN_PATCH_VALUES), gen, device, dtype),
        "patch_weight": _randn((D, WAN_PATCH_VALUES), gen, device, dtype, std=WAN_PATCH_VALUES ** -0.5),
        "patch_bias": _randn((D,), gen, device, dtype, std=0.02),
        "qkv_weight": _randn((3 * D, D), gen, device, dtype, std=D ** -0.5),
        "qkv_bias": _randn((3 * D,), gen, device, dtype, std=0.02),
        "qkv": torch.empty((B, S, 3 * D), dtype=dtype, device=device),
    }


def wan_before(workload: dict, state: dict, inputs: dict) -> None:
    """The patchify GEMM, token-major, written into x."""
    x = inputs["x"]
    torch.addmm(state["patch_bias"], state["patches"], state["patch_weight"].t(), out=x.view(-1, x.shape[-1]))


CONTEXTS = {
    "qwen_residual_qkv": Context(state=qwen_state, before=qwen_before, after=qwen_after, writes=("x",),
                                 results=("qkv",)),
    "wan_patch_embed_qkv": Context(state=wan_state, before=wan_before, after=qwen_after, writes=("x",),
                                   results=("qkv",)),
}
