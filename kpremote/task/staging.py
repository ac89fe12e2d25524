"""Files written into a staging folder under the task's .kpremote/ (same filesystem, never synced) and moved into
place together only once all of them are ready; a failure while moving puts back what was there."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

STAGING_PARENT = ".kpremote"  # excluded from sync, on the task's filesystem so the final moves are renames


@contextlib.contextmanager
def staging_folder(task_dir: Path):
    """A scratch folder under the task's .kpremote/ (same filesystem: the final moves are renames), removed after."""
    staging_parent = task_dir / STAGING_PARENT
    staging_parent.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="baseline-", dir=staging_parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging_parent.rmdir()  # only if we made it and it is empty again
        except OSError:
            pass


def move_into_place(moves: list[tuple[Path, Path]], trash: Path) -> None:
    trash.mkdir()
    undo: list[tuple[Path, Path | None, list[Path]]] = []  # (final, its previous version, folders made for it)
    try:
        for index, (staged, final) in enumerate(moves):
            made = missing_parents(final)
            final.parent.mkdir(parents=True, exist_ok=True)
            previous = None
            if final.exists() or final.is_symlink():
                previous = trash / str(index)
                os.replace(final, previous)
            undo.append((final, previous, made))
            os.replace(staged, final)
    except BaseException:
        for final, previous, made in reversed(undo):
            if final.exists() and not final.is_symlink() and final.is_dir():
                shutil.rmtree(final)
            elif final.exists() or final.is_symlink():
                final.unlink()
            if previous is not None:
                os.replace(previous, final)
            for folder in made:
                folder.rmdir()
        raise


def missing_parents(path: Path) -> list[Path]:
    """The folders above path that do not exist yet, deepest first (so they can be removed in that order)."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing

