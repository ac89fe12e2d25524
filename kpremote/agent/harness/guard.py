"""Keeping a same-uid candidate out of the trusted processes (runner and judge), as far as Linux allows.

- undumpable (prctl PR_SET_DUMPABLE 0): /proc/PID/mem, /proc/PID/fd, /proc/PID/environ and ptrace of the
  process become root's, so a side running as the same user cannot read the judge's memory (expected
  outputs, the run's secret) or reach its descriptors;
- a side's thread count, read from outside (/proc/PID/task), so a thread started during timing shows;
- a side's schedule (nice, policy, affinity, time waiting for a CPU, its other threads' CPU time), read from
  outside before and after its timing, so a side paused, reniced, re-pinned or starved by the other, or a helper
  thread of the candidate working while its calls are timed, voids the row instead of flattering anyone;
- a side's CPU time while the other side's calls are timed (every thread of it, its main one too, read from outside
  through its CPU-time clock), when it has nothing to do but wait for its next command: a side that works then
  takes a CPU from the one being timed, and voids the row.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

PR_SET_DUMPABLE = 4
T = TypeVar("T")


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


# --------------------------------------------------------------------------------------------- a side's schedule

CPUCLOCK_SCHED = 2  # a process's CPU-time clock counts its threads' scheduled time (the kernel's CPUCLOCK_SCHED)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HELPER_FLOOR_S = 0.05  # a helper thread's CPU time during timing that voids a row: above this and HELPER_SHARE
HELPER_SHARE = 0.05  # of the timing's wall time (CPU time is counted in clock ticks, 10 ms each)
IDLE_FLOOR_S = 0.001  # a side's CPU time while the other side's samples are taken that voids a row: above this and
IDLE_SHARE = 0.05  # of those samples' wall time (read to the nanosecond; an honest idle side reads 0 on the CPU)
STARVED_FLOOR_S = 0.05  # time waiting for a CPU during timing, beyond the other side's, that voids a GPU row: above
# this and STARVED_SHARE of the timing (four runs at once on a four-H200 host: both sides of one row waited 0.08-0.09 s
# of 0.60 s, alike)
STARVED_SHARE = 0.10
STARVED = "(starved)"  # how a starvation reason ends: the one interference a pair is timed again for
STARVED_RETAKES = 1  # a pair whose only trouble was starvation is timed once more; starved again, its row is void


@dataclass(frozen=True)
class Schedule:
    """How a side process is scheduled, read from outside (/proc): what another process could have changed."""

    nice: int
    policy: int
    affinity: frozenset[int]
    run_delay_s: float  # time its main thread spent runnable but waiting for a CPU
    helper_cpu_s: float  # CPU time of its threads other than the main one, and of the processes it started


def schedule_of(pid: int) -> Schedule | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # fields[n - 3] is stat's field n
        with open(f"/proc/{pid}/schedstat") as handle:
            run_delay_ns = int(handle.read().split()[1])
        affinity = frozenset(os.sched_getaffinity(pid))
        return Schedule(nice=int(fields[16]), policy=int(fields[38]), affinity=affinity,
                        run_delay_s=run_delay_ns / 1e9, helper_cpu_s=_helper_cpu_s(pid))
    except (OSError, ValueError, IndexError):
        return None


def _helper_cpu_s(pid: int) -> float:
    """CPU time of the process's threads but its main one (ended threads included: the process's own count keeps
    them), of the children it waited for, and of every process it started that still runs."""
    from ..procfs import descendants

    whole = _ticks(f"/proc/{pid}/stat", with_children=True)
    main = _ticks(f"/proc/{pid}/task/{pid}/stat")
    running = sum(_ticks(f"/proc/{child}/stat") for child in descendants(pid))
    return (whole - main + running) / CLOCK_TICKS


def _ticks(path: str, with_children: bool = False) -> int:
    """utime + stime (and cutime + cstime) of a /proc stat file, in clock ticks; 0 for one that is gone."""
    try:
        with open(path, "rb") as handle:
            stat = handle.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(b")") + 2:].split()  # fields[n - 3] is stat's field n
    return sum(int(fields[i]) for i in ((11, 12, 13, 14) if with_children else (11, 12)))


def cpu_s(pid: int) -> float | None:
    """CPU time of every thread of a process, ended ones included, to the nanosecond: its CPU-time clock
    (clock_getcpuclockid, which any process may read of another); None where it is gone. Not its children's: the
    helper rule counts those over the whole timing."""
    if pid <= 0:
        return None  # 0 would name this process's own clock, a negative pid another clock altogether
    try:
        return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED) / 1e9  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except (OSError, OverflowError):
        return None


def idle_interference(side: str, other: str, used_s: float, while_s: float) -> str | None:
    """Why a side that used CPU while the other side's calls were timed voids the row: it was idle then (blocked on
    its next command), so whatever it ran, on whichever thread, ran beside the other side's timed calls (`while_s`:
    the wall time those samples took). Never timed again: that is work on purpose, not starvation."""
    if used_s > max(IDLE_FLOOR_S, IDLE_SHARE * while_s):
        return (f"the {side} side used {used_s * 1e3:.1f} ms of CPU while the {other}'s calls were timed "
                f"({while_s * 1e3:.1f} ms), when it waits for its next command")
    return None


def waited_s(before: Schedule | None, after: Schedule | None) -> float:
    """How long a side's main thread waited for a CPU between two readings."""
    return after.run_delay_s - before.run_delay_s if before and after else 0.0


