"""Which part of the sandbox does CUDA init need? Each variant in a fresh child: enter it, then torch.cuda.init().

    python benchmarks/gpu/sandbox_diag.py

"enter" is the sandbox as a side enters it (sandbox.enter: writes only to its own /proc folder, the GPU's nodes
and the sinks, a run folder's records hidden), "enter_ns" the same inside the judge's namespace (its own /proc and
/dev/shm); both must print "ok". Where strace is installed, the last line lists what CUDA's initialisation opens
to write under /proc and /dev with both of them writable (the rules of harness <= 2.16), so a refusal can be
told apart.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from kpremote.agent import sandbox  # noqa: E402
from kpremote.agent.sandbox import landlock, seccomp  # noqa: E402

VARIANTS = ["none", "seccomp", "ll_full", "ll_proc", "ll_tmp", "ll_fs_tmp_dev", "enter", "enter_ns"]
NAMESPACED = {"enter_ns"}


def apply(variant: str, scratch: Path) -> None:
    if variant == "none":
        return
    if variant.startswith("enter"):  # a run folder around the scratch, its records hidden as a side's are
        run = scratch / "run"
        (run / "state.json").parent.mkdir(parents=True, exist_ok=True)
        (run / "state.json").write_text("{}")
        os.environ.update(sandbox.reads_env(run, []))
        applied = sandbox.enter(sandbox.make_scratch(run / "raw" / "scratch" / "candidate"))
        try:
            (run / "state.json").read_text()
            hidden = "state.json READABLE"
        except OSError:
            hidden = "state.json hidden"
        print(json.dumps({f"{variant}_applied": f"{applied}; {hidden}"}), flush=True)
        return
    if variant == "seccomp":
        seccomp.install(signals_too=False)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    abi = landlock.abi_version()
    fs = landlock.changes_for(abi)
    net = landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
    scope = landlock.SCOPE_SIGNAL | landlock.SCOPE_ABSTRACT_UNIX_SOCKET
    if variant == "ll_nonet":
        net = 0
    if variant == "ll_noscope":
        scope = 0
    if variant.startswith("ll_fs"):
        net, scope = 0, 0
    attr = landlock._RulesetAttr(fs, net, scope)
    rs = libc.syscall(landlock.CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(24), ctypes.c_uint32(0))
    rules = [(scratch, fs), (Path("/dev/shm"), fs)]
    if variant == "ll_proc":
        rules += [(Path("/dev"), landlock.WRITE_FILE | landlock.TRUNCATE),
                  (Path("/proc"), landlock.WRITE_FILE | landlock.TRUNCATE)]
    if variant == "ll_tmp":
        rules += [(Path("/dev"), landlock.WRITE_FILE | landlock.TRUNCATE), (Path("/tmp"), fs)]
    if variant in ("ll_full", "ll_nonet", "ll_noscope", "ll_fsonly_devwrite"):
        rules.append((Path("/dev"), landlock.WRITE_FILE | landlock.TRUNCATE))
    if variant == "ll_fsonly_devall":
        rules.append((Path("/dev"), fs))
    if variant == "ll_fs_tmp_dev":
        rules += [(Path("/dev"), fs), (Path("/tmp"), fs), (Path("/proc"), landlock.WRITE_FILE | landlock.TRUNCATE)]
    if variant == "ll_fs_root_write":
        rules += [(Path("/"), landlock.WRITE_FILE | landlock.TRUNCATE)]
    for path, access in rules:
        landlock._allow(libc, rs, path, access)
    libc.prctl(38, 1, 0, 0, 0)
    assert libc.syscall(landlock.RESTRICT_SELF, rs, ctypes.c_uint32(0)) == 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "child":
        apply(argv[1], Path(argv[2]))
        import torch

        try:
            torch.cuda.init()
            x = torch.ones(10, device="cuda")
            print(json.dumps({argv[1]: f"ok {float(x.sum())}"}))
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({argv[1]: f"{type(exc).__name__}: {str(exc)[-160:]}"}))
        return 0
    for variant in VARIANTS:
        scratch = Path(tempfile.mkdtemp())
        launcher = [sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--"] if variant in NAMESPACED else []
        proc = subprocess.run([*launcher, sys.executable, str(HERE), "child", variant, str(scratch)],
                              capture_output=True, env={**os.environ, "TMPDIR": str(scratch)}, timeout=120,
                              cwd=HERE.parents[2])
        print(proc.stdout.decode().strip() or proc.stderr.decode()[-300:], flush=True)
    print(json.dumps({"cuda_writes": cuda_writes()}), flush=True)
    return 0


def cuda_writes() -> list[str] | str:
    """What CUDA's initialisation opens to write under /proc and /dev, /proc and /dev writable (strace -f)."""
    strace = shutil.which("strace")
    if strace is None:
        return "strace not installed"
    scratch = Path(tempfile.mkdtemp())
    trace = scratch / "trace"
    subprocess.run([strace, "-f", "-e", "trace=open,openat,openat2", "-o", str(trace), sys.executable, str(HERE),
                    "child", "ll_proc", str(scratch)], capture_output=True, env={**os.environ, "TMPDIR": str(scratch)},
                   timeout=300)
    found = set()
    for line in trace.read_text(errors="replace").splitlines():
        path = re.search(r'"(/(?:proc|dev)/[^"]*)"', line)
        if path and re.search(r"O_WRONLY|O_RDWR", line) and "= -1" not in line:
            found.add(re.sub(r"/proc/\d+", "/proc/PID", path.group(1)))
    return sorted(found)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
