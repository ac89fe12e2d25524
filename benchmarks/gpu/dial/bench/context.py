"""The dial's context (harness 2.18; docs/task-contract.md, "In-context rows"): neighbours like a transformer
block's around its rows' scale-and-shift, for the A/A rows of bench/workloads.h200-context-aa.toml (the false-verdict
rate in context, benchmarks/gpu/context.sh). x and out are viewed as [n / C, C] rows of C channels (the widest of
1024, 128 and 1 that divides n):
- before: a LayerNorm of a hidden state writes x;
- after: a linear C -> C reads out.
"""

import torch
import torch.nn.functional as F

from kpremote.agent.contract import Context


def _channels(n: int) -> int:
    return next(c for c in (1024, 128, 1) if n % c == 0)


def state(workload, inputs, *, device, seed):
    n = int(workload["n"])
    channels = _channels(n)
    rows = n // channels
    generator = torch.Generator().manual_seed(seed)
    return {"hidden": (2.0 * torch.randn(rows, channels, generator=generator) + 0.5).to(device),
            "weight": (torch.randn(channels, channels, generator=generator) / channels ** 0.5).to(device),
            "next": torch.empty(rows, channels, device=device)}


def before(workload, state, inputs):
    hidden = state["hidden"]
    inputs["x"].view(hidden.shape).copy_(F.layer_norm(hidden, hidden.shape[-1:]))


def after(workload, state, results):
    torch.matmul(results["out"].view(state["next"].shape), state["weight"].t(), out=state["next"])


CONTEXTS = {"dial_block": Context(state=state, before=before, after=after, writes=("x",), results=("next",))}
