"""The members of the judge's PID namespace, and the ones a row left behind.

Inside its namespace the judge is process 1: a process a side starts and detaches (setsid, a double fork) is
re-parented to the judge, not to the host's init, so it cannot leave. At the end of each row every member that
is neither a side nor a descendant of a side still running is a leftover: it is killed here, and the row's
numbers are void (judge.py). Outside a namespace (an unsandboxed host) there is nothing to list: the runner's
process-group sweep (procfs.kill_strays) is all there is.
"""

from __future__ import annotations

import os
import signal

from .namespace import PROC_MOUNTED_ENV


def in_namespace() -> bool:
    return os.getpid() == 1


def member_pids() -> list[int]:
    """Every process of this namespace, as pids this process can name."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    if os.environ.get(PROC_MOUNTED_ENV) == "1":
        return pids
    ours = _pid_namespace("self")  # a /proc of the host: keep the processes of our namespace (not reachable then)
    return [pid for pid in pids if _pid_namespace(str(pid)) == ours]


def kill_leftovers(sides: set[int]) -> list[str]:
    """Kill every member that is not this process, a side, or a side's descendant; their names, as killed."""
    if not in_namespace():
        return []
    parents = {pid: _parent(pid) for pid in member_pids()}
    keep = {os.getpid(), *sides}
    changed = True
    while changed:  # descendants of the sides: a side's own helpers end with it
        changed = False
        for pid, parent in parents.items():
            if pid not in keep and parent in keep and parent != os.getpid():
                keep.add(pid)
                changed = True
    killed = []
    for pid in sorted(set(parents) - keep):
        name = _name(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(f"pid {pid} ({name})")
        except ProcessLookupError:
            continue
    for entry in killed:  # process 1 is every orphan's parent: collect them (never a side, whose Popen waits)
        try:
            os.waitpid(int(entry.split()[1]), 0)
        except ChildProcessError:
            pass
    return killed


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def _pid_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
