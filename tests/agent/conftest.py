"""Fixtures for the agent's host-side tests: the NVML fixture file (the only test double) and subprocess env."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def gpu_record(index: int, **overrides: Any) -> dict[str, Any]:
    """One idle H200 as the fixture describes it; overrides make it busy, another arch, ..."""
    record = {
        "index": index,
        "uuid": f"GPU-{index:08d}-test",
        "name": "NVIDIA H200",
        "cc": [9, 0],
        "memory_used_mib": 0,
        "memory_total_mib": 143771,
        "util_pct": 0,
    }
    record.update(overrides)
    return record


@pytest.fixture
def nvml_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """write(*gpus, **top) replaces the fixture file's content; the env var points at it for this test."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("KPREMOTE_NVML_FIXTURE", str(path))

    def write(*gpus: dict[str, Any], **top: Any) -> Path:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"driver": "570.00", **top, "gpus": list(gpus)}))
        os.replace(tmp, path)  # readers re-read on every call: never let them see half a file
        return path

    write(gpu_record(0))
    return write


@pytest.fixture
def agent_env(nvml_fixture: Callable[..., Path]) -> dict[str, str]:
    """Environment for agent subprocesses: this checkout and tests/agent (stand-in runner) importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
    env.pop("KPREMOTE_ROOT", None)
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture
def make_gpu() -> Callable[..., dict[str, Any]]:
    return gpu_record
