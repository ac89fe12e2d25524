"""Build kinds: which kinds may face each other, and one builder per kind (docs/task-contract.md, "Build kinds").

Kinds, by the users' rule sheet:
  triton   each side's <entry>.py imported by the one loader; Triton JIT-compiles it (one TRITON_CACHE_DIR)
  cuda     each side's `sources` through torch.utils.cpp_extension.load (PYBIND11_MODULE registration)
  tvm-ffi  each side's `sources` included into one generated unit with a TVM_FFI_DLL_EXPORT_TYPED_FUNC per
           `[build] exports` entry, built by apache-tvm-ffi (tvm_ffi.cpp), once per set of compile-time template
           arguments that the adapter takes from the row (outputs passed last, as SGLang's load_jit does); the
           builder writes every registration, so a source that registers its own is refused
  cutedsl  each side's <entry>.py imported by the one loader; nvidia-cutlass-dsl JIT-compiles it on first call
  python   each side's <entry>.py imported by the one loader (plain Python / torch)

Sides may differ in kind only where the rule sheet allows it: a triton, cutedsl or python baseline may face a
candidate of any kind (both behind the same adapter signature); a cuda or tvm-ffi baseline needs the candidate
built by the same builder with the same registration style. `flags` is one list for every compiled side, and a
flag that makes math fast (or flushes denormals) is refused unless both sides are compiled with it. `include_dirs`
is one list of header folders, each relative to each compiled side's folder (where a side has it).

Standard library at import time (taskspec validates with these rules without importing torch); torch, tvm_ffi and
the builders' other packages are imported only when a side is built.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .taskspec import SIDES, BuildSpec, TaskSpec, TaskSpecError, _listed, _shown, _string_list, _toml

KINDS = ("triton", "cuda", "tvm-ffi", "cutedsl", "python")
COMPILED_KINDS = ("cuda", "tvm-ffi")           # built from `sources` with the one `flags` list
MODULE_KINDS = ("triton", "cutedsl", "python")  # a Python module, `entry`, imported by the one loader
FREE_BASELINE_KINDS = ("triton", "cutedsl", "python")  # may face a candidate of any kind
CPU_KINDS = ("triton", "python")                # what can run on a machine without a GPU
NOT_CHECKED = "NOT CHECKED"
# The package a kind needs on the host: (import name, distribution name as pip knows it).
PACKAGES = {
    "triton": ("triton", "triton"),
    "tvm-ffi": ("tvm_ffi", "apache-tvm-ffi"),
    "cutedsl": ("cutlass", "nvidia-cutlass-dsl"),
}
# Flags that trade accuracy for speed; one compiled side alone must never get them.
FAST_MATH = re.compile(r"-{1,2}(use_fast_math|ffast-math|ftz=true|prec-div=false|prec-sqrt=false)$")
HOST_FLAG_PREFIXES = ("-O", "-std=", "-D", "-U", "-I")


def default_standard(flags) -> list[str]:
    """-std=c++17 unless the task's one flag list names its standard (nvcc refuses two; torch >= 2.10 needs 20)."""
    return [] if any(flag.startswith("-std=") for flag in flags) else ["-std=c++17"]
MISSING_HEADER = re.compile(r"fatal error: ([^\s:]+): No such file or directory")
EXPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SELF_REGISTRATION = re.compile(r"TVM_FFI_DLL_EXPORT_TYPED_FUNC")
# What tvm_ffi.cpp.load_inline puts before the source; the generated unit starts with them too.
TVM_FFI_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
ARCH_LISTS = {"h200": "9.0", "h100": "9.0", "b200": "10.0"}  # TVM_FFI_CUDA_ARCH_LIST when unset: both sides alike
# SGLang's make_cpp_args names for torch dtypes (the typedefs its headers define).
CPP_DTYPES = {"float32": "fp32_t", "float16": "fp16_t", "bfloat16": "bf16_t", "float64": "double",
              "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t",
              "bool": "bool"}


# ============================================================================================ the rules


