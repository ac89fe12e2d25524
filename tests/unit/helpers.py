"""Shared by the fast tests: the task they sync, a file writer, one fixture GPU, and a benchmark script as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TASK = "demo"
BENCHMARKS_GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
STANDIN_HOME = Path(__file__).resolve().parents[1] / "agent"
# A task the agent accepts (it validates task.toml before it records a run); the stand-in runner never imports it.
TASK_TOML = ("[task]\nname = 'demo'\narch = '{arch}'\nfamily = 'demo'\n"
             "[baseline]\nrepo = 'https://example.invalid/demo'\nref = 'main'\ncommit = 'unresolved'\n"
             "[build]\nkind = 'python'\n")
FILES = {
    "task.toml": TASK_TOML.format(arch="any"),
    "baseline/kernel.py": "def kernel(): return 'baseline'\n",
    "solution/kernel.py": "def kernel(): return 'solution'\n",
    "bench/adapter.py": ("def make_case(workload, *, device, seed): ...\n"
                         "def call_baseline(workload, inputs, outputs): ...\n"
                         "def call_candidate(workload, inputs, outputs): ...\n"),
    "bench/workloads.toml": "[[workload]]\nid = 'w1'\n",
}


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def gpu(index: int, **overrides: Any) -> dict[str, Any]:
    """One idle H200 as the NVML fixture describes it."""
    return {"index": index, "uuid": f"GPU-{index:08d}-unit", "name": "NVIDIA H200", "cc": [9, 0],
            "memory_used_mib": 0, "memory_total_mib": 143771, "util_pct": 0, **overrides}


def gpu_script(name: str) -> ModuleType:
    """benchmarks/gpu/<name>.py imported as the module `name` (registered first: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS_GPU / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
