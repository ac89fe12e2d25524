"""A seccomp filter that keeps a process's hands off every other process and off the host: no ptrace, no reading or
writing another's memory, no renice, re-pin, rescheduling or rlimit of anyone but itself, no perf counters; and
none of the calls that change the machine rather than the process (HOST_CHANGES: the clock, the kernel's log,
modules, mounts, eBPF, keys, ...) or make a new namespace (a user namespace would hand its creator capabilities).

Landlock (landlock.py) refuses signals and ptrace across its domain where the kernel is new enough; what it
does not cover is scheduling: setpriority, sched_setaffinity, sched_setscheduler and their kin take a pid, and
a process of the same user may otherwise aim them at any other. Here each of those is allowed only with pid 0
(the caller itself) and refused with EPERM otherwise. Where Landlock cannot scope signals (ABI < 6), kill and
tgkill are held to pid 0 and the caller's own pid the same way. Syscalls of a foreign ABI (i386 through int 0x80,
x32) are refused outright: their numbers would slip past the table. The rules live in the tables below, each
group with its reason; `program` only turns them into BPF.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
X32_BIT = 0x40000000

ARCHES = {  # machine: (AUDIT_ARCH, {name: number})
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "perf_event_open": 298, "process_madvise": 440, "setpriority": 141, "sched_setparam": 142,
        "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314, "ioprio_set": 251,
        "prlimit64": 302, "migrate_pages": 256, "move_pages": 279, "kill": 62, "tkill": 200, "tgkill": 234,
        "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_send_signal": 424,
        "adjtimex": 159, "clock_adjtime": 305, "settimeofday": 164, "clock_settime": 227, "syslog": 103,
        "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "mount": 165, "umount2": 166, "pivot_root": 155, "swapon": 167, "swapoff": 168,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "bpf": 321, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249,
        "iopl": 172, "ioperm": 173, "acct": 163, "quotactl": 179, "quotactl_fd": 443, "unshare": 272, "clone": 56,
        "clone3": 435, "personality": 135}),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "perf_event_open": 241, "process_madvise": 440, "setpriority": 140, "sched_setparam": 118,
        "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274, "ioprio_set": 30,
        "prlimit64": 261, "migrate_pages": 238, "move_pages": 239, "kill": 129, "tkill": 130, "tgkill": 131,
        "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424,
        "adjtimex": 171, "clock_adjtime": 266, "settimeofday": 170, "clock_settime": 112, "syslog": 116,
        "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "mount": 40, "umount2": 39, "pivot_root": 41, "swapon": 224, "swapoff": 225,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "bpf": 280, "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218,
        "acct": 89, "quotactl": 60, "quotactl_fd": 443, "unshare": 97, "clone": 220, "clone3": 435,
        "personality": 92}),  # no iopl/ioperm on arm64
}

ALWAYS_REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "perf_event_open",
                  "process_madvise")
SELF_ONLY = {  # syscall: the argument positions that must all be 0 (the caller itself)
    "setpriority": (0, 1),  # which == PRIO_PROCESS and who == 0
    "sched_setparam": (0,), "sched_setscheduler": (0,), "sched_setaffinity": (0,), "sched_setattr": (0,),
    "ioprio_set": (1,),  # who == 0: this process (or its group/user with which != PROCESS: still itself)
    "prlimit64": (0,), "migrate_pages": (0,), "move_pages": (0,),
}
HOST_CHANGES = {  # refused outright, whoever the caller: each group changes the machine, not the process
    "the clock every timing reads": ("adjtimex", "clock_adjtime", "settimeofday", "clock_settime"),
    "the kernel's log (read or cleared)": ("syslog",),
    "the running kernel (modules, kexec, reboot)": ("kexec_load", "kexec_file_load", "reboot", "init_module",
                                                    "finit_module", "delete_module"),
    "the file system other processes see (mounts, swap)": ("mount", "umount2", "pivot_root", "swapon", "swapoff",
                                                           "open_tree", "move_mount", "fsopen", "fsconfig",
                                                           "fsmount", "fspick", "mount_setattr"),
    "eBPF programs (they see every process's events)": ("bpf",),
    "another process's namespaces, joined": ("setns",),
    "the kernel's keyrings (a user's keys, shared by its processes)": ("keyctl", "add_key", "request_key"),
    "the machine's I/O ports (x86)": ("iopl", "ioperm"),
    "process accounting and disk quotas": ("acct", "quotactl", "quotactl_fd"),
}
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: a user namespace hands
NEW_NAMESPACES = {"clone": NAMESPACE_FLAGS, "unshare": NAMESPACE_FLAGS | 0x80}  # its maker capabilities (+NEWTIME)
NOT_THERE = ("clone3",)  # ENOSYS: its flags lie in memory a filter cannot read; glibc falls back to clone
PERSONALITY_ALLOWED = (0, 0xFFFFFFFF)  # PER_LINUX and the query; any other changes how an exec runs (no ASLR, ...)
SIGNALS_SELF_ONLY = ("kill", "tgkill")  # where Landlock cannot scope signals
SIGNALS_REFUSED = ("tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal")


def supported() -> bool:
    return platform.machine() in ARCHES and hasattr(ctypes.CDLL(None), "prctl")


def program(signals_too: bool, own_pid: int, machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as BPF instructions (code, jt, jf, k)."""
    audit_arch, numbers = ARCHES[machine or platform.machine()]
    refuse = RET_ERRNO | errno.EPERM
    code: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, 4), (JEQ_K, 1, 0, audit_arch), (RET_K, 0, 0, refuse),
                                             (LD_W_ABS, 0, 0, 0)]
    if audit_arch == ARCHES["x86_64"][0]:
        code += [(JGE_K, 0, 1, X32_BIT), (RET_K, 0, 0, refuse)]
    refused = list(ALWAYS_REFUSED) + [name for group in HOST_CHANGES.values() for name in group if name in numbers]
    refused += list(SIGNALS_REFUSED) if signals_too else []
    for name in refused:
        code += [(LD_W_ABS, 0, 0, 0), (JEQ_K, 0, 1, numbers[name]), (RET_K, 0, 0, refuse)]
    for name in NOT_THERE:
        code += [(LD_W_ABS, 0, 0, 0), (JEQ_K, 0, 1, numbers[name]), (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    for name, flags in NEW_NAMESPACES.items():
        code += _block(numbers[name], [(LD_W_ABS, 0, 0, 16), (JSET_K, 1, 0, flags), (RET_K, 0, 0, RET_ALLOW),
                                       (RET_K, 0, 0, refuse)])
    code += _only_values(numbers["personality"], PERSONALITY_ALLOWED, refuse)
    for name, args in SELF_ONLY.items():
        code += _only_zero(numbers[name], args, refuse)
    if signals_too:
        for name in SIGNALS_SELF_ONLY:
            code += _only_self(numbers[name], own_pid, refuse)
    code.append((RET_K, 0, 0, RET_ALLOW))
    return code


def _only_zero(number: int, args: tuple[int, ...], refuse: int) -> list[tuple[int, int, int, int]]:
    """The syscall passes only with every named argument 0 (both halves of its 64 bits)."""
    body: list[tuple[int, int, int, int]] = []
    for arg in args:
        body += [(LD_W_ABS, 0, 0, 16 + 8 * arg), (JEQ_K, 0, 0, 0), (LD_W_ABS, 0, 0, 20 + 8 * arg), (JEQ_K, 0, 0, 0)]
    body += [(RET_K, 0, 0, RET_ALLOW), (RET_K, 0, 0, refuse)]
    return _block(number, body)


def _only_values(number: int, values: tuple[int, ...], refuse: int) -> list[tuple[int, int, int, int]]:
    """The syscall passes only with its first argument (32 bits) one of `values`."""
    body = [(LD_W_ABS, 0, 0, 16)]
    body += [(JEQ_K, len(values) - i, 0, value) for i, value in enumerate(values)]
    body += [(RET_K, 0, 0, refuse), (RET_K, 0, 0, RET_ALLOW)]
    return [(LD_W_ABS, 0, 0, 0), (JEQ_K, 0, len(body), number), *body]


def _only_self(number: int, pid: int, refuse: int) -> list[tuple[int, int, int, int]]:
    """kill/tgkill pass only aimed at pid 0 (the caller's group) or the caller's own pid."""
    body = [(LD_W_ABS, 0, 0, 16), (JEQ_K, 2, 0, 0), (JEQ_K, 1, 0, pid & 0xFFFFFFFF), (RET_K, 0, 0, refuse),
            (RET_K, 0, 0, RET_ALLOW)]
    return [(LD_W_ABS, 0, 0, 0), (JEQ_K, 0, len(body), number), *body]


def _block(number: int, body: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """LD nr; if nr != number skip the body. Inside the body each `JEQ 0` falls through on 0 and jumps to the
    refusal (the body's last instruction) otherwise."""
    fixed = []
    refuse_at = len(body) - 1
    for i, (op, jt, jf, k) in enumerate(body):
        if op == JEQ_K:
            jf = refuse_at - i - 1
        fixed.append((op, jt, jf, k))
    return [(LD_W_ABS, 0, 0, 0), (JEQ_K, 0, len(fixed), number), *fixed]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(signals_too: bool) -> None:
    """Load the filter into this process (and so every child it starts). Raises OSError where refused."""
    code = program(signals_too, os.getpid())
    raw = b"".join(struct.pack("HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(code), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")
