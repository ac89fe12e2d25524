"""How one output is compared with what it should be (compare_output: shape, dtype, finite values, then the
tolerance, the first bad element named), a tensor's first non-finite element (non_finite), and a flat index as a
tensor's index (unravel). The gate (correctness.py), the timed loop's checked samples (sampling.py), a context's
checks (regimes.py) and the numerical contract (numerics.py) all compare through them."""

from __future__ import annotations

from typing import Any

INT_POISON = -17  # what an integer output holds before a call (correctness.poison_value): seen after it, never written


def compare_output(
    expected: Any,
    got: Any,
    layout: Any,
    *,
    atol: float,
    rtol: float,
    largest: dict[str, float] | None = None,
    name: str = "out",
) -> dict[str, Any] | None:
    """The first problem with `got` (shape and dtype against the baseline's `layout`, values against `expected`)."""
    import torch

    if not torch.is_tensor(got):
        return {"kind": "type", "detail": f"expected a tensor, got {type(got).__name__}"}
    if tuple(got.shape) != tuple(layout.shape):
        return {"kind": "shape", "detail": f"shape {list(got.shape)}, expected {list(layout.shape)}"}
    if got.dtype != layout.dtype:
        return {"kind": "dtype", "detail": f"dtype {got.dtype}, expected {layout.dtype}"}
    bad = non_finite(got)
    if bad is not None:
        return bad
    wide = torch.float64 if torch.float64 in (got.dtype, expected.dtype) else torch.float32
    got_w = got.to(wide)
    expected_w = expected.to(device=got.device, dtype=wide)
    error = (got_w - expected_w).abs()
    if error.numel():
        worst = float(error.max())
        if largest is not None:
            largest[name] = max(largest.get(name, 0.0), worst)
    else:
        worst = 0.0
    outside = error > atol + rtol * expected_w.abs()
    if not bool(outside.any()):
        return None
    flat = int(outside.reshape(-1).to(torch.uint8).argmax())  # argmax returns the first maximal element
    index = unravel(flat, tuple(got.shape))
    got_value, expected_value = got_w.reshape(-1)[flat].item(), expected_w.reshape(-1)[flat].item()
    hint = " (still the poison value: never written?)" if got_value == INT_POISON and not got.dtype.is_floating_point else ""
    return {
        "kind": "tolerance",
        "index": index,
        "got": got_value,
        "expected": expected_value,
        "max_abs_err": worst,
        "atol": atol,
        "rtol": rtol,
        "detail": f"first mismatch at {index}: got {got_value!r}, expected {expected_value!r}; max abs err {worst:.3g} "
        f"(atol {atol:g}, rtol {rtol:g}){hint}",
    }


def describe(mismatch: dict[str, Any]) -> str:
    return mismatch.get("detail") or mismatch["kind"]


def non_finite(tensor: Any) -> dict[str, Any] | None:
    import torch

    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex) or tensor.numel() == 0:
        return None
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    flat = int((~finite).reshape(-1).to(torch.uint8).argmax())
    index = unravel(flat, tuple(tensor.shape))
    value = tensor.reshape(-1)[flat].item()
    kind = "nan" if value != value else "inf"
    unwritten = " (never written, or written as NaN)" if kind == "nan" else ""
    count = int((~finite).sum())
    return {
        "kind": kind,
        "index": index,
        "got": repr(value),
        "count": count,
        "detail": f"{kind.upper()} at {index}{unwritten}; {count} of {tensor.numel()} elements are not finite",
    }


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))
