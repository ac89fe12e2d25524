"""What every builder is: the Builder interface, what a side's build leaves (Built), and how a side is named and
imported as a module (kp_baseline / kp_candidate).

Standard library only at import time: torch and the builders' packages are imported only when a side is built.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..taskspec import BuildSpec, TaskSpec


@dataclass
class Built:
    """What one side's build left: `module` is what the loader needs later (an extension file, a build folder)."""
    module: str | None = None
    error: str | None = None  # "inconclusive: ..." when a compile-only check could not run here
    note: str | None = None  # a check that was skipped, and why (not an error)


class Builder:
    """One kind's way to build a side and to load it for the adapter, the same for both sides."""
    kind = ""

    def describe(self, build: BuildSpec) -> str:
        raise NotImplementedError

    def build(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """Build the side on a machine where it runs (folder: raw/build/<side>)."""
        raise NotImplementedError

    def check(self, spec: TaskSpec, side: str, folder: Path) -> Built:
        """What can be checked without a GPU; the side's rows are NOT CHECKED whatever this finds."""
        return Built(error=None)

    def load(self, spec: TaskSpec, side: str, module: str | None) -> Any:
        raise NotImplementedError


def module_name(side: str) -> str:
    return f"kp_{side}"


def import_file(name: str, path: Path) -> types.ModuleType:
    """A task file imported by its path, from its source (sourceonly.py: no bytecode beside it is read)."""
    from ..sourceonly import load_file

    spec = load_file(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
