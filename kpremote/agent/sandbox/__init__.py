"""The sandbox each side's process tree runs in: what this host can build, and entering it.

A side (and a side's build, and the candidate under the audit's ncu) is a process that runs code kpremote did
not write. Entering the sandbox, before that code is imported, it gives up for good:
- every change to the file system outside its own scratch folder (its Triton, CUDA, torch and temp caches are
  pointed there by scratch_env), the GPU's device nodes and its own /proc folder (WRITABLE_NODES), and the
  judge's namespace's own /dev/shm: the task tree, the run folder, the agent, the other side's folders, every
  bytecode cache another process reads, sysctls and other processes' /proc files are read-only to it;
- every read of its run's records and the other side's folders, of other runs and of the root's keys and locks
  (reads_env: the run folder is hidden but for its task copy and the process's own scratch and build folder)
  (landlock.py);
- signals, ptrace and memory access to any process outside its own tree, and renice, re-pinning or rescheduling
  of any process but itself (landlock.py where the kernel scopes them, seccomp.py for the rest);
- every capability, where it runs as root (privileges.py), and the system calls that change the host rather than
  the process (the clock, the kernel's log, modules, mounts, namespaces, keys: seccomp.py).
The judge and its sides share a PID namespace of their own (namespace.py): nothing a side starts outlives the
judge, and the judge finds and kills whatever a row left behind.

`support()` says what this host allows; a host that allows none of it still runs, and its results say
"unsandboxed" wherever their numbers show.
"""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import landlock, privileges, seccomp

DISABLE_ENV = "KPREMOTE_SANDBOX"  # "off": run unsandboxed (a diagnosis, and it says so everywhere)
SCRATCH_ENV = "KPREMOTE_SCRATCH"  # the one folder a sandboxed process may change
HIDDEN_ENV = "KPREMOTE_HIDDEN"  # what a sandboxed process may not read (os.pathsep-joined; reads_env)
SEEN_ENV = "KPREMOTE_SEEN"  # the parts of the hidden ones it may read
# The device nodes a sandboxed process may write (Landlock: plain writes to what exists, never a new node): the GPU's
# (CUDA opens them to write) and the harmless sinks; no disk, no /dev/kmsg, no terminal. Its own /proc folder is
# added where it enters (own_proc): CUDA's initialisation writes files of its own process there (without any /proc
# write, cudaGetDeviceCount failed with error 304 on an H200: benchmarks/gpu/sandbox_diag.py).
WRITABLE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/nvidia*", "/dev/nvidia-caps")


@dataclass
class Support:
    """What this host can build: Landlock's ABI (0: none), a seccomp filter, a PID namespace."""

    landlock_abi: int = 0
    seccomp: bool = False
    pid_namespace: bool = False
    why_not: list[str] = field(default_factory=list)

    @property
    def level(self) -> str:
        """"sandboxed": files, signals, scheduling and leftovers all held; "partial": some; "unsandboxed": none."""
        held = [self.landlock_abi >= 1, self.seccomp, self.pid_namespace]
        if all(held):
            return "sandboxed"
        return "partial" if any(held) else "unsandboxed"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level}


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").lower() in ("off", "0", "no")


def support() -> Support:
    """Probe this host (milliseconds): Landlock's ABI, seccomp, and whether a PID namespace can be made."""
    found = Support()
    if disabled():
        found.why_not.append(f"{DISABLE_ENV}=off")
        return found
    found.landlock_abi = landlock.abi_version()
    if found.landlock_abi < 1:
        found.why_not.append("no Landlock in this kernel")
    found.seccomp = seccomp.supported()
    if not found.seccomp:
        found.why_not.append("no seccomp filter for this machine")
    found.pid_namespace, why = _can_unshare()
    if not found.pid_namespace:
        found.why_not.append(f"no PID namespace: {why}")
    return found


def _can_unshare() -> tuple[bool, str]:
    from . import namespace

    try:
        read_end, write_end = os.pipe()
        child = os.fork()
    except OSError as exc:
        return False, str(exc)
    if child == 0:
        os.close(read_end)
        try:
            namespace.unshare()
            os.write(write_end, b"ok")
        except OSError as exc:
            os.write(write_end, str(exc).encode()[:200])
        os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 256).decode(errors="replace")
    os.close(read_end)
    os.waitpid(child, 0)
    return answer == "ok", answer


