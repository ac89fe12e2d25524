"""Task code is imported from its source, never from bytecode: a .pyc beside a task file is not read.

Python takes `__pycache__/x.cpython-3NN.pyc` instead of `x.py` whenever the .pyc's header carries the source's
mtime and size, which anyone who can write the folder can forge (issue 24: a candidate planted bytecode for the
baseline and for the judge's adapter that way). Every process of a run that imports task code (the judge, each
side, each side's build, an audited or profiled call) calls `install(task_root)` first: from then on a module
found under the task folder is compiled from its source in memory, and nothing is written beside it. Modules
elsewhere (the agent, site-packages) keep Python's own caching: the sandbox keeps every process that runs task code
from writing there. Compiled Python outside a __pycache__ in a task folder is refused (taskfiles.check_no_bytecode).
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path
from typing import Any, Callable

_ROOTS: list[Path] = []


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A source file's loader that never reads or writes bytecode."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def _finder_for(path: str) -> importlib.machinery.FileFinder:
    """sys.path_hooks entry: a folder under a task root gets a finder whose sources load from source only."""
    if not any(_is_under(path, root) for root in _ROOTS):
        raise ImportError("not a task folder")  # the next hook (Python's own) takes it
    loaders: list[tuple[Any, list[str]]] = [
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES),
    ]
    return importlib.machinery.FileFinder(path, *loaders)


def _is_under(path: str, root: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(root)
    except (OSError, ValueError):
        return False


def install(task_root: Path) -> None:
    """Modules under task_root (and its packages' folders) load from source from now on, in this process."""
    root = Path(task_root).resolve()
    if root not in _ROOTS:
        _ROOTS.append(root)
    hook: Callable[[str], Any] = _finder_for
    if hook not in sys.path_hooks:
        sys.path_hooks.insert(0, hook)
    for cached in [p for p in sys.path_importer_cache if any(_is_under(p, r) for r in _ROOTS)]:
        del sys.path_importer_cache[cached]


def load_file(name: str, path: Path) -> Any:
    """spec_from_file_location with the source-only loader (a task file imported by its path). A compiled extension
    (a side's CUDA build, raw/build/<side>/kp_<side>*.so) is machine code the run built itself, not bytecode that
    stands in for a source: it loads as an extension."""
    import importlib.util

    if str(path).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        return importlib.util.spec_from_file_location(
            name, path, loader=importlib.machinery.ExtensionFileLoader(name, str(path)))
    return importlib.util.spec_from_file_location(name, path, loader=SourceOnlyLoader(name, str(path)))
