"""state.json of one run: the single record of what a run is doing, updated atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

TERMINAL = {"passed", "failed", "error", "cancelled"}
"""Statuses after which nothing changes any more."""


def state_path(run_dir: Path) -> Path:
    return Path(run_dir) / "state.json"


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(state_path(run_dir).read_text())
    except FileNotFoundError:
        return {}


def update_state(run_dir: Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into state.json through a rename, so readers never see a torn file."""
    state = read_state(run_dir)
    state.update(fields)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".state.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=1, default=str)
    os.replace(tmp, state_path(run_dir))
    return state