def scratch_env(scratch: Path) -> dict[str, str]:
    """Where a sandboxed process's tools keep their caches and temporary files: all inside its scratch folder."""
    scratch = Path(scratch)
    return {SCRATCH_ENV: str(scratch), "TMPDIR": str(scratch / "tmp"), "TRITON_CACHE_DIR": str(scratch / "triton"),
            "CUDA_CACHE_PATH": str(scratch / "nv"), "XDG_CACHE_HOME": str(scratch / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")}


def side_scratch(run_dir: Path, side: str) -> Path:
    """A side's scratch folder in a run: the same for its timing process and the calls the audit or a profile
    makes of it (so they find the Triton configurations it tuned), and no one else's."""
    return Path(run_dir) / "raw" / "scratch" / side


def reads_env(run_dir: Path, seen: list[Path]) -> dict[str, str]:
    """What a sandboxed process of a run may not read: the run folder (its state and lock, events, workloads'
    logs, summary, audit, the other side's scratch and build), the other runs beside it (a host's runs/, or a
    task folder's results/ where `inv check` runs and fetched runs lie), and under the kpremote root that holds
    it, every task's runs and workspace, the keys and the GPU locks; save `seen` (its task copy, its own scratch
    and build folder)."""
    run_dir = Path(run_dir).absolute()
    hidden = [run_dir]
    if run_dir.parent.name == "runs":
        hidden.append(run_dir.parent)
    if run_dir.parent.parent.name == "results":
        hidden.append(run_dir.parent.parent)
    root = next((a.parent for a in run_dir.parents if a.name == "tasks"), None)
    if root is not None:
        hidden += [root / "tasks", root / "keys", root / "locks"]
    return {HIDDEN_ENV: os.pathsep.join(map(str, hidden)), SEEN_ENV: os.pathsep.join(str(p) for p in seen)}


def side_reads(run_dir: Path, side: str, task_dir: Path) -> dict[str, str]:
    """reads_env for one side's timing process, or its calls under the audit's or a profile's ncu: it reads its
    task copy and its own build folder (its scratch folder it always may)."""
    from ..task.build import build_dir

    return reads_env(run_dir, [Path(task_dir), build_dir(run_dir, side)])


def writable_nodes() -> list[Path]:
    """The device nodes of WRITABLE_NODES on this host, and this process's own /proc folder."""
    return [*(Path(p) for pattern in WRITABLE_NODES for p in sorted(glob.glob(pattern))), own_proc()]


def own_proc() -> Path:
    """This process's folder in the /proc it sees (/proc/self resolved: inside the judge's namespace, whether or not
    /proc is its own, it names this process). Only this process: a child a side starts has a folder of its own,
    which is not writable to it (it inherits the domain, not the rule)."""
    return Path(os.path.realpath("/proc/self"))


def private_shm() -> list[Path]:
    """/dev/shm where it is the judge's namespace's own tmpfs (namespace.mount_own_shm), else nothing: a /dev/shm
    shared with the host would outlive the run."""
    from .namespace import SHM_MOUNTED_ENV

    mounted = os.environ.get(SHM_MOUNTED_ENV, "")
    try:
        return [Path("/dev/shm")] if mounted and str(os.stat("/dev/shm").st_dev) == mounted else []
    except OSError:
        return []


def _paths(variable: str) -> list[Path]:
    return [Path(p) for p in os.environ.get(variable, "").split(os.pathsep) if p]


def make_scratch(scratch: Path) -> Path:
    for name in ("tmp", "triton", "nv", "cache", "inductor"):
        (Path(scratch) / name).mkdir(parents=True, exist_ok=True)
    return Path(scratch)


def enter(scratch: Path | None = None, also: list[Path] = (), profiled: bool = False) -> str:
    """Give up, for this process and all it starts, every right the sandbox takes away; the writable folder is
    `scratch` (default: $KPREMOTE_SCRATCH), and `also` (a side's build folder; a file there may only be
    written); what it may not read is $KPREMOTE_HIDDEN but $KPREMOTE_SEEN (reads_env). `profiled`: Nsight Compute
    measures this process, which keeps root's capabilities where the GPU's counters are root's
    (privileges.counters_need_root). Returns what was applied, in words ("unsandboxed: why" where nothing could be)."""
    if disabled():
        return f"unsandboxed: {DISABLE_ENV}=off"
    folder = Path(scratch or os.environ.get(SCRATCH_ENV) or "")
    applied: list[str] = []
    missing: list[str] = []
    signals_scoped = False
    if str(folder) and folder.is_dir():
        try:
            hidden = _paths(HIDDEN_ENV)
            readable = landlock.readable_except(hidden, [folder, *also, *_paths(SEEN_ENV)]) if hidden else None
            done = landlock.restrict_self([folder, *private_shm(), *[p for p in also if Path(p).is_dir()]],
                                          [*writable_nodes(), *[p for p in also if not Path(p).is_dir()]], readable)
            applied.append(done.describe())
            signals_scoped = done.signals
        except OSError as exc:
            missing.append(f"landlock: {exc}")
    else:
        missing.append(f"landlock: no scratch folder ({folder or 'unset'})")
    if seccomp.supported():
        try:
            seccomp.install(signals_too=not signals_scoped)
            applied.append("seccomp")
        except OSError as exc:
            missing.append(f"seccomp: {exc}")
    try:  # last: Landlock opens its folders with root's rights (one under another user's 0700 folder too)
        kept = profiled and privileges.counters_need_root()
        capabilities = [privileges.KEPT_FOR_COUNTERS if kept else privileges.drop_all()]
    except OSError as exc:
        capabilities = []
        missing.append(f"capabilities: {exc}")
    if not applied:
        return "unsandboxed: " + "; ".join(missing)
    applied += capabilities
    return ", ".join(applied) + (f" (missing: {'; '.join(missing)})" if missing else "")
