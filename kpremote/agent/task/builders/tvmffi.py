"""The tvm-ffi kind's builder: each side's sources in one generated unit with one TVM_FFI_DLL_EXPORT_TYPED_FUNC per
`[build] exports` entry, built by apache-tvm-ffi once per set of template arguments from the row; without a GPU,
a compile-only nvcc check of that unit."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from ..taskspec import BuildSpec, TaskSpec, shown
from .base import Builder, Built, module_name
from ...sandbox import SCRATCH_ENV
from .compiler import (
    default_standard,
    find_nvcc,
    host_flags,
    include_paths,
    run_compiler,
)

SELF_REGISTRATION = re.compile(r"TVM_FFI_DLL_EXPORT_TYPED_FUNC")
# What tvm_ffi.cpp.load_inline puts before the source; the generated unit starts with them too.
TVM_FFI_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
ARCH_LISTS = {"h200": "9.0", "h100": "9.0", "b200": "10.0"}  # TVM_FFI_CUDA_ARCH_LIST when unset: both sides alike
# SGLang's make_cpp_args names for torch dtypes (the typedefs its headers define).
CPP_DTYPES = {"float32": "fp32_t", "float16": "fp16_t", "bfloat16": "bf16_t", "float64": "double",
              "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t",
              "bool": "bool"}


class TvmFfiBuilder(Builder):
    """apache-tvm-ffi: the side's sources + one TVM_FFI_DLL_EXPORT_TYPED_FUNC per export, built per template
    arguments (the adapter calls side.load(*args) with values from the row)."""
    kind = "tvm-ffi"

    def describe(self, build: BuildSpec) -> str:
        return "tvm_ffi.cpp.load_inline (TVM_FFI_DLL_EXPORT_TYPED_FUNC exports, template arguments from the row)"

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """Compile what does not depend on a row now (build errors surface here, not in the first row)."""
        from tvm_ffi import cpp

        _arch_list_for(spec)
        if any("{args}" in target for _, target in spec.build.exports):
            folder.mkdir(parents=True, exist_ok=True)
            cpp.build_inline(
                f"{module_name(side)}_check", cuda_sources=generated_unit(spec, side, None),
                extra_cflags=host_flags(spec.build.flags), extra_cuda_cflags=list(spec.build.flags),
                extra_include_paths=include_paths(spec, side), build_directory=str(folder / "check"),
            )
        else:
            TvmFfiSide(spec, side, folder).load()
        return Built(module=str(folder))

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """nvcc -c the generated unit (the side's sources and every export that needs no template argument) with
        tvm-ffi's headers and the same flags: no linking, as a machine without a GPU may lack the CUDA runtime."""
        nvcc = find_nvcc()
        if nvcc is None:
            return Built(note="compile-only check skipped: nvcc not found on PATH or in CUDA_HOME")
        if importlib.util.find_spec("tvm_ffi") is None:
            return Built(note="compile-only check skipped: apache-tvm-ffi (its headers) is not installed here")
        from tvm_ffi import libinfo

        _arch_list_for(spec)
        folder.mkdir(parents=True, exist_ok=True)
        unit = folder / "generated.cu"
        unit.write_text(generated_unit(spec, side, None))
        arch = [f"-gencode=arch=compute_{a.replace('.', '')},code=sm_{a.replace('.', '')}"
                for a in os.environ.get("TVM_FFI_CUDA_ARCH_LIST", "").split()]
        includes = [*include_paths(spec, side), libinfo.find_include_path(), libinfo.find_dlpack_include_path()]
        command = [nvcc, *default_standard(spec.build.flags), "-O2", *arch, *spec.build.flags,
                   *(f"-I{p}" for p in includes),
                   "-c", str(unit), "-o", str(folder / "generated.o")]
        return Built(module=str(folder), error=run_compiler(command, spec, "the generated tvm-ffi unit"))

    def load(self, spec: TaskSpec, side: str, module: str | None) -> "TvmFfiSide":
        if module is None:
            raise RuntimeError(f"the {side} tvm-ffi side was not prepared")
        return TvmFfiSide(spec, side, Path(module))


class TvmFfiSide:
    """What the adapter gets for a tvm-ffi side: load(*template_args) -> the tvm_ffi Module, built once per args.

    Template arguments convert as SGLang's make_cpp_args does: bool -> true/false, int/float -> digits, str as is,
    torch dtype -> fp32_t / fp16_t / bf16_t / int32_t ... (the typedefs SGLang's headers define).
    """

    def __init__(self, spec: TaskSpec, side: str, folder: Path) -> None:
        self.spec, self.side, self.folder = spec, side, folder
        self._modules: dict[str, Any] = {}

    def load(self, *template_args: Any) -> Any:
        args = cpp_args(template_args)
        key = ", ".join(args)
        if key not in self._modules:
            from tvm_ffi import cpp

            _arch_list_for(self.spec)
            digest = hashlib.sha256(repr((key, self.spec.build.flags, self.spec.build.exports)).encode()).hexdigest()
            name = f"{module_name(self.side)}_{digest[:12]}"
            self._modules[key] = cpp.load_inline(
                name, cuda_sources=generated_unit(self.spec, self.side, key),
                extra_cflags=host_flags(self.spec.build.flags), extra_cuda_cflags=list(self.spec.build.flags),
                extra_include_paths=include_paths(self.spec, self.side), build_directory=str(self.row_folder(name)),
            )
        return self._modules[key]

    def row_folder(self, name: str) -> Path:
        """Where one set of template arguments is built: in a sandboxed process (a side's timing process, the audit's
        or a profile's calls) its own scratch folder, the one folder it may write (its build folder is read-only
        there: every row was an ERROR, PermissionError, on the H200 under harness 2.8-2.11); else the build folder."""
        scratch = os.environ.get(SCRATCH_ENV)
        return Path(scratch) / "tvm-ffi" / name if scratch else self.folder / name


def generated_unit(spec: TaskSpec, side: str, args: str | None) -> str:
    """The one translation unit: tvm-ffi's headers (those load_inline puts first, so the compile-only check compiles
    what the build does), the side's sources, then its exports (with args None: only those without {args})."""
    lines = [f"// generated by kpremote for the {side} side: tvm-ffi's headers, its sources, then its exports"]
    lines += [f"#include <tvm/ffi/{header}>" for header in TVM_FFI_HEADERS]
    for source in spec.build.sources:
        path = (spec.side_dir(side) / source).resolve()
        _refuse_own_registration(spec, side, source, path)
        lines.append(f'#include "{path}"')
    for name, target in spec.build.exports:
        if "{args}" in target and args is None:
            continue
        lines.append(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, ({target.replace('{args}', args or '')}));")
    return "\n".join(lines) + "\n"


def _refuse_own_registration(spec: TaskSpec, side: str, source: str, path: Path) -> None:
    """Both sides register exactly what `exports` says, written by the builder: a source may not register its own."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return  # the compiler names it
    if SELF_REGISTRATION.search(text):
        raise RuntimeError(
            f"{shown(spec.side_dir(side) / source)}: registers its own {SELF_REGISTRATION.pattern} — refused: the "
            f"builder writes one registration per [build] exports entry for both sides (rule sheet: the same "
            f"registration style on both sides); remove it and name the callable in exports"
        )


def cpp_args(values: tuple[Any, ...]) -> list[str]:
    out = []
    for value in values:
        if isinstance(value, bool):
            out.append("true" if value else "false")
        elif isinstance(value, (int, float, str)):
            out.append(str(value))
        elif type(value).__name__ == "dtype" and str(value).startswith("torch."):
            name = str(value).removeprefix("torch.")
            if name not in CPP_DTYPES:
                raise TypeError(f"no C++ name for template argument {value}; pass the name as a string")
            out.append(CPP_DTYPES[name])
        else:
            raise TypeError(f"template argument {value!r}: allowed bool, int, float, str or a torch dtype")
    return out


def _arch_list_for(spec: TaskSpec) -> None:
    """Both tvm-ffi sides target the task's architecture, also where no GPU is there to be detected."""
    arch = " ".join(dict.fromkeys(ARCH_LISTS[name] for name in spec.task.arches if name in ARCH_LISTS))
    if arch and "TVM_FFI_CUDA_ARCH_LIST" not in os.environ:
        os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch
