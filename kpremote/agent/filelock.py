"""One way to hold an exclusive flock for a block of code: `with held(path):` opens path (made when missing), waits
for the lock, yields the descriptor, and closes it, which releases the lock; a process that dies releases it too.

Standard library only: the agent (a task's sync, its run claims, a run's state.json, a staging folder), the client's
ledger and the OpenSSH transport's master start all take their turn through it.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = os.O_RDWR | os.O_CREAT
"""How a lock file is opened by default: made when missing, its content left alone."""


@contextmanager
def held(path: str | Path, flags: int = LOCK_FILE) -> Iterator[int]:
    """The open descriptor of path, flock'd exclusively (waiting for it), for the block; flags as os.open takes them
    (a folder: os.O_RDONLY | os.O_DIRECTORY; a file appended to under the lock: os.O_WRONLY | os.O_APPEND |
    os.O_CREAT). The descriptor is not inherited by processes started meanwhile (os.open's default)."""
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)
