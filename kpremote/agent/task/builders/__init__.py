"""One builder per build kind (BUILDERS), and which one builds a side (builder_for; the kinds' rules are in
buildrules.py).

Standard library at import time; torch, tvm_ffi and the builders' other packages are imported only when a side is
built.
"""

from __future__ import annotations

from ..buildrules import kind_of
from ..taskspec import BuildSpec
from .base import Builder
from .cuda import CudaBuilder
from .imported import ModuleBuilder
from .tvmffi import TvmFfiBuilder

__all__ = ["BUILDERS", "base", "builder_for", "compiler"]

BUILDERS: dict[str, Builder] = {
    "triton": ModuleBuilder("triton", "triton JIT, one process, one TRITON_CACHE_DIR"),
    "cutedsl": ModuleBuilder("cutedsl", "nvidia-cutlass-dsl JIT (cute.compile on first call), one process"),
    "python": ModuleBuilder("python", "python import, one process"),
    "cuda": CudaBuilder(),
    "tvm-ffi": TvmFfiBuilder(),
}


def builder_for(build: BuildSpec, side: str) -> Builder:
    return BUILDERS[kind_of(build, side)]