def parse_build(path: Path, values: dict[str, Any]) -> BuildSpec:
    """task.toml's [build] table, validated: kinds by the rule sheet, one flags list, what each kind needs."""
    kinds = side_kinds(path, values.get("kind"))
    compiled = [k for k in kinds if k in COMPILED_KINDS]
    flags = tuple(_string_list(path, "build", "flags", values.get("flags", [])))
    sources = tuple(_string_list(path, "build", "sources", values.get("sources", [])))
    include_dirs = tuple(_string_list(path, "build", "include_dirs", values.get("include_dirs", [])))
    kind = kinds[0] if kinds[0] == kinds[1] else f"{kinds[0]}+{kinds[1]}"
    if flags and not compiled:
        raise TaskSpecError(
            f"{_shown(path)}: [build] flags = {list(flags)!r} — must be [] for kind = {_kind_text(kinds)} "
            f"(no side is compiled from sources; both are JIT-compiled with the same options)"
        )
    fast = [f for f in flags if FAST_MATH.fullmatch(f)]
    if fast and len(compiled) == 1:
        raise TaskSpecError(
            f"{_shown(path)}: [build] flags {fast[0]!r} — refused: only the {_compiled_side(kinds)} side is compiled, "
            f"so fast math would change one side's numerics (rule sheet: no fast math unless both sides use it)"
        )
    _check_sources(path, sources, compiled, kinds)
    _check_include_dirs(path, include_dirs, compiled, kinds)
    entry = values.get("entry", "kernel")
    if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", entry):
        raise TaskSpecError(f"{_shown(path)}: [build] entry = {entry!r} — allowed: a Python module name, e.g. \"kernel\"")
    exports = _exports(path, values.get("exports"), kinds)
    return BuildSpec(kind=kind, flags=flags, sources=sources, entry=entry, kinds=kinds, exports=exports,
                     include_dirs=include_dirs)


def side_kinds(path: Path, value: Any) -> tuple[str, str]:
    """(baseline kind, candidate kind) from `kind = "triton"` or `kind = {baseline = "triton", candidate = "cuda"}`."""
    if isinstance(value, str):
        _check_kind(path, "kind", value)
        return value, value
    if not isinstance(value, dict):
        raise TaskSpecError(
            f"{_shown(path)}: [build] kind = {value!r} — allowed: one of {_listed(KINDS)}, or "
            f"{{baseline = \"triton\", candidate = \"cuda\"}} where the rule sheet lets the sides differ"
        )
    unknown = [k for k in value if k not in SIDES]
    missing = [s for s in SIDES if s not in value]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing {missing[0]!r}"
        raise TaskSpecError(f"{_shown(path)}: [build] kind — {what}; a per-side kind is {{baseline = ..., candidate = ...}}")
    for side in SIDES:
        _check_kind(path, f"kind.{side}", value[side])
    baseline, candidate = value["baseline"], value["candidate"]
    if baseline != candidate and baseline not in FREE_BASELINE_KINDS:
        raise TaskSpecError(
            f"{_shown(path)}: [build] kind = {_kind_text((baseline, candidate))} — refused: a {_toml(baseline)} baseline "
            f"needs the candidate built by the same builder with the same registration style (rule sheet: a CUDA/C++ "
            f"baseline and its candidate use the same build and export path); allowed: kind = {_toml(baseline)}. "
            f"Only a {' / '.join(FREE_BASELINE_KINDS)} baseline may face a candidate of another kind"
        )
    return baseline, candidate


def _check_kind(path: Path, field: str, value: Any) -> None:
    if value not in KINDS:
        raise TaskSpecError(f"{_shown(path)}: [build] {field} = {_toml(value)} — allowed: {_listed(KINDS)}")


def _check_sources(path: Path, sources: tuple[str, ...], compiled: list[str], kinds: tuple[str, str]) -> None:
    if not compiled:
        if sources:
            raise TaskSpecError(
                f"{_shown(path)}: [build] sources — only for a compiled side ({_listed(COMPILED_KINDS)}); "
                f"kind = {_kind_text(kinds)} imports {_listed(MODULE_KINDS)} sides from `entry`"
            )
        return
    if not sources:
        raise TaskSpecError(f"{_shown(path)}: [build] sources — needed for kind = {_toml(compiled[0])}, e.g. [\"kernel.cu\"]")
    for source in sources:
        if Path(source).is_absolute() or ".." in Path(source).parts:
            raise TaskSpecError(f"{_shown(path)}: [build] sources {source!r} — must be relative to each side's folder")
    if len(set(sources)) != len(sources):
        raise TaskSpecError(f"{_shown(path)}: [build] sources = {list(sources)!r} — lists a file twice")


