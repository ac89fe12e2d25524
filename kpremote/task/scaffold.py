"""`inv new-task NAME`: a new task folder from kpremote/templates/new_task, ready for `inv check` at once.

Standard library only. The template holds the baseline; the candidate (solution/) starts as a copy of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..agent.protocol import is_name
from ..errors import ScaffoldError

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "new_task"
NAME_MAX = 100
ARCH_PREFIXES = ("b200", "h200", "h100")
TEXT_SUFFIXES = {".py", ".toml", ".md", ".txt", ".cu", ".cuh", ".cpp", ".h"}
# The candidate starts as the baseline: one file in the template, two in every new task.
CANDIDATE_FROM_BASELINE = (Path("baseline/kernel.py"), Path("solution/kernel.py"))


def arch_for(name: str) -> str:
    """b200_* → b200, h200_* → h200, h100_* → h100, else any (the users' naming convention)."""
    prefix = name.split("_", 1)[0].lower()
    return prefix if prefix in ARCH_PREFIXES else "any"


def new_task(name: str, kernels_dir: Path) -> Path:
    """Create kernels_dir/name from the template; refuses a bad name or an existing folder."""
    if not is_name(name) or len(name) > NAME_MAX:
        raise ScaffoldError(
            f"bad task name {name!r}: start with a letter or digit, then letters, digits, '_', '.', '-' "
            f"(at most {NAME_MAX})"
        )
    kernels_dir = Path(kernels_dir)
    destination = kernels_dir / name
    if destination.exists():
        raise ScaffoldError(f"{destination} already exists: choose another name or remove it first")
    kernels_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=kernels_dir))
    try:
        _fill(staging, {"__NAME__": name, "__ARCH__": arch_for(name)})
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it 0700: the task folder gets a folder's usual mode
        os.rename(staging, destination)  # all or nothing: no half-made task is ever left behind
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fill(target: Path, values: dict[str, str]) -> None:
    for source in sorted(TEMPLATE.rglob("*")):
        if not source.is_file() or "__pycache__" in source.parts:
            continue
        relative = source.relative_to(TEMPLATE)
        _write(target / relative, source, values)
    origin, copy = CANDIDATE_FROM_BASELINE
    _write(target / copy, TEMPLATE / origin, values)


def _write(path: Path, source: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if source.suffix not in TEXT_SUFFIXES:
        shutil.copyfile(source, path)
        return
    text = source.read_text()
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    path.write_text(text)
