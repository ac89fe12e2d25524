"""Where a row's processes write: the judge and both sides send their stdout and stderr to the row's log
(raw/workloads/<row>.log) from the moment the row begins, so one run's judge serves many rows with one log each.
A sandboxed side cannot open the log (it may change nothing outside its scratch folder): the judge opens it and
hands the side the descriptor with the row's command."""

from __future__ import annotations

import os
import sys


def write_output_to(path: str | None) -> None:
    """This process's stdout and stderr go to `path` (appended) from now on; None leaves them as they are."""
    if not path:
        return
    fd = open_log(path)
    try:
        write_output_to_fd(fd)
    finally:
        os.close(fd)


def open_log(path: str) -> int:
    """The row's log opened for appending: what the judge hands a side, which may not open it itself."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def write_output_to_fd(fd: int) -> None:
    """This process's stdout and stderr go to the open file `fd` from now on (the caller still closes fd)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
