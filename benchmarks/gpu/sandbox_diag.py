"""Which part of the sandbox does CUDA init need? Each variant in a fresh child: enter it, then torch.cuda.init().

    python benchmarks/gpu/sandbox_diag.py
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from kpremote.agent.sandbox import landlock, seccomp  # noqa: E402

VARIANTS = ["none", "seccomp", "ll_full", "ll_proc", "ll_tmp", "ll_fs_tmp_dev"]


def apply(variant: str, scratch: Path) -> None:
    if variant == "none":
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
        proc = subprocess.run([sys.executable, str(HERE), "child", variant, str(scratch)], capture_output=True,
                              env={**os.environ, "TMPDIR": str(scratch)}, timeout=120)
        print(proc.stdout.decode().strip() or proc.stderr.decode()[-300:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
