"""The shipped tasks' pinned upstream files (git-ignored: never committed) are materialized from their wheel before
these tests are collected, as `inv run` / `inv check` / `inv sync` do it; a fresh checkout (CI) downloads the pinned
wheel once into the cache (KPREMOTE_CACHE, else ~/.cache/kpremote)."""

from __future__ import annotations

from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def pytest_configure(config) -> None:
    from kpremote.baseline import ensure_upstream

    for task_toml in sorted(KERNELS.glob("*/task.toml")):
        ensure_upstream(task_toml.parent)
