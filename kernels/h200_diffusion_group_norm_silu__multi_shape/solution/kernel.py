"""Candidate: GroupNorm + SiLU in Triton, written for this task (a first, unoptimized candidate).

x [B, C, *spatial] is contiguous, so each (batch, group) is one contiguous run of (C / G) * spatial elements: a row
of x seen as [B * G, group_size]. Three launches on torch's current stream:
1. `_partial_sums`: program (row, chunk) sums its chunk of the row and of its squares in float32;
2. `_row_stats`: program row adds its chunks' partial sums into the row's mean and 1 / sqrt(var + eps)
   (biased variance, E[x^2] - mean^2, as torch's group_norm);
3. `_normalize_silu`: program (row, chunk) writes silu((x - mean) * rstd * weight[c] + bias[c]) into `out`.
No tuning yet: the chunk is up to 4096 elements and every launch uses Triton's default warps. The candidate is
expected to be at best on par with the baseline (docs/results.md says what was measured).

Triton's interpreter only (TRITON_INTERPRET=1 without CUDA, the CPU smoke run): bfloat16 rows run on float32
copies, as the interpreter computes bfloat16 on raw bits; on a GPU the tensors are used as given.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
MAX_CHUNK = 4096


@triton.jit
def _partial_sums(x_ptr, sums_ptr, squares_ptr, group_size, chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    index = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = index < group_size
    values = tl.load(x_ptr + row * group_size + index, mask=inside, other=0.0).to(tl.float32)
    tl.store(sums_ptr + row * chunks + chunk, tl.sum(values, axis=0))
    tl.store(squares_ptr + row * chunks + chunk, tl.sum(values * values, axis=0))


@triton.jit
def _row_stats(sums_ptr, squares_ptr, stats_ptr, group_size, chunks, eps, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = tl.zeros((), dtype=tl.float32)
    total_squares = tl.zeros((), dtype=tl.float32)
    for start in range(0, chunks, CHUNKS):
        index = start + tl.arange(0, CHUNKS)
        inside = index < chunks
        total += tl.sum(tl.load(sums_ptr + row * chunks + index, mask=inside, other=0.0), axis=0)
        total_squares += tl.sum(tl.load(squares_ptr + row * chunks + index, mask=inside, other=0.0), axis=0)
    mean = total / group_size
    variance = tl.maximum(total_squares / group_size - mean * mean, 0.0)
    tl.store(stats_ptr + row * 2, mean)
    tl.store(stats_ptr + row * 2 + 1, 1.0 / tl.sqrt(variance + eps))


@triton.jit
def _normalize_silu(x_ptr, weight_ptr, bias_ptr, stats_ptr, out_ptr, group_size, spatial, channels_per_group,
                    groups, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    index = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = index < group_size
    mean = tl.load(stats_ptr + row * 2)
    rstd = tl.load(stats_ptr + row * 2 + 1)
    channel = (row % groups) * channels_per_group + index // spatial
    x = tl.load(x_ptr + row * group_size + index, mask=inside, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + channel, mask=inside, other=1.0).to(tl.float32)
    bias = tl.load(bias_ptr + channel, mask=inside, other=0.0).to(tl.float32)
    y = (x - mean) * rstd * weight + bias
    y = y * tl.sigmoid(y)
    tl.store(out_ptr + row * group_size + index, y.to(out_ptr.dtype.element_ty), mask=inside)


def group_norm_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int, eps: float,
                    out: torch.Tensor) -> None:
    """Task ABI: out = silu(group_norm(x, num_groups, weight, bias, eps)), x [B, C, *spatial], weight/bias [C]."""
    if _INTERPRETING and x.dtype == torch.bfloat16:
        wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        group_norm_silu(x.float(), weight.float(), bias.float(), num_groups, eps, wide)
        out.copy_(wide)
        return
    if not (x.is_contiguous() and out.is_contiguous() and out.shape == x.shape and out.dtype == x.dtype):
        raise ValueError("x and out must be contiguous and of the same shape and dtype")
    batch, channels = x.shape[:2]
    if channels % num_groups:
        raise ValueError(f"{channels} channels do not split into {num_groups} groups")
    spatial = math.prod(x.shape[2:])
    channels_per_group = channels // num_groups
    group_size = channels_per_group * spatial
    rows = batch * num_groups
    chunk = min(MAX_CHUNK, triton.next_power_of_2(group_size))
    chunks = triton.cdiv(group_size, chunk)
    sums = torch.empty((rows, chunks), dtype=torch.float32, device=x.device)
    squares = torch.empty_like(sums)
    stats = torch.empty((rows, 2), dtype=torch.float32, device=x.device)
    _partial_sums[(rows, chunks)](x, sums, squares, group_size, chunks, CHUNK=chunk)
    _row_stats[(rows,)](sums, squares, stats, group_size, chunks, eps,
                        CHUNKS=min(1024, triton.next_power_of_2(chunks)))
    _normalize_silu[(rows, chunks)](x, weight, bias, stats, out, group_size, spatial, channels_per_group,
                                    num_groups, CHUNK=chunk)
