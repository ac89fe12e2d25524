"""Nothing of a Slurm job outlives its step: a reaper process that SIGKILLs what is left of the step's process group
once the step is gone, however it went (SIGKILL included).

Slurm's proctrack/cgroup kills every process of a job; proctrack/linuxproc (and pgid) find them by parentage, so a
worker whose runner was SIGKILLed (re-parented away from the step) outlives the job. Every process of a run shares the
step's process group (the runner is forked into it, and its workers, judge and sides stay there): the reaper, in a
group of its own, waits for the step to close a pipe (the kernel closes it for a killed process too), then empties
that group.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress

from ..procfs import group_members

REAP_ROUNDS = 50  # SIGKILL the group's members until none is left, at most this many times 0.1 s apart


def start_reaper() -> int | None:
    """Fork the reaper of this process's group; the write end of its pipe (close it in any child this step forks,
    or the reaper waits for that child too). None where this process does not lead its group: then it is not ours."""
    group = os.getpgrp()
    if group != os.getpid():
        return None
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(read_end)
        return write_end
    try:
        _reap_when_closed(read_end, write_end, group)
    finally:
        os._exit(0)


def _reap_when_closed(read_end: int, write_end: int, group: int) -> None:
    os.close(write_end)
    os.setpgid(0, 0)  # out of the group it is to empty
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # Slurm signals the job's processes before the end
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, read_end)
    os.closerange(read_end + 1, 1 << 16)  # a lease's lock among them: holding it would keep the GPU leased
    while os.read(read_end, 1):
        pass  # the step never writes: the read returns once the step has exited (or was killed)
    empty_group(group)


def empty_group(group: int) -> list[int]:
    """SIGKILL every live member of the process group until none is left; the pids killed."""
    killed: list[int] = []
    for _ in range(REAP_ROUNDS):
        members = [pid for pid in group_members(group) if pid != os.getpid()]
        if not members:
            break
        for pid in members:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.1)
    return killed
