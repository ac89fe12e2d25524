"""Landlock through its three system calls: writes only beneath the folders a process is given, reads everywhere
but the subtrees it is denied, no signal to and no ptrace of a process outside its own domain, no TCP.

What is restricted is every kind of change to the file system (write, truncate, create, remove, rename into);
reads and execution of files where the caller names what to hide: Landlock only allows, so `readable_except`
turns "everything but these folders, save these parts of them" into the folders and files to allow (a side must
still import torch, its task and the agent; folders stay listable); and, where the kernel's Landlock is new enough, signals (ABI 6: a sandboxed process can signal only processes of its own domain or one nested in it)
and TCP bind/connect (ABI 4). A Landlock domain also keeps ptrace, /proc/PID/mem and process_vm_readv of any
process outside it from its members (ABI 1). Applying it is one-way and inherited by every child.
"""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446  # the same numbers on x86-64 and arm64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE = (1 << n for n in range(6))
MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = (1 << n for n in range(6, 13))
REFER, TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

CHANGES_V1 = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | \
    MAKE_BLOCK | MAKE_SYM
READS = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # what a rule on a file (not a folder) may carry
_PINNED: list[int] = []  # O_PATH descriptors of /proc rules, held for the process's life (see restrict_self)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Applied:
    """What the domain holds: the ABI it was built for, and which of the restrictions that ABI allows."""

    abi: int
    signals: bool  # signals to processes outside the domain refused
    tcp: bool  # TCP bind and connect refused
    reads: bool = False  # reads restricted (readable_except)

    def describe(self) -> str:
        extra = [w for w, on in (("signals scoped", self.signals), ("no TCP", self.tcp), ("reads hidden", self.reads))
                 if on]
        return f"landlock ABI {self.abi}" + (f" ({', '.join(extra)})" if extra else "")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 where Landlock is missing or disabled."""
    try:
        value = _libc().syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(value))


def changes_for(abi: int) -> int:
    """Every file-system change the ABI can refuse."""
    access = CHANGES_V1
    if abi >= 2:
        access |= REFER
    if abi >= 3:
        access |= TRUNCATE
    return access


def restrict_self(writable: list[Path], device_files: list[Path] = (), readable: list[Path] | None = None) -> Applied:
    """Turn this process into a Landlock domain: changes only beneath `writable`, plain writes (no creation) to
    `device_files` (the GPU's /dev nodes, /dev/null, this process's own /proc folder), and, where `readable` is
    given (readable_except's answer), reads and execution of files only beneath those (every folder may still
    be listed: a task folder that holds its own run's folder, as `inv check`'s does, must be). Raises OSError where
    the kernel refuses."""
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    libc = _libc()
    changes = changes_for(abi)
    handled = changes | (READS if readable is not None else 0)
    attr = _RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for folder in writable:
            _allow(libc, ruleset, Path(folder), changes)
        file_write = WRITE_FILE | (TRUNCATE if abi >= 3 else 0)
        for node in device_files:
            _allow(libc, ruleset, Path(node), file_write, missing_ok=True)
        if readable is not None:  # every folder stays listable: names are no secret, contents are
            _allow(libc, ruleset, Path("/"), READ_DIR)
        for path in readable or ():
            _allow(libc, ruleset, Path(path), READS, missing_ok=True, follow=False)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return Applied(abi=abi, signals=abi >= 6, tcp=abi >= 4, reads=readable is not None)


def readable_except(denied: list[Path], allowed_inside: list[Path] = ()) -> list[Path]:
    """The folders and files to allow reading so that everything is readable but each `denied` path's tree, save
    the `allowed_inside` paths' trees (parts of a denied tree its process needs: its task copy, its scratch).

    Landlock only allows, beneath a folder: so every sibling of every ancestor of a denied path is allowed whole,
    and so is each allowed part. A file that appears in an ancestor after this call is not readable (restrict_self
    lets every folder be listed). A link among the siblings is left out (its target is
    decided where it lies); paths are compared resolved, so a denied folder reached through a link is denied."""
    marks = {Path(os.path.realpath(p)): False for p in denied if os.path.lexists(p)}
    marks.update({Path(os.path.realpath(p)): True for p in allowed_inside if os.path.lexists(p)})
    grants: list[Path] = []

    def readable(path: Path) -> bool:
        held = [p for p in marks if path == p or p in path.parents]
        return marks[max(held, key=lambda p: len(p.parts))] if held else True

    def visit(path: Path) -> None:
        if not any(path in p.parents for p in marks):  # nothing decided beneath: the whole tree as it is here
            if readable(path):
                grants.append(path)
            return
        try:
            children = sorted(os.listdir(path))
        except OSError:
            return
        for name in children:
            visit(path / name)

    visit(Path("/"))
    return grants


def _allow(libc: ctypes.CDLL, ruleset: int, path: Path, access: int, missing_ok: bool = False,
           follow: bool = True) -> None:
    """One rule: `access` beneath `path` (a link followed, or left out where follow is False). A rule under /proc
    keeps its descriptor open for the process's life: a procfs folder that nothing holds may be dropped and
    looked up afresh as another inode, which the rule would no longer name."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except (FileNotFoundError, PermissionError):
        if missing_ok:
            return
        raise
    pinned = False
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode):
            return
        if not stat.S_ISDIR(mode):
            access &= FILE_RIGHTS  # a rule on a file may carry only the rights that apply to a file
        rule = _PathBeneath(access, fd)
        if libc.syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
        if str(path).startswith("/proc/"):
            _PINNED.append(fd)
            pinned = True
    finally:
        if not pinned:
            os.close(fd)