def _check_include_dirs(path: Path, folders: tuple[str, ...], compiled: list[str], kinds: tuple[str, str]) -> None:
    if folders and not compiled:
        raise TaskSpecError(
            f"{_shown(path)}: [build] include_dirs — only for a compiled side ({_listed(COMPILED_KINDS)}); "
            f"kind = {_kind_text(kinds)} compiles nothing"
        )
    for folder in folders:
        if not folder or Path(folder).is_absolute() or ".." in Path(folder).parts:
            raise TaskSpecError(
                f"{_shown(path)}: [build] include_dirs {folder!r} — must be a folder relative to each side's folder, "
                f"e.g. \"upstream/include\" (baseline/upstream/include on the baseline side)"
            )
    if len(set(folders)) != len(folders):
        raise TaskSpecError(f"{_shown(path)}: [build] include_dirs = {list(folders)!r} — lists a folder twice")


def _exports(path: Path, value: Any, kinds: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """tvm-ffi: {export name = "C++ callable"}, where "{args}" stands for the row's template arguments."""
    if "tvm-ffi" not in kinds:
        if value is not None:
            raise TaskSpecError(f"{_shown(path)}: [build] exports — only for kind = \"tvm-ffi\"")
        return ()
    example = '{qknorm_rope = "QKNormRopeKernel<{args}>::run"}'
    if not isinstance(value, dict) or not value:
        raise TaskSpecError(
            f"{_shown(path)}: [build] exports — needed for kind = \"tvm-ffi\": export name = C++ callable, "
            f"e.g. exports = {example}"
        )
    for name, target in value.items():
        if not EXPORT_NAME.fullmatch(name):
            raise TaskSpecError(f"{_shown(path)}: [build] exports {name!r} — allowed: a C identifier")
        if not _export_target_ok(target):
            raise TaskSpecError(
                f"{_shown(path)}: [build] exports {name} = {target!r} — allowed: one C++ callable expression "
                f"(no ';', '#', newline; '{{args}}' is the only placeholder), e.g. exports = {example}"
            )
    return tuple(value.items())


def _export_target_ok(target: Any) -> bool:
    """One C++ callable expression: nothing that could end the export line or start a preprocessor directive."""
    if not isinstance(target, str) or not target.strip():
        return False
    return not any(c in target.replace("{args}", "") for c in ";#{}\n\r\\")


def _kind_text(kinds: tuple[str, str]) -> str:
    if kinds[0] == kinds[1]:
        return _toml(kinds[0])
    return f"{{baseline = {_toml(kinds[0])}, candidate = {_toml(kinds[1])}}}"


def _compiled_side(kinds: tuple[str, str]) -> str:
    return next(side for side, kind in zip(SIDES, kinds) if kind in COMPILED_KINDS)


def kind_of(build: BuildSpec, side: str) -> str:
    """A side's kind (a BuildSpec made before per-side kinds has only `kind`, the same for both)."""
    return dict(zip(SIDES, build.kinds))[side] if build.kinds else build.kind


def needed_files(build: BuildSpec, side: str) -> list[str]:
    """What must be in a side's folder for its builder."""
    kind = kind_of(build, side)
    return list(build.sources) if kind in COMPILED_KINDS else [f"{build.entry}.py"]


def needed_field(build: BuildSpec, side: str) -> str:
    return "sources" if kind_of(build, side) in COMPILED_KINDS else "entry"


def check_packages(path: Path, build: BuildSpec) -> None:
    """Refuse, before anything runs, a task whose kind needs a package this Python lacks (named, with pip's name).

    On a machine without an NVIDIA driver a cutedsl or tvm-ffi side cannot run: its rows are NOT CHECKED there,
    so its package is not needed (tvm-ffi's compile-only check is skipped, with a note, when the package is absent).
    """
    for side in SIDES:
        kind = kind_of(build, side)
        module, distribution = PACKAGES.get(kind, (None, None))
        if kind not in CPU_KINDS and not gpu_driver_here():
            continue
        if module and importlib.util.find_spec(module) is None:
            raise TaskSpecError(
                f"{_shown(path)}: [build] kind = {_kind_text(tuple(kind_of(build, s) for s in SIDES))} — the {side} side "
                f"needs the package {distribution} (import {module}), which this host's Python ({sys.executable}) "
                f"lacks; install it there (pip install {distribution})"
            )


def gpu_driver_here() -> bool:
    """Whether this machine has the NVIDIA kernel driver, i.e. could run a CUDA side at all."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def package_versions(build: BuildSpec) -> dict[str, str | None]:
    """The version of each package the task's kinds use (recorded with the build)."""
    wanted = {PACKAGES[k][1] for k in (kind_of(build, s) for s in SIDES) if k in PACKAGES}
    return {name: distribution_version(name) for name in sorted(wanted)}


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def not_checked_here(build: BuildSpec, device: str) -> dict[str, str]:
    """{side: why} for each side that cannot run on this device: its rows are NOT CHECKED (never passed)."""
    if device.startswith("cuda"):
        return {}
    reasons = {}
    for side in SIDES:
        kind = kind_of(build, side)
        if kind not in CPU_KINDS:
            reasons[side] = f"{side} side ({kind}) cannot run without a GPU"
    return reasons


def needs_triton_interpreter(build: BuildSpec, device: str) -> bool:
    """On a machine without a GPU a triton side runs through Triton's interpreter (TRITON_INTERPRET=1)."""
    return not device.startswith("cuda") and any(kind_of(build, s) == "triton" for s in SIDES)


def include_paths(spec: TaskSpec, side: str) -> list[str]:
    """The side's folder, then each `include_dirs` folder under it that the side has (as a compiler skips a missing
    -I); a folder that no compiled side has is an error: a typo, or upstream files not materialized."""
    folders = [spec.side_dir(side)]
    for name in spec.build.include_dirs:
        found = [s for s in SIDES if kind_of(spec.build, s) in COMPILED_KINDS and (spec.side_dir(s) / name).is_dir()]
        if not found:
            where = " or ".join(f"{spec.side_dir(s).name}/" for s in SIDES if kind_of(spec.build, s) in COMPILED_KINDS)
            raise RuntimeError(f"{_shown(spec.root / 'task.toml')}: [build] include_dirs {name!r} — no such folder "
                               f"in {where}")
        if side in found:
            folders.append(spec.side_dir(side) / name)
    return [str(folder) for folder in folders]


def host_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    """The part of the one flags list that the host C++ compiler understands too (nvcc gets all of it)."""
    return [flag for flag in flags if flag.startswith(HOST_FLAG_PREFIXES)]


# ============================================================================================ builders


@dataclass
class Built:
    """What one side's build left: `module` is what the loader needs later (an extension file, a build folder)."""
    module: str | None = None
    error: str | None = None  # "inconclusive: ..." when a compile-only check could not run here
    note: str | None = None  # a check that was skipped, and why (not an error)


class Builder:
    """One kind's way to build a side and to load it for the adapter, the same for both sides."""
    kind = ""

    def describe(self, build: BuildSpec) -> str:
        raise NotImplementedError

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """Build the side on a machine where it runs (folder: raw/build/<side>)."""
        raise NotImplementedError

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """What can be checked without a GPU; the side's rows are NOT CHECKED whatever this finds."""
        return Built(error=None)

    def load(self, spec: TaskSpec, side: str, module: str | None) -> Any:
        raise NotImplementedError


class ModuleBuilder(Builder):
    """triton, cutedsl, python: the side is its <entry>.py, imported as package kp_<side> over the side's folder."""

    def __init__(self, kind: str, description: str) -> None:
        self.kind = kind
        self.description = description

    def describe(self, build: BuildSpec) -> str:
        interpreted = " (interpreter: TRITON_INTERPRET=1)" if self.kind == "triton" and \
            os.environ.get("TRITON_INTERPRET") == "1" else ""
        return self.description + interpreted

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        self.load(spec, side, None)
        return Built()

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        return Built()  # importing a CuTe DSL side without a GPU proves little and may fail for that reason alone

    def load(self, spec: TaskSpec, side: str, module: str | None) -> types.ModuleType:
        package = module_name(side)
        if package not in sys.modules:
            holder = types.ModuleType(package)
            holder.__path__ = [str(spec.side_dir(side))]  # a package over the side's folder: relative imports work
            sys.modules[package] = holder
        return importlib.import_module(f"{package}.{spec.build.entry}")


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
        """nvcc -c each source with torch's headers and the same flags."""
        from torch.utils import cpp_extension

        nvcc = find_nvcc()
        if nvcc is None:
            return Built(note="compile-only check skipped: nvcc not found on PATH or in CUDA_HOME")
        includes = [*include_paths(spec, side), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        folder.mkdir(parents=True, exist_ok=True)
        for source in spec.build.sources:
            command = [nvcc, *default_standard(spec.build.flags), *spec.build.flags, *cpu_torch_defines(includes[0]),
                       *(f"-I{p}" for p in includes),
                       f"-DTORCH_EXTENSION_NAME={module_name(side)}", "-c", str(spec.side_dir(side) / source),
                       "-o", str(folder / (Path(source).name + ".o"))]
            error = _run_compiler(command, spec, source)
            if error:
                return Built(error=error)
        return Built()

    def load(self, spec: TaskSpec, side: str, module: str | None) -> types.ModuleType:
        if module is None:
            raise RuntimeError(f"the {side} extension was not built")
        import torch  # noqa: F401 - an extension needs torch's libraries loaded first

        return import_file(module_name(side), Path(module))


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
        return Built(module=str(folder), error=_run_compiler(command, spec, "the generated tvm-ffi unit"))

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
                extra_include_paths=include_paths(self.spec, self.side), build_directory=str(self.folder / name),
            )
        return self._modules[key]


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
            f"{_shown(spec.side_dir(side) / source)}: registers its own {SELF_REGISTRATION.pattern} — refused: the "
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
    arch = ARCH_LISTS.get(spec.task.arch)
    if arch and "TVM_FFI_CUDA_ARCH_LIST" not in os.environ:
        os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch


BUILDERS: dict[str, Builder] = {
    "triton": ModuleBuilder("triton", "triton JIT, one process, one TRITON_CACHE_DIR"),
    "cutedsl": ModuleBuilder("cutedsl", "nvidia-cutlass-dsl JIT (cute.compile on first call), one process"),
    "python": ModuleBuilder("python", "python import, one process"),
    "cuda": CudaBuilder(),
    "tvm-ffi": TvmFfiBuilder(),
}


def builder_for(build: BuildSpec, side: str) -> Builder:
    return BUILDERS[kind_of(build, side)]


# ============================================================================================ helpers


def module_name(side: str) -> str:
    return f"kp_{side}"


def import_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def find_nvcc() -> str | None:
    import shutil

    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home) / "bin" / "nvcc" if home else None
    return str(candidate) if candidate and candidate.is_file() else None


def _run_compiler(command: list[str], spec: TaskSpec, source: str) -> str | None:
    sys.stdout.flush()
    os.write(1, f"$ {' '.join(command)}\n".encode())  # to the build log (fd 1 while a side builds)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.write(1, done.stdout.encode() + b"\n")
    if done.returncode == 0:
        return None
    errors = [line for line in done.stdout.splitlines() if "error" in line]
    own = [line for line in errors if not MISSING_HEADER.search(line)]  # the source's own errors, not a lack here
    header = MISSING_HEADER.search(done.stdout)
    if header and not own and not any(spec.root.rglob(Path(header.group(1)).name)):
        # A CPU machine's torch and CUDA toolkit often lack headers a GPU host has (cusparse.h, ...).
        return f"inconclusive: compile-only check could not run here ({header.group(1)} is not installed)"
    first = (own or errors)[:1]
    raise RuntimeError(f"nvcc failed on {source}: {first[0] if first else f'exit code {done.returncode}'}")
