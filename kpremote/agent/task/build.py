"""Symmetric builds: each side goes through its kind's one builder (builders/) with the one flags list, and the
record says how.

triton / cutedsl / python: each side's <entry>.py is imported by one loader, as package `kp_baseline` /
  `kp_candidate` over that side's folder; Triton sides share one TRITON_CACHE_DIR inside the run folder.
cuda: each side's `sources` through torch.utils.cpp_extension.load; tvm-ffi: through apache-tvm-ffi, once per set
  of template arguments from the row. On a machine without a GPU, a side that cannot run there gets what checks
  are possible (a compile-only build for cuda / tvm-ffi) and its rows are NOT CHECKED (buildrules.not_checked_here).
torch is imported lazily: the runner imports this module for paths and names only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import platform
import re
import subprocess
import sys
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import sandbox
from . import buildrules, sourceonly
from .builders import builder_for
from .builders.base import Builder, Built, import_file
from .builders.compiler import find_nvcc, host_flags
from .taskspec import SIDES, TaskSpec


@dataclass
class SideBuild:
    side: str
    ok: bool
    seconds: float
    log: str  # path relative to the run folder
    module: str | None = None  # what the loader needs: the built extension's file (cuda), the build folder (tvm-ffi)
    error: str | None = None
    kind: str | None = None
    builder: str | None = None


@dataclass
class BuildRecord:
    kind: str
    builder: str
    flags: list[str]
    host_flags: list[str]
    sources: list[str]
    entry: str
    env: dict[str, str]
    sides: dict[str, SideBuild] = field(default_factory=dict)
    compile_only: bool = False  # some side cannot run here: only what can be checked without a GPU was
    note: str | None = None  # why a check was skipped or was inconclusive
    kinds: dict[str, str] = field(default_factory=dict)
    exports: list[list[str]] = field(default_factory=list)
    packages: dict[str, str | None] = field(default_factory=dict)  # versions of the packages the kinds use
    not_checked: dict[str, str] = field(default_factory=dict)  # side: why its rows are NOT CHECKED here

    @property
    def ok(self) -> bool:
        return all(side.ok for side in self.sides.values())

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["ok"] = self.ok
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "BuildRecord":
        values = {k: v for k, v in record.items() if k != "ok"}
        values["sides"] = {name: SideBuild(**side) for name, side in record.get("sides", {}).items()}
        return cls(**values)


def build_dir(run_dir: Path, side: str | None = None) -> Path:
    base = Path(run_dir) / "raw" / "build"
    return base / side if side else base


def side_reads(run_dir: Path, side: str, task_dir: Path) -> dict[str, str]:
    """reads_env for one side's timing process, or its calls under the audit's or a profile's ncu: it reads its
    task copy and its own build folder (its scratch folder it always may)."""
    return sandbox.reads_env(run_dir, [Path(task_dir), build_dir(run_dir, side)])


def triton_cache_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "raw" / "triton-cache"


# --------------------------------------------------------------------------------------------- building


def build_sides(spec: TaskSpec, run_dir: Path, device: str, build_one: Any = None, *,
                at_once: bool = False) -> BuildRecord:
    """Build both sides, each with its kind's builder; a side that cannot run here gets a check only.
    `build_one(spec, run_dir, side, builder, check_only=...)` builds one side (default: here, in this process;
    the worker passes one that builds each side in a sandboxed process of its own, and `at_once`: both sides'
    processes run side by side, as neither can see the other's folder; in this process they could not, as a
    build here sends this process's own output to its side's log)."""
    build_one = build_one or build_one_here
    kinds = {side: buildrules.kind_of(spec.build, side) for side in SIDES}
    builders = {side: builder_for(spec.build, side) for side in SIDES}
    not_checked = buildrules.not_checked_here(spec.build, device)
    record = BuildRecord(
        kind=spec.build.kind,
        builder=_joined({side: builders[side].describe(spec.build) for side in SIDES}),
        flags=list(spec.build.flags),
        host_flags=host_flags(spec.build.flags),
        sources=list(spec.build.sources),
        entry=spec.build.entry,
        env=_build_env(),
        compile_only=bool(not_checked),
        kinds=kinds,
        exports=[list(e) for e in spec.build.exports],
        packages=buildrules.package_versions(spec.build),
        not_checked=not_checked,
    )
    def one(side: str) -> tuple[SideBuild, str | None]:
        return build_one(spec, run_dir, side, builders[side], check_only=side in not_checked)

    if at_once:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(SIDES)) as pool:
            built = dict(zip(SIDES, pool.map(one, SIDES)))
    else:
        built = {side: one(side) for side in SIDES}
    skipped = []
    for side in SIDES:  # the record names the sides in one order however they were built
        record.sides[side], note = built[side]
        skipped.append(note)
    notes = [s.error for s in record.sides.values() if s.error and s.error.startswith("inconclusive")]
    notes += [note for note in skipped if note]
    if notes:
        record.note = notes[0]
    record.env = _build_env()  # a builder may have set an arch list for both sides
    return record


def build_one_here(spec: TaskSpec, run_dir: Path, side: str, builder: Builder, *,
               check_only: bool) -> tuple[SideBuild, str | None]:
    """The side's build (or, where it cannot run, its check) and a note when a check was skipped."""
    log = build_dir(run_dir, side).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    built = Built()
    with _output_to(log):
        try:
            if check_only:
                built = builder.check(spec, side, build_dir(run_dir, side))
            else:
                built = builder.build(spec, side, build_dir(run_dir, side))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a side that fails to build fails the build
            built = Built(error=f"{type(exc).__name__}: {exc}")
            import traceback

            traceback.print_exc()
    seconds = round(time.perf_counter() - started, 3)
    ok = built.error is None or built.error.startswith("inconclusive")
    description = builder.describe(spec.build)
    if check_only:
        description = f"{description}; here only a check ({buildrules.NOT_CHECKED}: no GPU)"
    return SideBuild(side=side, ok=ok, seconds=seconds, log=str(log.relative_to(run_dir)), module=built.module,
                     error=built.error, kind=builder.kind, builder=description), built.note


