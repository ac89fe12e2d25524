"""What the benchmarks share: SSH hosts behind a delay proxy, the OpenSSH command line the anchors use, timing.

A `LinkedHost` is one rig host (a real OpenSSH server on its own loopback address, tests/rig.py) reached through
a DelayProxy on 127.0.0.1. Its known_hosts gets a `[127.0.0.1]:PORT` line with the host's own key, so every
client (paramiko for kpremote and Fabric, OpenSSH for tar|ssh, scp and rsync) checks the host key strictly.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
for _path in (str(REPO / "tests"), str(REPO), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from delay_proxy import DelayProxy  # noqa: E402
from rig import Rig, SshHost  # noqa: E402


@dataclass
class LinkedHost:
    """A rig host behind its own delay proxy."""

    rig: Rig
    host: SshHost
    proxy: DelayProxy
    rtt_ms: float

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def root(self) -> Path:
        return self.host.root

    def bytes_on_wire(self) -> int:
        return self.proxy.bytes_total

    def hosts_toml(self, path: Path, **entry: str) -> Path:
        """hosts.toml naming this host through the proxy (the rig's own entry, with ssh pointed at the proxy, and
        `entry`'s keys: transport = "openssh" or "paramiko" picks the SSH client)."""
        overrides = {self.name: {"ssh": f"root@127.0.0.1:{self.port}", "connect_timeout": 30, **entry}}
        return self.rig.write_hosts_toml(path, [self.host], local=False, overrides=overrides)

    def ssh_options(self) -> list[str]:
        """The OpenSSH options every anchor uses: this host's key only, strict host key checking, no user config."""
        return ["-F", "/dev/null", "-i", str(self.rig.client_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.rig.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]

    def ssh(self) -> list[str]:
        return ["ssh", *self.ssh_options(), "-p", str(self.port), "root@127.0.0.1"]

    def ssh_shell(self) -> str:
        """`ssh ...` as one shell word list, for pipelines and rsync -e."""
        return shlex.join(self.ssh())

    def scp(self) -> list[str]:
        return ["scp", "-q", *self.ssh_options(), "-P", str(self.port)]

    def stop(self) -> None:
        self.proxy.stop()


def link_host(rig: Rig, host: SshHost, rtt_ms: float) -> LinkedHost:
    """Put a delay proxy in front of host and trust its key under the proxy's address."""
    proxy = DelayProxy((host.address, host.port), rtt_ms / 1000).start()
    with open(rig.known_hosts, "a") as f:
        f.write(f"[127.0.0.1]:{proxy.port} {host.host_key_pub}\n")
    return LinkedHost(rig, host, proxy, rtt_ms)


def fresh_rig(prefix: str) -> Rig:
    import tempfile

    return Rig(Path(tempfile.mkdtemp(prefix=prefix)))


# ------------------------------------------------------------------------------------------ commands and timing


def inv_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args]


def quiet_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **extra}


def timed(argv: Sequence[str] | str, *, cwd: Optional[Path] = None, env: Optional[dict[str, str]] = None,
          shell: bool = False, timeout: float = 900) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one command (it must succeed: a benchmark of a failing command measures nothing)."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, shell=shell, capture_output=True, text=True, timeout=timeout,
                          executable="/bin/bash" if shell else None)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        shown = argv if isinstance(argv, str) else shlex.join(argv)
        raise RuntimeError(f"command failed ({done.returncode}): {shown[:300]}\n{done.stdout[-1500:]}\n"
                           f"{done.stderr[-1500:]}")
    return seconds, done


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_line() -> str:
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip().split(",")[0]
    return (f"{os.cpu_count()} cores, python {sys.version.split()[0]}, {ssh}, load average {load_average()} "
            f"at the start")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def seconds_text(value: Optional[float]) -> str:
    return "-" if value is None or value != value else f"{value:.2f} s"


def size_text(n: Optional[float]) -> str:
    if n is None or n != n:
        return "-"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def repeat(fn: Callable[[], Any], times: int) -> list[Any]:
    return [fn() for _ in range(times)]
