"""The cuda kind's builder: torch.utils.cpp_extension.load over each side's sources (PYBIND11_MODULE
registration), and without a GPU a compile-only nvcc check against torch's headers."""

from __future__ import annotations

import sys
import sysconfig
import types
from pathlib import Path

from ..taskspec import BuildSpec, TaskSpec
from .base import Builder, Built, import_file, module_name
from .compiler import (
    default_standard,
    find_nvcc,
    host_flags,
    include_paths,
    run_compiler,
)

# CPU builds of torch ship c10/cuda/CUDAMacros.h but not the cuda_cmake_macros.h it includes; this define (meant
# for HIP builds) skips that include, and the header then needs nothing from it for a compile-only check.
CPU_TORCH_DEFINES = ("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",)


def cpu_torch_defines(torch_include: str) -> list[str]:
    """The defines that let a CPU-only torch's headers compile a CUDA extension's sources (compile-only checks)."""
    defines = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    if not (Path(torch_include) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        defines += CPU_TORCH_DEFINES  # a CPU-only torch wheel lacks this generated header
    return defines


class CudaBuilder(Builder):
    """torch.utils.cpp_extension.load over the side's sources, PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)."""
    kind = "cuda"

    def describe(self, build: BuildSpec) -> str:
        return "torch.utils.cpp_extension.load"

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        module = cpp_extension.load(
            name=module_name(side),
            sources=[str(spec.side_dir(side) / source) for source in spec.build.sources],
            extra_cflags=host_flags(spec.build.flags),
            extra_cuda_cflags=list(spec.build.flags),
            extra_include_paths=include_paths(spec, side),
            build_directory=str(folder),
            verbose=True,
        )
        sys.stdout.flush()
        return Built(module=module.__file__)

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """nvcc -c each source with torch's headers and the flags the GPU build compiles it with: the task's and
        torch's own (cpp_extension's COMMON_NVCC_FLAGS: the half/bfloat16 operator macros, relaxed constexpr)."""
        from torch.utils import cpp_extension

        nvcc = find_nvcc()
        if nvcc is None:
            return Built(note="compile-only check skipped: nvcc not found on PATH or in CUDA_HOME")
        includes = [*include_paths(spec, side), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        folder.mkdir(parents=True, exist_ok=True)
        for source in spec.build.sources:
            command = [nvcc, *default_standard(spec.build.flags), *spec.build.flags, *cpp_extension.COMMON_NVCC_FLAGS,
                       *cpu_torch_defines(cpp_extension.include_paths()[0]),
                       *(f"-I{p}" for p in includes),
                       f"-DTORCH_EXTENSION_NAME={module_name(side)}", "-c", str(spec.side_dir(side) / source),
                       "-o", str(folder / (Path(source).name + ".o"))]
            error = run_compiler(command, spec, source)
            if error:
                return Built(error=error)
        return Built()

    def load(self, spec: TaskSpec, side: str, module: str | None) -> types.ModuleType:
        if module is None:
            raise RuntimeError(f"the {side} extension was not built")
        import torch  # noqa: F401 - an extension needs torch's libraries loaded first

        return import_file(module_name(side), Path(module))
