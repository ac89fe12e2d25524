"""What Linux /proc says about processes (parent, group, state, start time, descendants, liveness), and the two
kills that need it: a process with everything it started, and what a run left behind in its own group.

One reader of /proc/<pid>/stat for the whole agent. Its second field, the command name, may hold spaces and
parentheses, so the fields are split after the last ')'.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
GONE_STATES = ("Z", "X")
"""A zombie or a dead task holds nothing and cannot be signalled again."""


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    start_ticks: int
    """Start time in clock ticks after boot: with the pid, it names one process even after the pid is reused."""

    @property
    def alive(self) -> bool:
        return self.state not in GONE_STATES


def proc_stat(pid: int) -> ProcStat | None:
    """The process's /proc/<pid>/stat, or None when there is no such process (or it vanished while read)."""
    try:
        line = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return _parse(pid, line)


def _parse(pid: int, line: str) -> ProcStat | None:
    after_comm = line[line.rfind(")") + 2 :].split()
    if len(after_comm) < 20:
        return None
    # after the command name: state(3) ppid(4) pgrp(5) ... starttime(22), numbered as in proc(5)
    return ProcStat(pid, after_comm[0], int(after_comm[1]), int(after_comm[2]), int(after_comm[19]))


def all_processes() -> list[ProcStat]:
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            found.append(stat)
    return found


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat.start_ticks if stat else None


def descendants(pid: int) -> list[int]:
    """All live descendants of pid, children before grandchildren."""
    children: dict[int, list[int]] = {}
    for stat in all_processes():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return found


def namespace_pids(root: int) -> dict[int, int]:
    """{pid as its own PID namespace sees it: pid here} for root's descendants (NSpid in /proc/PID/status): how a
    judge's record, written inside its namespace, names processes this side can find."""
    found = {}
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/status") as handle:
                line = next((l for l in handle if l.startswith("NSpid:")), "")
        except OSError:
            continue
        if line.split()[1:]:
            found[int(line.split()[-1])] = pid
    return found


def group_members(pgid: int) -> list[int]:
    """Live (neither zombie nor dead) pids in the process group."""
    return [stat.pid for stat in all_processes() if stat.pgrp == pgid and stat.alive]


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists, even one we may not signal."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_alive(pid: int) -> bool:
    """Whether pid is a running (not zombie) process; where /proc cannot be read, whether it exists at all."""
    try:
        line = (PROC / str(pid) / "stat").read_text()
    except PermissionError:
        return pid_exists(pid)
    except OSError:
        return False
    stat = _parse(pid, line)
    return stat is not None and stat.alive


def command_line(pid: int) -> str | None:
    """The process's argv joined by spaces ("" between fork and exec), None when it is gone or unreadable."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def kill_tree(process: subprocess.Popen, settle_s: float = 10.0) -> None:
    """SIGKILL a child and whatever it started (ninja, nvcc, ncu's target, a judge in its namespace and its
    sides, ...), leaving the rest of our group alone, reap it, and wait (settle_s at most) until none of them
    runs any more: a grandchild's exit, and the GPU memory it frees, would otherwise come after we return."""
    pids = [*reversed(descendants(process.pid)), process.pid]
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + settle_s
    while any(is_alive(pid) for pid in pids[:-1]) and time.monotonic() < deadline:
        time.sleep(0.01)


def kill_strays() -> list[int]:
    """SIGKILL what is left in this process's group besides itself (a side's forked helper, ...); the pids killed.

    Only when this process leads its own group (as `start` spawns the runner): otherwise the group is someone else's.
    """
    if os.getpgrp() != os.getpid():
        return []
    killed = []
    for pid in group_members(os.getpgrp()):
        if pid != os.getpid():
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
