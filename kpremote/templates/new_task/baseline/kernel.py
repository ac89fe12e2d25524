"""out = x * (1 + scale) + shift, with scale and shift broadcast over the rows of x.

The baseline: the upstream kernel, or a faithful port of it, behind the task's local ABI. solution/kernel.py
starts as a copy of this file; make it faster there and keep this one as it is.
"""

import triton
import triton.language as tl


@triton.jit
def _scale_shift(x_ptr, scale_ptr, shift_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask).to(tl.float32)
    scale = tl.load(scale_ptr + cols, mask=mask).to(tl.float32)
    shift = tl.load(shift_ptr + cols, mask=mask).to(tl.float32)
    y = x * (1.0 + scale) + shift
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def scale_shift(x, scale, shift, out):
    """Destination-passing: writes out, allocates nothing, launches on torch's current stream."""
    rows, cols = x.shape
    block = min(1024, triton.next_power_of_2(cols))
    _scale_shift[(rows, triton.cdiv(cols, block))](x, scale, shift, out, cols, BLOCK=block)
