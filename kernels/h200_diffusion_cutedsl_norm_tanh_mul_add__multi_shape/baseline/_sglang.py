"""Import a pinned SGLang module from baseline/upstream/ without installing sglang (the sys.modules shim).

The upstream files lie at baseline/upstream/<path in the sglang wheel>, exactly as task.toml [baseline.sha256]
pins them (the agent refuses a run where one differs). An upstream module imports other sglang modules: the small
self-contained ones are pinned too and imported from upstream/ as they are; the others (whole subsystems of the
serving runtime) are replaced, only while the upstream module is being imported, by these stand-ins:

  sglang.multimodal_gen.runtime.platforms   current_platform: is_cuda() is True, every other is_*() False, so the
                                            upstream `select_impl` keeps the Triton implementation (the CUDA
                                            path, the one timed on the GPU) on any machine
  sglang.srt.utils                          is_gfx1250_supported() is False (an AMD gfx1250 test; never true on
                                            an NVIDIA GPU)
  sglang.srt.utils.custom_op                register_custom_op(...) returns the function unchanged; it
                                            decorates host wrappers, so the adapter calls the function itself
  sglang.kernels.kernel_api_logging         debug_kernel_api(fn) returns fn; it only wraps the MPS fallback

The packages above them (sglang, sglang.kernels, ...) are empty stand-ins whose __path__ is the matching folder
under upstream/: the wheel's __init__.py files are not pinned (sglang/kernels/ops/diffusion/__init__.py alone is a
37 KB lazy-import table). Once the import is done every sglang entry is taken out of sys.modules again (earlier ones
put back), so nothing else in the process sees them; the loaded module keeps what it bound at import time.

Upstream's host wrappers allocate their output (`output = torch.empty_like(x)`) and return it; the task ABI passes
the caller's `out`. `call_into(out, fn, ...)` runs upstream's own wrapper unchanged, with the one name `torch` of its
module standing for torch except that the call's `torch.empty_like` gives `out`: nothing is allocated or copied
that upstream would not, and no line of the wrapper is written here. Upstream's platform checks (is_hip(), is_xpu())
import sglang.multimodal_gen.runtime.platforms when called, so for the call, and only then, that one module's
stand-in is in sys.modules.

On a machine without CUDA only (Triton's interpreter): while the module is imported, torch.cpu is lent a
get_device_properties() that reports a warp size of 32, because norm_triton.py builds the autotune configs of
`_layer_norm_fwd_1pass_kernel` at import time from the current device's properties and torch.cpu has none; in a
call_into, `torch.get_device_module().device(d)` and `torch.cuda.device(d)` (upstream's device guards) are no-ops,
as torch.cpu has none; and
`seen_as_cuda(t)` gives a view of a CPU tensor whose `is_cuda` is True, for wrappers that assert CUDA tensors or
choose their NVIDIA tiles on `x.is_cuda`. On a GPU none of these is used. This copy of the file is the same in every
shipped task that pins SGLang files.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from pathlib import Path
from typing import Iterator

UPSTREAM = Path(__file__).resolve().parent / "upstream"


class _NvidiaPlatform:
    """The stand-in for sglang's current_platform: an NVIDIA CUDA device."""

    def is_cuda(self) -> bool:
        return True

    def __getattr__(self, name: str):
        if name.startswith("is_"):
            return lambda *args, **kwargs: False
        raise AttributeError(name)


def _unchanged_decorator(*args, **kwargs):
    return lambda fn: fn


STAND_INS = {
    "sglang.multimodal_gen.runtime.platforms": {"current_platform": _NvidiaPlatform()},
    "sglang.srt.utils": {"is_gfx1250_supported": lambda *args, **kwargs: False},
    "sglang.srt.utils.custom_op": {"register_custom_op": _unchanged_decorator},
    "sglang.kernels.kernel_api_logging": {"debug_kernel_api": lambda fn: fn},
}


PLATFORMS = "sglang.multimodal_gen.runtime.platforms"
_PLATFORMS_STAND_IN = types.ModuleType(PLATFORMS)
_PLATFORMS_STAND_IN.__dict__.update(STAND_INS[PLATFORMS])


