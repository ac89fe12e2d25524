"""The dial's baseline: y = x * scale + shift in one Triton kernel (four tensor passes)."""

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _scale_shift(x_ptr, scale_ptr, shift_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    scale = tl.load(scale_ptr + offsets, mask=mask)
    shift = tl.load(shift_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * scale + shift, mask=mask)


def scale_shift(x, scale, shift, out, spin=0):  # spin: the candidate's dial, ignored here (same host path)
    n = x.numel()
    if not spin:
        _scale_shift[(triton.cdiv(n, BLOCK),)](x, scale, shift, out, n, BLOCK=BLOCK)
    else:
        _scale_shift[(triton.cdiv(n, BLOCK),)](x, scale, shift, out, n, BLOCK=BLOCK)
