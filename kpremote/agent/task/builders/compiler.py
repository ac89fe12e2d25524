"""The compiled kinds' (cuda, tvm-ffi) common ground: the one flags list as each compiler takes it, the header
folders of a side, finding nvcc, and running a compile-only check into the build log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ..buildrules import COMPILED_KINDS, kind_of
from ..taskspec import SIDES, TaskSpec, shown

HOST_FLAG_PREFIXES = ("-O", "-std=", "-D", "-U", "-I")
MISSING_HEADER = re.compile(r"fatal error: ([^\s:]+): No such file or directory")


def default_standard(flags) -> list[str]:
    """-std=c++17 unless the task's one flag list names its standard (nvcc refuses two; torch >= 2.10 needs 20)."""
    return [] if any(flag.startswith("-std=") for flag in flags) else ["-std=c++17"]


def include_paths(spec: TaskSpec, side: str) -> list[str]:
    """The side's folder, then each `include_dirs` folder under it that the side has (as a compiler skips a missing
    -I); a folder that no compiled side has is an error: a typo, or upstream files not materialized."""
    folders = [spec.side_dir(side)]
    for name in spec.build.include_dirs:
        found = [s for s in SIDES if kind_of(spec.build, s) in COMPILED_KINDS and (spec.side_dir(s) / name).is_dir()]
        if not found:
            where = " or ".join(f"{spec.side_dir(s).name}/" for s in SIDES if kind_of(spec.build, s) in COMPILED_KINDS)
            raise RuntimeError(f"{shown(spec.root / 'task.toml')}: [build] include_dirs {name!r} — no such folder "
                               f"in {where}")
        if side in found:
            folders.append(spec.side_dir(side) / name)
    return [str(folder) for folder in folders]


def host_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    """The part of the one flags list that the host C++ compiler understands too (nvcc gets all of it)."""
    return [flag for flag in flags if flag.startswith(HOST_FLAG_PREFIXES)]


def find_nvcc() -> str | None:
    import shutil

    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidate = Path(home) / "bin" / "nvcc" if home else None
    return str(candidate) if candidate and candidate.is_file() else None


def run_compiler(command: list[str], spec: TaskSpec, source: str) -> str | None:
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