class _TorchWritingInto:
    """`torch` as an upstream module sees it: torch's own names, except that `empty_like` gives the `out` that
    call_into holds for the call (once), and the device guards torch.get_device_module().device and
    torch.cuda.device are no-ops without CUDA."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.pending: list = []
        if not torch.cuda.is_available():
            self.get_device_module = lambda *args: types.SimpleNamespace(device=lambda _: contextlib.nullcontext())
            self.cuda = types.SimpleNamespace(device=lambda _: contextlib.nullcontext())

    def __getattr__(self, name: str):
        value = getattr(self._torch, name)
        setattr(self, name, value)  # looked up once
        return value

    def empty_like(self, like, *args, **kwargs):
        if not self.pending:
            return self._torch.empty_like(like, *args, **kwargs)
        out = self.pending.pop()
        if out.dtype != like.dtype or out.device != like.device:
            raise ValueError(f"out is {out.dtype} on {out.device}; upstream's output is {like.dtype} on {like.device}")
        if out.shape == like.shape and (out.is_contiguous() if like.is_contiguous() else out.stride() == like.stride()):
            return out
        if out.numel() == like.numel() and out.is_contiguous() and like.is_contiguous():
            return out.view(like.shape)  # upstream allocates a flattened view of its output (and reshapes it back)
        raise ValueError(f"out is {tuple(out.shape)}, strides {out.stride()}; upstream's output is "
                         f"{tuple(like.shape)}, laid out as {like.stride()}")


def call_into(out, function, *args, **kwargs) -> None:
    """Upstream's host wrapper `function`, unchanged, with its output (its torch.empty_like) the caller's `out`."""
    module_globals = function.__globals__
    proxy = module_globals.get("torch")
    if not isinstance(proxy, _TorchWritingInto):
        proxy = module_globals["torch"] = _TorchWritingInto()
    proxy.pending.append(out)
    platforms = sys.modules.get(PLATFORMS)
    sys.modules[PLATFORMS] = _PLATFORMS_STAND_IN  # upstream's is_hip()/is_xpu() import it at call time
    try:
        result = function(*args, **kwargs)
    finally:
        taken = not proxy.pending
        proxy.pending.clear()
        if platforms is None:
            del sys.modules[PLATFORMS]
        else:
            sys.modules[PLATFORMS] = platforms
    if not taken or result.data_ptr() != out.data_ptr() or result.shape != out.shape:
        raise RuntimeError(f"{function.__qualname__} did not return its torch.empty_like output: it cannot write "
                           "into the caller's out")


def seen_as_cuda(tensor):
    """Triton's interpreter only: a view of a CPU tensor that reports is_cuda (see the module docstring)."""
    return tensor.as_subclass(_seen_as_cuda_class())


@functools.cache
def _seen_as_cuda_class() -> type:
    import torch

    class SeenAsCuda(torch.Tensor):
        @property
        def is_cuda(self) -> bool:
            return True

    return SeenAsCuda


def load_upstream(name: str) -> types.ModuleType:
    """The pinned upstream module `name` (e.g. sglang.kernels.ops.diffusion.rope.rotary_triton), imported once."""
    if not (UPSTREAM / (name.replace(".", "/") + ".py")).is_file():
        raise ImportError(f"{UPSTREAM}/{name.replace('.', '/')}.py is missing: materialize the pinned upstream "
                          f"files (inv baseline --task <task> --materialize)")
    with _shimmed(), _cpu_device_properties():
        return importlib.import_module(name)


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


@contextlib.contextmanager
def _shimmed() -> Iterator[None]:
    before = {k: v for k, v in sys.modules.items() if _is_sglang(k)}
    try:
        for k in before:
            del sys.modules[k]
        for package in _packages():
            module = types.ModuleType(package)
            module.__path__ = [str(UPSTREAM / package.replace(".", "/"))]
            sys.modules[package] = module
        for name, attributes in STAND_INS.items():
            module = types.ModuleType(name)
            module.__path__ = []
            module.__dict__.update(attributes)
            sys.modules[name] = module
        yield
    finally:
        for k in [k for k in sys.modules if _is_sglang(k)]:
            del sys.modules[k]
        sys.modules.update(before)


def _packages() -> list[str]:
    """Every package above a pinned file or a stand-in, parents first."""
    names = {".".join(p.relative_to(UPSTREAM).with_suffix("").parts) for p in UPSTREAM.rglob("*.py")}
    names |= set(STAND_INS)
    packages = {".".join(n.split(".")[:i]) for n in names for i in range(1, len(n.split(".")))}
    return sorted(packages - set(STAND_INS), key=lambda n: n.count("."))


@contextlib.contextmanager
def _cpu_device_properties() -> Iterator[None]:
    import torch

    lent = not torch.cuda.is_available() and not hasattr(torch.cpu, "get_device_properties")
    if lent:
        torch.cpu.get_device_properties = lambda *args, **kwargs: types.SimpleNamespace(warp_size=32)
    try:
        yield
    finally:
        if lent:
            del torch.cpu.get_device_properties
