"""Keeping a same-uid candidate out of the trusted processes (runner and judge), as far as Linux allows.

- undumpable (prctl PR_SET_DUMPABLE 0): /proc/PID/mem, /proc/PID/fd, /proc/PID/environ and ptrace of the
  process become root's, so a side running as the same user cannot read the judge's memory (expected
  outputs, the run's secret) or reach its descriptors;
- a side's thread count, read from outside (/proc/PID/task), so a thread started during timing shows.
"""

from __future__ import annotations

import os
import sys

PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """True when the process is now undumpable (Linux); False where prctl is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def thread_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def safe_sys_path() -> None:
    """Drop the current directory from sys.path: a file there must never shadow torch or the agent."""
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", here)]
