"""The shipped tasks' pinned upstream files (git-ignored: never committed) are materialized from their wheel before
these tests are collected, as `inv run` / `inv check` / `inv sync` do it; a fresh checkout (CI) downloads the pinned
wheel once into the cache (KPREMOTE_CACHE, else ~/.cache/kpremote). Parallel pytest workers (scripts/test.sh runs
pytest-xdist) take turns under a lock on the kernels folder: one materializes, the others then find the files."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def pytest_configure(config) -> None:
    from kpremote.task.baseline import ensure_upstream

    folder = os.open(KERNELS, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        for task_toml in sorted(KERNELS.glob("*/task.toml")):
            ensure_upstream(task_toml.parent)
    finally:
        os.close(folder)  # closing the descriptor releases the lock
