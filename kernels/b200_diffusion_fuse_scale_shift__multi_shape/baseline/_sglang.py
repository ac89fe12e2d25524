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
  sglang.srt.utils.custom_op                register_custom_op(...) returns the function unchanged; it only
                                            decorates host wrappers that the adapter does not call
  sglang.kernels.kernel_api_logging         debug_kernel_api(fn) returns fn; it only wraps the MPS fallback

The packages above them (sglang, sglang.kernels, ...) are empty stand-ins whose __path__ is the matching folder
under upstream/: the wheel's __init__.py files are not pinned (sglang/kernels/ops/diffusion/__init__.py alone is a
37 KB lazy-import table). Once the import is done every sglang entry is taken out of sys.modules again (earlier ones
put back), so nothing else in the process sees them; the loaded module keeps what it bound at import time.

On a machine without CUDA only (Triton's interpreter): while the module is imported, torch.cpu is lent a
get_device_properties() that reports a warp size of 32, because norm_triton.py builds the autotune configs of
`_layer_norm_fwd_1pass_kernel` at import time from the current device's properties and torch.cpu has none. This
copy of the file is the same in every shipped task that pins SGLang files.
"""

from __future__ import annotations

import contextlib
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
