"""A task of the project: kernels/<name> and its task.toml, found once per command (TaskDir).

The name rule is protocol.py's; a name that could point outside kernels/ is refused as such, and an unknown one
suggests the closest task. Commands build their TaskDirs here and hand the value on, so nothing re-checks a name.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from ..agent.protocol import NAME_RULE, is_name
from ..errors import ConfigError, KpremoteError


@dataclass(frozen=True)
class TaskDir:
    """kernels/<name>: a real folder (no link) whose name follows the name rule."""

    name: str
    path: Path

    @property
    def toml(self) -> Path:
        return self.path / "task.toml"

    @property
    def results(self) -> Path:
        return self.path / "results"


def find_task(kernels_dir: Path, name: str) -> TaskDir:
    """kernels/<name>, refusing names that could point anywhere else; unknown names suggest the closest task."""
    if not is_name(name):
        raise ConfigError(f"invalid task name {name!r}: {NAME_RULE}")
    path = Path(kernels_dir) / name
    if path.is_symlink() or not path.is_dir():
        known = sorted(p.name for p in Path(kernels_dir).glob("*") if p.is_dir() and not p.is_symlink())
        raise ConfigError(f"unknown task {name!r}: no folder {path}{_closest(name, known, 0.4)}")
    return TaskDir(name, path)


def find_tasks(kernels_dir: Path, names: list[str]) -> list[TaskDir]:
    """Every named task, each a folder (find_task) with a task.toml."""
    tasks = [find_task(kernels_dir, name) for name in names]
    known = sorted(p.parent.name for p in Path(kernels_dir).glob("*/task.toml"))
    for task in tasks:
        if task.name not in known:
            raise KpremoteError(f"unknown task {task.name!r}: no {task.toml}{_closest(task.name, known, 0.5)}")
    return tasks


def _closest(name: str, known: list[str], cutoff: float) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return f" — did you mean {close[0]!r}?" if close else ""
