"""Symmetric builds: both sides go through the same builder with the same flags, and the record says how.

triton: each side's <entry>.py is imported from its folder by the one loader below, as package `kp_baseline` /
  `kp_candidate` over that folder (so a side's sibling files import relatively and never collide with the
  other side's); both sides JIT-compile in the same process with one TRITON_CACHE_DIR inside the run folder.
cuda: each side's `sources` go through torch.utils.cpp_extension.load with the identical flag list (nvcc gets
  all of it; the host compiler the part it understands), build folder raw/build/<side>. On a machine without a
  GPU only a compile-only nvcc check runs, and rows are SKIPPED.
torch is imported lazily: the runner imports this module for paths and names only.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .taskspec import SIDES, TaskSpec

MODULE_PREFIX = "kp_"
# Flags the host C++ compiler understands too; nvcc gets every flag in the list.
HOST_FLAG_PREFIXES = ("-O", "-std=", "-D", "-U", "-I")
MISSING_HEADER = re.compile(r"fatal error: ([^\s:]+): No such file or directory")
CUDA_ON_CPU = "CUDA side cannot run on CPU"


@dataclass
class SideBuild:
    side: str
    ok: bool
    seconds: float
    log: str  # path relative to the run folder
    module: str | None = None  # the built extension's file (cuda)
    error: str | None = None


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
    compile_only: bool = False
    note: str | None = None  # why a check was skipped or was inconclusive

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


def module_name(side: str) -> str:
    return f"{MODULE_PREFIX}{side}"


def build_dir(run_dir: Path, side: str | None = None) -> Path:
    base = Path(run_dir) / "raw" / "build"
    return base / side if side else base


def triton_cache_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "raw" / "triton-cache"


def host_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    return [flag for flag in flags if flag.startswith(HOST_FLAG_PREFIXES)]


# --------------------------------------------------------------------------------------------- building


def build_sides(spec: TaskSpec, run_dir: Path, device: str) -> BuildRecord:
    """Build (or, for a CUDA task on the CPU, compile-check) both sides the same way."""
    record = BuildRecord(
        kind=spec.build.kind,
        builder=_builder_name(spec.build.kind),
        flags=list(spec.build.flags),
        host_flags=host_flags(spec.build.flags),
        sources=list(spec.build.sources),
        entry=spec.build.entry,
        env=_build_env(),
        compile_only=spec.build.kind == "cuda" and not device.startswith("cuda"),
    )
    if record.compile_only:
        nvcc = find_nvcc()
        if nvcc is None:
            record.note = "compile-only check skipped: nvcc not found on PATH or in CUDA_HOME"
            return record
        record.builder = f"nvcc -c (compile-only check: {CUDA_ON_CPU})"
    for side in SIDES:
        record.sides[side] = _build_one(spec, run_dir, side, record)
    inconclusive = [s for s in record.sides.values() if s.error and s.error.startswith("inconclusive")]
    if inconclusive:
        record.note = inconclusive[0].error
    return record


def _build_one(spec: TaskSpec, run_dir: Path, side: str, record: BuildRecord) -> SideBuild:
    log = build_dir(run_dir, side).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    module_file = None
    error = None
    with _output_to(log):
        try:
            if record.compile_only:
                error = _compile_only(spec, run_dir, side, record.flags)
            elif spec.build.kind == "cuda":
                module_file = _build_cuda_extension(spec, run_dir, side, record.flags).__file__
            else:
                import_side(spec, side)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a side that fails to build fails the build
            error = f"{type(exc).__name__}: {exc}"
            import traceback

            traceback.print_exc()
    seconds = round(time.perf_counter() - started, 3)
    ok = error is None or error.startswith("inconclusive")
    relative = str(log.relative_to(run_dir))
    return SideBuild(side=side, ok=ok, seconds=seconds, log=relative, module=module_file, error=error)


def _build_cuda_extension(spec: TaskSpec, run_dir: Path, side: str, flags: list[str]) -> types.ModuleType:
    from torch.utils import cpp_extension

    folder = build_dir(run_dir, side)
    folder.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=module_name(side),
        sources=[str(spec.side_dir(side) / source) for source in spec.build.sources],
        extra_cflags=host_flags(flags),
        extra_cuda_cflags=list(flags),
        build_directory=str(folder),
        verbose=True,
    )
    sys.stdout.flush()
    return module


def _compile_only(spec: TaskSpec, run_dir: Path, side: str, flags: list[str]) -> str | None:
    """nvcc -c each source with torch's headers; None when it compiled, else why not."""
    from torch.utils import cpp_extension

    nvcc = find_nvcc()
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    out_dir = build_dir(run_dir, side)
    out_dir.mkdir(parents=True, exist_ok=True)
    for source in spec.build.sources:
        # The task's own -std if it names one (nvcc refuses two); torch >= 2.10 needs C++20.
        standard = [] if any(flag.startswith("-std=") for flag in flags) else ["-std=c++17"]
        command = [nvcc, *standard, *flags, *(f"-I{p}" for p in includes),
                   f"-DTORCH_EXTENSION_NAME={module_name(side)}", "-c", str(spec.side_dir(side) / source),
                   "-o", str(out_dir / (Path(source).name + ".o"))]
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(done.stdout, flush=True)
        if done.returncode != 0:
            header = MISSING_HEADER.search(done.stdout)
            if header and not _task_has_file(spec, header.group(1)):
                # A CPU machine's torch and CUDA toolkit often lack headers a GPU host has (cusparse.h, ...).
                return f"inconclusive: compile-only check could not run here ({header.group(1)} is not installed)"
            last = [line for line in done.stdout.splitlines() if "error" in line][:1]
            raise RuntimeError(f"nvcc failed on {source}: {last[0] if last else f'exit code {done.returncode}'}")
    return None


def _task_has_file(spec: TaskSpec, name: str) -> bool:
    return any(spec.root.rglob(Path(name).name))


# --------------------------------------------------------------------------------------------- loading


def import_side(spec: TaskSpec, side: str, module_file: str | None = None) -> types.ModuleType:
    """The one loader for both sides: the module a side's calls go through."""
    if spec.build.kind == "cuda":
        if module_file is None:
            raise RuntimeError(f"the {side} extension was not built")
        import torch  # noqa: F401 - an extension needs torch's libraries loaded first

        return _import_file(module_name(side), Path(module_file))
    package = module_name(side)
    if package not in sys.modules:
        holder = types.ModuleType(package)
        holder.__path__ = [str(spec.side_dir(side))]  # a package over the side's folder: relative imports work
        sys.modules[package] = holder
    return importlib.import_module(f"{package}.{spec.build.entry}")


def import_adapter(spec: TaskSpec) -> types.ModuleType:
    return _import_file("kp_adapter", spec.adapter_path)


def _import_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------- toolchain


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home) / "bin" / "nvcc" if home else None
    return str(candidate) if candidate and candidate.is_file() else None


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
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
    except ImportError:
        versions["torch"] = None
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    versions["nvcc"] = nvcc_version()
    return versions


def _builder_name(kind: str) -> str:
    if kind == "triton":
        interpreted = " (interpreter: TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1" else ""
        return f"triton JIT, one process, one TRITON_CACHE_DIR{interpreted}"
    return "torch.utils.cpp_extension.load"


def _build_env() -> dict[str, str]:
    """The environment that shapes code generation, recorded because it applies to both sides."""
    keys = ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CC", "CXX", "MAX_JOBS")
    return {k: v for k, v in os.environ.items() if k in keys or k.startswith("TRITON_")}


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
