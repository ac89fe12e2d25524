"""Where a row's processes write: the judge and both sides send their stdout and stderr to the row's log
(raw/workloads/<row>.log) from the moment the row begins, so one run's judge serves many rows with one log each.
A sandboxed side cannot open the log (it may change nothing outside its scratch folder): the judge opens it and
hands the side the descriptor with the row's command.

A row's log is held to LOG_CAP_BYTES (CappedLog): a candidate's debug print must not fill a shared host's disk. The
runner checks its size at every poll while the row runs and cuts it back to its first LOG_CAP_BYTES (every writer
appends, so writing goes on at the cut), and at the row's end adds one line saying how much was dropped; results.md
names the rows whose output was cut."""

from __future__ import annotations

import os
import sys
from pathlib import Path

LOG_CAP_BYTES = 8 * 1024 * 1024
"""The most of a row's output its log keeps: the first 8 MiB."""


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


class CappedLog:
    """A row's log, held to `cap` bytes by whoever waits on the row (the runner): hold() at each poll, end() once."""

    def __init__(self, path: Path, cap: int = LOG_CAP_BYTES) -> None:
        self.path = Path(path)
        self.cap = cap
        self.dropped = 0  # at least this many bytes: what is written between a look and the cut is not counted

    def hold(self) -> None:
        """Cut the log back to its first `cap` bytes if it has grown past them."""
        try:
            size = self.path.stat().st_size
            if size > self.cap:
                os.truncate(self.path, self.cap)
                self.dropped += size - self.cap
        except OSError:  # not made yet, or gone: nothing to hold
            pass

    def end(self) -> int:
        """The row is over: cut once more, say in the log how much was dropped, and return that count."""
        self.hold()
        if self.dropped:
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(f"\n[kpremote: at least {self.dropped} bytes of this row's output were dropped: a row's log "
                          f"keeps its first {self.cap} bytes]\n")
        return self.dropped
