"""Where the production rows' kernel runs in the model (harness 2.18: a row's `context` key; docs/task-contract.md,
"In-context rows"; docs/model-context.md names the call sites in the sglang 0.5.23 wheel).

The call rewrites q and k in place (the row's `mutates`); the op before it writes them, so each context's before()
writes q and k (the judge then checks the call's result on what before() wrote: docs/task-contract.md).

flux_image_join / flux_text_join (FLUX, `sglang/multimodal_gen/runtime/models/dits/flux.py`, `FluxAttention.forward`;
LongCat-Image's double-stream attention, `models/dits/longcat_image.py`, reads and writes the same way):
`_get_qkv_projections` -> `apply_qk_norm_with_optional_rope` (-> `apply_qk_norm_rope` ->
`fused_inplace_qknorm_rope`) on the text stream, then on the image stream -> `join_seqs`, the text tokens before
the image's.
- before: the stream's QKV projection (`to_qkv` for the image stream, the added projection for the text stream: one
  Linear hidden -> 3 x hidden with its bias), of which q and k are two thirds: here two Linears hidden -> hidden
  with their biases, written into q and k ([tokens, heads, head_dim], a head's channels contiguous); the model's
  GEMM also writes v;
- after: the join, `torch.cat` of the text stream's q (and k) and the image stream's along the tokens, into buffers:
  flux_image_join for an image row (OTHER_TOKENS["image"] text tokens before it), flux_text_join for the text row (the
  image's 4096 tokens after it). The attention then reads the joined copies.
ernie_attention (ERNIE-Image, `models/dits/ernie_image.py`: `_ernie_qknorm_rope` -> `apply_qk_norm_rope` with
`round_norm_before_rope=True`, on one stream of image and text tokens):
- before: `to_q` and `to_k` (Linears hidden -> hidden without bias), written into q and k;
- after: the attention itself (`self.attn`; here F.scaled_dot_product_attention over the row's tokens, with a v of
  the state), into a buffer.
The neighbours are plain torch ops written here (addmm, cat, scaled_dot_product_attention), not SGLang's code; the
model's attention is FlashAttention 3. The other stream's token counts are stand-ins (FLUX's 512 text tokens; the
image's 4096 at 1024 x 1024), not traced. Weights are random, seeded by the judge's secret: timing does not depend
on their values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kpremote.agent.contract import Context

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
OTHER_TOKENS = {"image": 512, "text": 4096}  # the other stream's tokens in the join: text before an image row


def _randn(shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype,
           std: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def _dims(workload: dict) -> tuple[int, int, int, int, torch.dtype]:
    return (int(workload["tokens"]), int(workload["q_heads"]), int(workload["k_heads"]), int(workload["head_dim"]),
            _DTYPES[workload["dtype"]])


def _projections(workload: dict, gen: torch.Generator, device: str, bias: bool) -> dict:
    """The stream's hidden states and the q and k projections (hidden = q_heads x head_dim)."""
    tokens, q_heads, k_heads, dim, dtype = _dims(workload)
    hidden = q_heads * dim
    state = {
        "hidden": _randn((tokens, hidden), gen, device, dtype),
        "q_weight": _randn((q_heads * dim, hidden), gen, device, dtype, std=hidden ** -0.5),
        "k_weight": _randn((k_heads * dim, hidden), gen, device, dtype, std=hidden ** -0.5),
    }
    if bias:
        state["q_bias"] = _randn((q_heads * dim,), gen, device, dtype, std=0.02)
        state["k_bias"] = _randn((k_heads * dim,), gen, device, dtype, std=0.02)
    return state


def _generator(device: str, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def project_before(workload: dict, state: dict, inputs: dict) -> None:
    """The q and k projections of the stream's hidden states, written into q and k."""
    hidden = state["hidden"]
    for name in ("q", "k"):
        out = inputs[name].view(hidden.shape[0], -1)
        weight = state[f"{name}_weight"].t()
        if f"{name}_bias" in state:
            torch.addmm(state[f"{name}_bias"], hidden, weight, out=out)
        else:
            torch.mm(hidden, weight, out=out)


def _join_state(stream: str):
    def state(workload: dict, inputs: dict, *, device: str, seed: int) -> dict:
        tokens, q_heads, k_heads, dim, dtype = _dims(workload)
        gen = _generator(device, seed)
        other = OTHER_TOKENS[stream]
        return {**_projections(workload, gen, device, bias=True),
                "other_q": _randn((other, q_heads, dim), gen, device, dtype),
                "other_k": _randn((other, k_heads, dim), gen, device, dtype),
                "q_joined": torch.empty((tokens + other, q_heads, dim), dtype=dtype, device=device),
                "k_joined": torch.empty((tokens + other, k_heads, dim), dtype=dtype, device=device)}
    return state


def _join_after(stream: str):
    def after(workload: dict, state: dict, results: dict) -> None:
        for name in ("q", "k"):
            pair = (state[f"other_{name}"], results[name]) if stream == "image" else (results[name],
                                                                                     state[f"other_{name}"])
            torch.cat(pair, dim=0, out=state[f"{name}_joined"])
    return after


def ernie_state(workload: dict, inputs: dict, *, device: str, seed: int) -> dict:
    tokens, q_heads, k_heads, dim, dtype = _dims(workload)
    gen = _generator(device, seed)
    return {**_projections(workload, gen, device, bias=False),
            "v": _randn((tokens, k_heads, dim), gen, device, dtype),
            "attn_out": torch.empty((tokens, q_heads, dim), dtype=dtype, device=device)}


def ernie_after(workload: dict, state: dict, results: dict) -> None:
    """The attention over the stream's tokens (heads first), into attn_out."""
    q, k, v = (t.unsqueeze(0).transpose(1, 2) for t in (results["q"], results["k"], state["v"]))
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
    state["attn_out"].copy_(out.transpose(1, 2).squeeze(0))


CONTEXTS = {
    "flux_image_join": Context(state=_join_state("image"), before=project_before, after=_join_after("image"),
                               writes=("q", "k"), results=("q_joined", "k_joined")),
    "flux_text_join": Context(state=_join_state("text"), before=project_before, after=_join_after("text"),
                              writes=("q", "k"), results=("q_joined", "k_joined")),
    "ernie_attention": Context(state=ernie_state, before=project_before, after=ernie_after, writes=("q", "k"),
                               results=("attn_out",)),
}
