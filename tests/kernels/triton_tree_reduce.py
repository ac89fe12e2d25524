"""A reduction tree for Triton's interpreter: `tl.reduce` with a kernel's own combine function, over halves of the
axis (as a GPU's reduction does) instead of Triton's fallback, which calls the combine once per element in Python.

The combine function is still the kernel's own, on the same values; only the order of the (associative, as
tl.reduce requires) combines changes. Triton's fallback spent ~95 % of a LayerNorm row's interpreter time there
(the norm_scale_shift candidate's `tl.reduce((x, x * x), 0, _pair_sum)`). Import it, in a process where
TRITON_INTERPRET=1, before the kernels run; `install()` swaps the interpreter's fallback for the tree.
"""

from __future__ import annotations

import numpy as np
import triton
from triton.runtime import interpreter


TRITONS_FOLD = interpreter.ReduceOps.generic_reduce


def tree_reduce(self: interpreter.ReduceOps, input: tuple) -> list:
    """ReduceOps.generic_reduce's contract (a tuple of tensors in, one reduced tensor per input out), by halves of
    one axis; a reduction over every axis or one that keeps its dims goes to Triton's own fold."""
    if self.axis is None or self.keep_dims:
        return TRITONS_FOLD(self, input)
    dtypes = [tensor.dtype for tensor in input]
    data = [np.moveaxis(tensor.handle.data, self.axis, -1) for tensor in input]
    length = data[0].shape[-1]
    if length & (length - 1):
        raise ValueError(f"tl.reduce over {length} elements: Triton's blocks are powers of two")
    while data[0].shape[-1] > 1:
        half = data[0].shape[-1] // 2
        left = [self.to_tensor(np.ascontiguousarray(d[..., :half]), t) for d, t in zip(data, dtypes)]
        right = [self.to_tensor(np.ascontiguousarray(d[..., half:]), t) for d, t in zip(data, dtypes)]
        combined = self.combine_fn.fn(*left, *right)
        combined = combined if isinstance(combined, tuple) else (combined,)
        data = [c.handle.data.astype(d.dtype) for c, d in zip(combined, data)]
    return [self.to_tensor(d[..., 0], t) for d, t in zip(data, dtypes)]


def install() -> None:
    """Replace the interpreter's per-element fallback; refuse loudly if this Triton has no such fallback."""
    if TRITONS_FOLD.__code__.co_varnames[:2] != ("self", "input"):
        raise RuntimeError(f"triton {triton.__version__}: interpreter.ReduceOps.generic_reduce changed; update this")
    interpreter.ReduceOps.generic_reduce = tree_reduce
