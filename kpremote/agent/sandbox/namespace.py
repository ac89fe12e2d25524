"""A PID namespace (and a mount namespace with its own /proc and /dev/shm) for a judge and its sides.

    python -m kpremote.agent.sandbox.namespace -- COMMAND ...

The launcher unshares, forks, and the child becomes process 1 of the new namespace, then execs COMMAND (the
judge). Every process the judge or a side starts stays inside: a daemon that calls setsid is still a member, the
judge sees exactly the members in its /proc, and when the judge ends the kernel kills every process left in the
namespace. The judge and its sides share the namespace because legacy CUDA IPC handles do not cross PID
namespaces. Unprivileged, a user namespace (this user mapped to itself) comes first; as root it is not needed.
The namespace's /dev/shm is a tmpfs of its own: what its processes leave there is gone when the last of them ends,
and no later run sees it (the sandbox lets a side write /dev/shm only where it is this one, SHM_MOUNTED_ENV).
The child dies with the launcher (PR_SET_PDEATHSIG); the launcher answers SIGTERM/SIGINT/SIGHUP by killing it
(process 1 of a namespace ignores a signal it has no handler for) and exits with the child's status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
PROC_MOUNTED_ENV = "KPREMOTE_NS_PROC"  # "1" when the judge's /proc shows only its namespace
SHM_MOUNTED_ENV = "KPREMOTE_NS_SHM"  # the device number of the namespace's own /dev/shm, where one was mounted


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def unshare() -> None:
    """This process's next child will be process 1 of a new PID namespace with a mount namespace of its own."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWUSER if os.geteuid() != 0 else 0)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if flags & CLONE_NEWUSER:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")


def make_mounts_private() -> bool:
    """In the namespace's process 1, before anything is mounted: no mount made here reaches the host's."""
    return _libc().mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0


def mount_own_proc() -> bool:
    """In the namespace's process 1: /proc shows the namespace's members only. False where that is refused
    (a container that masks parts of /proc): the members are then told apart by their pid namespace."""
    return _libc().mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0


def mount_own_shm() -> str:
    """In the namespace's process 1: a fresh tmpfs on /dev/shm, freed with the namespace. Its device number, or ""
    where there is no /dev/shm or the mount is refused (a side then may not write /dev/shm at all)."""
    if not os.path.isdir("/dev/shm"):
        return ""
    if _libc().mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777") != 0:
        return ""
    return str(os.stat("/dev/shm").st_dev)


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m kpremote.agent.sandbox.namespace -- COMMAND ...", file=sys.stderr)
        return 2
    unshare()
    child = os.fork()
    if child == 0:
        try:
            _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            private = make_mounts_private()
            os.environ[PROC_MOUNTED_ENV] = "1" if private and mount_own_proc() else "0"
            os.environ[SHM_MOUNTED_ENV] = mount_own_shm() if private else ""
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: _pass_on(child, signum))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _pass_on(child: int, signum: int) -> None:
    try:
        os.kill(child, signal.SIGKILL)  # process 1 of a namespace ignores what it has no handler for
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
