"""stdout whose reader left (`inv status | head -1`): what is still buffered, and anything printed later, goes to
/dev/null, with no BrokenPipeError traceback then nor at exit."""

from __future__ import annotations

import os
import sys


def stdout_reader_gone() -> None:
    """From now on stdout writes go nowhere: the reader left."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def flush_at_exit() -> None:
    """The last flush of stdout, before Python's own at exit: a reader that left is not a traceback."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_reader_gone()
    except (OSError, ValueError):
        pass
