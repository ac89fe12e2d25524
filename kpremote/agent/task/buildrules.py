"""Build kinds' rules: which kinds may face each other, and what each kind needs (docs/task-contract.md, "Build kinds").

Kinds, by the users' rule sheet (each has its one builder in builders/):
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

Standard library only: taskspec validates with these rules without importing torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from .taskrecords import (
    SIDES,
    BuildSpec,
    TaskSpecError,
    listed,
    shown,
    string_list,
    toml_text,
)

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
EXPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_build(path: Path, values: dict[str, Any]) -> BuildSpec:
    """task.toml's [build] table, validated: kinds by the rule sheet, one flags list, what each kind needs."""
    kinds = side_kinds(path, values.get("kind"))
    compiled = [k for k in kinds if k in COMPILED_KINDS]
    flags = tuple(string_list(path, "build", "flags", values.get("flags", [])))
    sources = tuple(string_list(path, "build", "sources", values.get("sources", [])))
    include_dirs = tuple(string_list(path, "build", "include_dirs", values.get("include_dirs", [])))
    kind = kinds[0] if kinds[0] == kinds[1] else f"{kinds[0]}+{kinds[1]}"
    if flags and not compiled:
        raise TaskSpecError(
            f"{shown(path)}: [build] flags = {list(flags)!r} — must be [] for kind = {_kind_text(kinds)} "
            f"(no side is compiled from sources; both are JIT-compiled with the same options)"
        )
    fast = [f for f in flags if FAST_MATH.fullmatch(f)]
    if fast and len(compiled) == 1:
        raise TaskSpecError(
            f"{shown(path)}: [build] flags {fast[0]!r} — refused: only the {_compiled_side(kinds)} side is compiled, "
            f"so fast math would change one side's numerics (rule sheet: no fast math unless both sides use it)"
        )
    _check_sources(path, sources, compiled, kinds)
    _check_include_dirs(path, include_dirs, compiled, kinds)
    entry = values.get("entry", "kernel")
    if not isinstance(entry, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", entry):
        raise TaskSpecError(f"{shown(path)}: [build] entry = {entry!r} — allowed: a Python module name, e.g. \"kernel\"")
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
            f"{shown(path)}: [build] kind = {value!r} — allowed: one of {listed(KINDS)}, or "
            f"{{baseline = \"triton\", candidate = \"cuda\"}} where the rule sheet lets the sides differ"
        )
    unknown = [k for k in value if k not in SIDES]
    missing = [s for s in SIDES if s not in value]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing {missing[0]!r}"
        raise TaskSpecError(f"{shown(path)}: [build] kind — {what}; a per-side kind is {{baseline = ..., candidate = ...}}")
    for side in SIDES:
        _check_kind(path, f"kind.{side}", value[side])
    baseline, candidate = value["baseline"], value["candidate"]
    if baseline != candidate and baseline not in FREE_BASELINE_KINDS:
        raise TaskSpecError(
            f"{shown(path)}: [build] kind = {_kind_text((baseline, candidate))} — refused: a {toml_text(baseline)} baseline "
            f"needs the candidate built by the same builder with the same registration style (rule sheet: a CUDA/C++ "
            f"baseline and its candidate use the same build and export path); allowed: kind = {toml_text(baseline)}. "
            f"Only a {' / '.join(FREE_BASELINE_KINDS)} baseline may face a candidate of another kind"
        )
    return baseline, candidate


def _check_kind(path: Path, field: str, value: Any) -> None:
    if value not in KINDS:
        raise TaskSpecError(f"{shown(path)}: [build] {field} = {toml_text(value)} — allowed: {listed(KINDS)}")


def _check_sources(path: Path, sources: tuple[str, ...], compiled: list[str], kinds: tuple[str, str]) -> None:
    if not compiled:
        if sources:
            raise TaskSpecError(
                f"{shown(path)}: [build] sources — only for a compiled side ({listed(COMPILED_KINDS)}); "
                f"kind = {_kind_text(kinds)} imports {listed(MODULE_KINDS)} sides from `entry`"
            )
        return
    if not sources:
        raise TaskSpecError(f"{shown(path)}: [build] sources — needed for kind = {toml_text(compiled[0])}, e.g. [\"kernel.cu\"]")
    for source in sources:
        if Path(source).is_absolute() or ".." in Path(source).parts:
            raise TaskSpecError(f"{shown(path)}: [build] sources {source!r} — must be relative to each side's folder")
    if len(set(sources)) != len(sources):
        raise TaskSpecError(f"{shown(path)}: [build] sources = {list(sources)!r} — lists a file twice")


def _check_include_dirs(path: Path, folders: tuple[str, ...], compiled: list[str], kinds: tuple[str, str]) -> None:
    if folders and not compiled:
        raise TaskSpecError(
            f"{shown(path)}: [build] include_dirs — only for a compiled side ({listed(COMPILED_KINDS)}); "
            f"kind = {_kind_text(kinds)} compiles nothing"
        )
    for folder in folders:
        if not folder or Path(folder).is_absolute() or ".." in Path(folder).parts:
            raise TaskSpecError(
                f"{shown(path)}: [build] include_dirs {folder!r} — must be a folder relative to each side's folder, "
                f"e.g. \"upstream/include\" (baseline/upstream/include on the baseline side)"
            )
    if len(set(folders)) != len(folders):
        raise TaskSpecError(f"{shown(path)}: [build] include_dirs = {list(folders)!r} — lists a folder twice")


def _exports(path: Path, value: Any, kinds: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """tvm-ffi: {export name = "C++ callable"}, where "{args}" stands for the row's template arguments."""
    if "tvm-ffi" not in kinds:
        if value is not None:
            raise TaskSpecError(f"{shown(path)}: [build] exports — only for kind = \"tvm-ffi\"")
        return ()
    example = '{qknorm_rope = "QKNormRopeKernel<{args}>::run"}'
    if not isinstance(value, dict) or not value:
        raise TaskSpecError(
            f"{shown(path)}: [build] exports — needed for kind = \"tvm-ffi\": export name = C++ callable, "
            f"e.g. exports = {example}"
        )
    for name, target in value.items():
        if not EXPORT_NAME.fullmatch(name):
            raise TaskSpecError(f"{shown(path)}: [build] exports {name!r} — allowed: a C identifier")
        if not _export_target_ok(target):
            raise TaskSpecError(
                f"{shown(path)}: [build] exports {name} = {target!r} — allowed: one C++ callable expression "
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
        return toml_text(kinds[0])
    return f"{{baseline = {toml_text(kinds[0])}, candidate = {toml_text(kinds[1])}}}"


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
                f"{shown(path)}: [build] kind = {_kind_text(tuple(kind_of(build, s) for s in SIDES))} — the {side} side "
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
