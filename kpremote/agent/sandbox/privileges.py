"""No capability for a sandboxed process, even as root: what a run inside a container (uid 0) would otherwise hand
every side.

A process of uid 0 holds every capability: it may ptrace anything, read and write files whatever their modes (DAC
override), change sysctls, set the clock, read /dev/kmsg. `drop_all` clears, for this thread and everything it
starts: the bounding set (no exec can ever hand a capability back), the ambient, inheritable, permitted and
effective sets, and locks the securebits that would give root its capabilities again at an exec (SECBIT_NOROOT) or
on a change of uid (SECBIT_NO_SETUID_FIXUP). no_new_privs is set as well (Landlock and seccomp set it too). The
process keeps uid 0: files it owns, the GPU's device nodes and its folders still work as the owner's; what it loses
is every right beyond the owner's. A process that holds no capability (an ordinary user) has nothing to drop.
Capabilities belong to a thread: `drop_all` runs before the process starts any (sandbox.enter).

One exception: the process Nsight Compute profiles (the audit's, a profile's) reads the GPU's performance counters,
and where the driver keeps them for administrators (RmProfilingAdminOnly, NVIDIA's default) that takes
CAP_SYS_ADMIN in that very process: there `counters_need_root` says so and the capabilities stay, in words.
"""

from __future__ import annotations

import ctypes
import os

PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 24, 28, 38, 39
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_SYS_ADMIN = 21
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1
SECBIT_NO_SETUID_FIXUP, SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 2, 1 << 3
SECBIT_KEEP_CAPS_LOCKED = 1 << 5  # KEEP_CAPS itself stays off, locked so
SECBIT_NO_CAP_AMBIENT_RAISE, SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 6, 1 << 7
LOCKED_BITS = (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED |
               SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)
SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")  # /proc/self/status's lines, as hex masks
DESCRIBED = "no capabilities"
KEPT_FOR_COUNTERS = "capabilities kept (the GPU's counters are root's: RmProfilingAdminOnly)"
NVIDIA_PARAMS = "/proc/driver/nvidia/params"


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def held(status: str = "/proc/self/status") -> dict[str, int]:
    """This process's capability sets, by /proc's names (CapEff, ...); {} where /proc cannot say."""
    found: dict[str, int] = {}
    try:
        with open(status) as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name in SETS:
                    found[name] = int(value.strip(), 16)
    except (OSError, ValueError):
        return {}
    return found


def holds_any(sets: dict[str, int]) -> bool:
    """A capability it may use now or make usable: effective, permitted, inheritable or ambient (the bounding set
    alone, an ordinary user's, grants nothing under no_new_privs)."""
    return any(sets.get(name, 0) for name in ("CapEff", "CapPrm", "CapInh", "CapAmb"))


def drop_all() -> str:
    """Give up every capability for good (this thread and all it starts); what now holds, in words. The steps that
    need CAP_SETPCAP (securebits, the bounding set) are said where refused: with no_new_privs and nothing permitted,
    no exec gains a capability even so. Raises OSError where the kernel leaves a capability held."""
    libc = ctypes.CDLL(None, use_errno=True)
    _no_new_privs(libc)
    if not holds_any(held()):
        return DESCRIBED
    kept: list[str] = []
    # In this order: the securebits and the bounding set need CAP_SETPCAP, which the last step gives up.
    for what, option, arg in [("securebits", PR_SET_SECUREBITS, LOCKED_BITS),
                              *[(f"bounding set ({cap})", PR_CAPBSET_DROP, cap) for cap in range(last_cap() + 1)],
                              ("ambient set", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)]:
        try:
            _prctl(libc, what, option, arg)
        except OSError as exc:
            kept.append(f"{what.split(' (')[0]}: {exc.strerror}")
    header, data = _Header(LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")
    left = {name: value for name, value in held().items() if value and name != "CapBnd"}
    if left:
        raise OSError(f"capabilities left after the drop: {', '.join(f'{n} {v:#x}' for n, v in sorted(left.items()))}")
    kept = list(dict.fromkeys(kept))
    return DESCRIBED + (f" (kept: {'; '.join(kept)})" if kept else "")


def counters_need_root(params: str | None = None) -> bool:
    """True where the NVIDIA driver lets only CAP_SYS_ADMIN read the GPU's performance counters and this process
    holds it: a profiled process that dropped it would get ERR_NVGPUCTRPERM."""
    try:
        with open(params or NVIDIA_PARAMS) as handle:
            restricted = any(line.split(":")[0].strip() == "RmProfilingAdminOnly" and line.split(":")[1].strip() == "1"
                             for line in handle if ":" in line)
    except OSError:
        return False
    return restricted and bool(held().get("CapEff", 0) & (1 << CAP_SYS_ADMIN))


def last_cap() -> int:
    """The highest capability this kernel knows (40 on 6.x)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63  # dropping one the kernel does not know is refused: the error says so


def _no_new_privs(libc: ctypes.CDLL) -> None:
    if libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        _prctl(libc, "PR_SET_NO_NEW_PRIVS", PR_SET_NO_NEW_PRIVS, 1)


def _prctl(libc: ctypes.CDLL, what: str, option: int, arg: int) -> None:
    if libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), f"prctl({what})")
