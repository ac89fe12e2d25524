"""Shipped CUDA tasks build on every torch the README allows: their one flag list names a C++ standard at least
as new as the one this torch requires (its headers' #error, and the standard cpp_extension builds with).

torch >= 2.10 requires C++20 ("C++20 or later compatible compiler is required to use PyTorch"); a task that pins
-std=c++17 then fails to build on the GPU host, on both sides alike. The test reads the requirement from the torch
installed here, so it follows torch as it moves.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def side_kinds(build: dict) -> set[str]:
    """Every side's kind: `kind` is one string for both sides, or a {baseline, candidate} table (build kinds)."""
    kind = build["kind"]
    return set(kind.values()) if isinstance(kind, dict) else {kind}


CUDA_TASKS = sorted(p.parent for p in (REPO / "kernels").glob("*/task.toml")
                    if "cuda" in side_kinds(tomllib.loads(p.read_text())["build"]))


def torch_required_standard() -> int:
    torch = pytest.importorskip("torch")
    root = Path(torch.__file__).parent
    found = {int(m) for header in (root / "include").rglob("*.h")
             for m in re.findall(r"C\+\+(\d+) or later compatible compiler is required", header.read_text(errors="replace"))}
    found |= {int(m) for m in re.findall(r"-std=c\+\+(\d+)", (root / "utils" / "cpp_extension.py").read_text())}
    assert found, "could not find torch's C++ standard requirement"
    return max(found)


def standards(flags: list[str]) -> list[int]:
    return [int(m.group(1)) for flag in flags if (m := re.fullmatch(r"-std=c\+\+(\d+)", flag))]


def test_there_is_a_shipped_cuda_task_to_check() -> None:
    assert CUDA_TASKS


@pytest.mark.parametrize("task", CUDA_TASKS, ids=[t.name for t in CUDA_TASKS])
def test_a_cuda_tasks_one_flag_list_meets_torchs_cxx_standard(task: Path) -> None:
    flags = tomllib.loads((task / "task.toml").read_text())["build"]["flags"]
    [standard] = standards(flags)  # exactly one -std, for nvcc and the host compiler alike (build.py)
    required = torch_required_standard()
    assert standard >= required, f"{task.name}: -std=c++{standard}, torch {__import__('torch').__version__} needs C++{required}"