def interference(side: str, before: Schedule | None, after: Schedule | None, wall_s: float,
                 starvation: bool, other_waited_s: float = 0.0) -> str | None:
    """Why a side's timing cannot stand: reniced, rescheduled, re-pinned, starved of CPU more than the other side
    was (`starvation`: on a GPU; a busy host, e.g. neighbouring runs, starves both sides alike, and that shapes no
    verdict), or a helper thread that worked while its calls were timed."""
    if before is None or after is None:
        return None
    if (before.nice, before.policy) != (after.nice, after.policy):
        return (f"the {side} side's priority changed during timing (nice {before.nice} -> {after.nice}, policy "
                f"{before.policy} -> {after.policy})")
    if before.affinity != after.affinity:
        return f"the {side} side was re-pinned during timing (CPUs {sorted(before.affinity)} -> {sorted(after.affinity)})"
    waited = waited_s(before, after)
    if starvation and waited - other_waited_s > max(STARVED_FLOOR_S, STARVED_SHARE * wall_s):
        return (f"the {side} side waited {waited:.2f} s for a CPU during {wall_s:.2f} s of timing, the other side "
                f"{other_waited_s:.2f} s {STARVED}")
    helpers = after.helper_cpu_s - before.helper_cpu_s
    if helpers > max(HELPER_FLOOR_S, HELPER_SHARE * wall_s):
        return (f"a helper thread of the {side} side used {helpers:.2f} s of CPU while its calls were timed "
                f"({wall_s:.2f} s)")
    return None



def take_until_undisturbed(take: Callable[[], tuple[T, list[str]]],
                           retakes: int = STARVED_RETAKES) -> tuple[T, list[str], list[str]]:
    """take() (a pair's samples, and what disturbed its sides' schedules) again while starvation alone disturbed it
    and retakes are left: (the last take's samples, what disturbed that take, what made each earlier one go).
    Neighbouring runs on a shared host starve a side now and then (one A/A row in 192 on a four-GPU H200 running four
    at once, harness 2.15); a candidate that starves the other side does it again, and its row is void."""
    dropped: list[str] = []
    while True:
        samples, disturbed = take()
        if not disturbed or len(dropped) >= retakes or not all(why.endswith(STARVED) for why in disturbed):
            return samples, disturbed, dropped
        dropped.append("; ".join(disturbed))
