"""`inv baseline` as asked: which pin its options name (a commit, a release wheel, or a wheel's files re-created),
made through baseline.py, with the copied-lines digest (upstreamlines.py) written after a wheel's; and what the
command says of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from . import baseline as pins
from .upstreamlines import write_digest


def pin_as_asked(task: str, task_dir: Path, *, repo: Optional[str], files: Optional[str], ref: str, force: bool,
                 source: Optional[str], pypi: Optional[str], materialize: bool) -> tuple[Optional[dict[str, Any]], str]:
    """(the pin as --json prints it, or None for --materialize; the line said of it). BaselineError for options
    that name no pin, or two."""
    if materialize:
        if repo or files or pypi or source:
            raise pins.BaselineError("--materialize takes only --task: it re-creates what task.toml already pins")
        done = pins.materialize(task_dir)
        digest = write_digest(task_dir)
        return None, (f"{task}: {done.files} file(s) from {done.wheel} in kernels/{task}/baseline/upstream/, sha256 as "
                      f"task.toml pins them; their line windows in {digest.relative_to(task_dir)}")
    if not files:
        raise pins.BaselineError("--files is required: the upstream files to copy, comma-separated")
    if pypi:
        if source:
            raise pins.BaselineError("--pypi and --source are two different pins: give one")
        pin: Any = pins.pin_release(task_dir, pypi, pins.split_file_list(files), force=force, repo=repo)
        write_digest(task_dir)  # what tests/test_upstream_lines.py checks committed files against
        line = (f"{task}: {pin.release} → {pin.wheel} (sha256 {pin.wheel_sha256}); {len(pin.files)} file(s) in "
                f"kernels/{task}/baseline/upstream/ (git-ignored); docs/baseline_source.md and task.toml [baseline] "
                "updated")
    else:
        if not repo:
            raise pins.BaselineError("--repo is required (or --pypi for a release, --materialize for an existing pin)")
        pin = pins.pin_baseline(task_dir, repo, ref, pins.split_file_list(files), force=force, source=source)
        line = (f"{task}: {pin.repo} {pin.ref} → {pin.commit} ({len(pin.files)} file(s) in "
                f"kernels/{task}/baseline/upstream/; docs/baseline_source.md and task.toml [baseline] updated)")
    return {"task": task, **dataclasses.asdict(pin)}, line
