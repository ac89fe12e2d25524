"""The dial's candidate: the baseline's kernel, plus `spin` dependent multiply-adds in its last program.

spin = 0 runs the baseline's kernel, a copy of its source, on the same host path (an A/A copy); spin > 0 lengthens the last program, and with it the
kernel, by a fixed number of cycles (benchmarks/gpu/power.py calibrates cycles to µs on the GPU it runs on).
"""

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _scale_shift(x_ptr, scale_ptr, shift_ptr, out_ptr, n, BLOCK: tl.constexpr):  # the baseline's, as written there
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    scale = tl.load(scale_ptr + offsets, mask=mask)
    shift = tl.load(shift_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * scale + shift, mask=mask)


@triton.jit
def _scale_shift_spin(x_ptr, scale_ptr, shift_ptr, out_ptr, n, spin, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    scale = tl.load(scale_ptr + offsets, mask=mask)
    shift = tl.load(shift_ptr + offsets, mask=mask)
    y = x * scale + shift
    if pid == tl.num_programs(0) - 1:
        acc = tl.sum(tl.where(mask, y, 0.0) * 0.0) + 1.0
        for _ in range(spin):
            acc = acc * 0.9999 + 0.0001  # stays 1.0: a dependent chain the compiler cannot drop
        y = y + tl.where(acc > 2.0, 1.0, 0.0)
    tl.store(out_ptr + offsets, y, mask=mask)


def scale_shift(x, scale, shift, out, spin=0):
    n = x.numel()
    if not spin:  # the same host path as the baseline's: an A/A row differs in nothing but the process
        _scale_shift[(triton.cdiv(n, BLOCK),)](x, scale, shift, out, n, BLOCK=BLOCK)
    else:
        _scale_shift_spin[(triton.cdiv(n, BLOCK),)](x, scale, shift, out, n, spin, BLOCK=BLOCK)