def _joined(descriptions: dict[str, str]) -> str:
    values = set(descriptions.values())
    if len(values) == 1:
        return values.pop()
    return "; ".join(f"{side}: {text}" for side, text in descriptions.items())


# --------------------------------------------------------------------------------------------- loading


def import_side(spec: TaskSpec, side: str, module_file: str | None = None) -> Any:
    """The one loader for both sides: what a side's calls go through (a module, or a tvm-ffi side's loader).
    Task code comes from its source, never from bytecode beside it (sourceonly.py)."""
    sourceonly.install(spec.root)
    return builder_for(spec.build, side).load(spec, side, module_file)


def import_adapter(spec: TaskSpec) -> types.ModuleType:
    sourceonly.install(spec.root)
    return import_file("kp_adapter", spec.adapter_path)


_CONTEXTS: dict[str, types.ModuleType] = {}


def import_context(spec: TaskSpec) -> types.ModuleType:
    """bench/context.py (the contexts rows may name), imported once per process, from its source."""
    key = str(spec.context_path)
    if key not in _CONTEXTS:
        sourceonly.install(spec.root)
        _CONTEXTS[key] = import_file("kp_context", spec.context_path)
    return _CONTEXTS[key]


# --------------------------------------------------------------------------------------------- toolchain


def nvcc_version(nvcc: str | None = None) -> str | None:
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        return None
    try:
        done = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    release = re.search(r"release [^\n]*", done.stdout)
    return release.group(0) if release else (done.stdout.strip().splitlines() or [None])[-1]


def toolchain_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version()}
    versions.update(torch_versions())
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    versions["nvcc"] = nvcc_version()
    versions["tvm_ffi"] = buildrules.distribution_version("apache-tvm-ffi")
    versions["cutlass_dsl"] = buildrules.distribution_version("nvidia-cutlass-dsl")
    return versions


def torch_versions() -> dict[str, Any]:
    """torch's version and the CUDA it was built for, read from its own torch/version.py without importing torch
    (a second of CPU that a CPU run's prepare step would spend on nothing else); {"torch": None} without torch."""
    import importlib.util
    import runpy

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return {"torch": None}
    try:
        version = runpy.run_path(str(Path(spec.origin).with_name("version.py")))
        return {"torch": version["__version__"], "cuda": version["cuda"]}
    except (OSError, KeyError, SyntaxError):  # a torch laid out otherwise: ask it
        import torch

        return {"torch": torch.__version__, "cuda": torch.version.cuda}


def _build_env() -> dict[str, str]:
    """The environment that shapes code generation, recorded because it applies to both sides."""
    keys = ("TORCH_CUDA_ARCH_LIST", "TVM_FFI_CUDA_ARCH_LIST", "CUDA_HOME", "CC", "CXX", "MAX_JOBS")
    prefixes = ("TRITON_", "CUTE_DSL_", "CUTLASS_")
    return {k: v for k, v in os.environ.items() if k in keys or k.startswith(prefixes)}


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (ninja and nvcc included) to log while building one side."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
