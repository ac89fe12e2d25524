"""Where a row's processes write: the judge and both sides send their stdout and stderr to the row's log
(raw/workloads/<row>.log) from the moment the row begins, so one run's judge serves many rows with one log each."""

from __future__ import annotations

import os
import sys


def write_output_to(path: str | None) -> None:
    """This process's stdout and stderr go to `path` (appended) from now on; None leaves them as they are."""
    if not path:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
