"""The test rig: real OpenSSH servers on loopback addresses, each with its own host key, remote root and NVML fixture.

The NVML fixture file is the only test double in kpremote's tests: it stands in for the GPU on hosts that have
none. Everything else (SSH, sync, leases, builds, subprocesses, fetch) is real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[1]
# One thread per process for OpenMP and OpenBLAS (torch's and numpy's pools): each process that imports numpy or torch
# otherwise starts a thread per core that spins between calls, on a machine whose cores the suite's workers already
# keep busy (numbers in README's Tests section). tests/conftest.py sets it for every process the tests start, unless
# it is set already; each SSH host of the rig gets the same value (its sessions do not inherit this process's
# environment).
ONE_THREAD_POOL = {"OMP_NUM_THREADS": "1"}

STAND_IN_DOCKER = """#!/bin/bash
# Stand-in for `docker exec -i NAME bash -s` on a test host: refuses any other form, then runs the script on stdin
# the way a container would (as bash -s), marking the environment so tests can tell it ran "inside".
if [ "$#" -ne 5 ] || [ "$1" != exec ] || [ "$2" != -i ] || [ "$3" != "{container}" ] || [ "$4" != bash ] || [ "$5" != -s ]; then
  echo "docker stand-in: unexpected arguments: $*" >&2
  exit 125
fi
printf '%s\\n' "$*" >> "{calls}"
export KPREMOTE_IN_CONTAINER={container}
exec bash -s
"""


def idle_gpu(index: int, **overrides: Any) -> dict[str, Any]:
    """An idle H200 as NVML would describe it (docs/nvml-fixture.md)."""
    gpu = {
        "index": index,
        "uuid": f"GPU-{index:08d}-fixture-h200",
        "name": "NVIDIA H200",
        "cc": [9, 0],
        "memory_used_mib": 1,
        "memory_total_mib": 143771,
        "util_pct": 0,
        "temperature_c": 30,
        "power_w": 75.0,
        "sm_clock_mhz": 345,
        "sm_clock_max_mhz": 1980,
        "clock_event_reasons": [],
        "processes": [],
        "l2_bytes": 62914560,
    }
    gpu.update(overrides)
    return gpu


def busy_gpu(index: int, **overrides: Any) -> dict[str, Any]:
    return idle_gpu(
        index,
        memory_used_mib=66000,
        util_pct=97,
        processes=[{"pid": 4242, "name": "python3", "used_mib": 65900}],
        **overrides,
    )


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def loopback_block() -> int:
    """The third byte of this test process's loopback addresses (127.0.B.N): pytest-xdist's worker gwB gets block B,
    a run without workers block 0, so the hosts of workers running side by side never share an address."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) % 256 if worker.startswith("gw") and worker[2:].isdigit() else 0


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass
class SshHost:
    name: str
    address: str
    port: int
    home: Path
    client_key: Path
    container: Optional[str] = None
    python: str = sys.executable
    proc: Optional[subprocess.Popen] = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.home / "root"

    @property
    def nvml_fixture(self) -> Path:
        return self.home / "nvml.json"

    @property
    def bin_dir(self) -> Path:
        return self.home / "bin"

    @property
    def docker_calls(self) -> Path:
        return self.home / "docker-calls.log"

    @property
    def host_key_pub(self) -> str:
        return " ".join((self.home / "host_ed25519.pub").read_text().split()[:2])

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.host_key_pub}"

    def set_gpus(self, gpus: list[dict[str, Any]], driver: str = "580.159.04") -> None:
        tmp = self.nvml_fixture.with_suffix(".tmp")
        tmp.write_text(json.dumps({"driver": driver, "gpus": gpus}))
        os.replace(tmp, self.nvml_fixture)

    def write_config(self) -> None:
        env = {
            # Each host gets its own HOME: `~` in remote_root resolves per host, and the session shell does not
            # source this machine's ~/.bashrc (here it runs `pyenv init`, 0.3 s on every channel).
            "HOME": str(self.home),
            "KPREMOTE_NVML_FIXTURE": str(self.nvml_fixture),
            "PATH": f"{self.bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            **{name: os.environ[name] for name in ONE_THREAD_POOL if name in os.environ},
            **self.extra_env,
        }
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {self.home / 'host_ed25519'}",
            f"PidFile {self.home / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.home / 'authorized_keys'}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin yes",
            "MaxSessions 100",
            "MaxStartups 100:30:200",
            "LogLevel ERROR",
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
        ]
        (self.home / "sshd_config").write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self.write_config()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        log = open(self.home / "sshd.log", "ab")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.home / "sshd_config")], stdout=log, stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, self.port), timeout=0.2) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"sshd for {self.name} did not start: {(self.home / 'sshd.log').read_text()[-500:]}")

    def stop(self) -> None:
        """Stop the server and every session it started, like a host going down.

        Per-connection sshd processes start their own sessions, so the listener's process group does not reach
        them: they are found as the listener's descendants instead.
        """
        if self.proc and self.proc.poll() is None:
            sessions = _descendants(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGTERM)
            for pid in sessions:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=10)
        self.proc = None

    def hosts_entry(self, **overrides: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "ssh": f"root@{self.address}:{self.port}",
            "arch": "h200",
            "remote_root": str(self.root),
            "python": self.python,
            "identity_file": str(self.client_key),
            "connect_timeout": 5,
        }
        if self.container:
            entry["container"] = self.container
        entry.update(overrides)
        return entry


class Rig:
    """Starts SSH hosts on 127.0.B.2, 127.0.B.3, ... (B: loopback_block) and writes the client's hosts.toml and
    known_hosts."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.hosts: list[SshHost] = []
        self.client_key = base / "client_ed25519"
        self.known_hosts = base / "known_hosts"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)], check=True)
        self.known_hosts.write_text("")
        self._next_address = 2
        self.client: Optional[str] = None  # "openssh" or "paramiko": written as each SSH host's transport when set

    def add_host(
        self,
        name: str,
        *,
        gpus: Optional[list[dict[str, Any]]] = None,
        container: Optional[str] = None,
        trusted: bool = True,
        extra_env: Optional[dict[str, str]] = None,
    ) -> SshHost:
        address = f"127.0.{loopback_block()}.{self._next_address}"
        self._next_address += 1
        home = self.base / name
        host = SshHost(
            name=name,
            address=address,
            port=free_port(address),
            home=home,
            client_key=self.client_key,
            container=container,
            extra_env=extra_env or {},
        )
        (home / "bin").mkdir(parents=True)
        host.root.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_ed25519")], check=True)
        (home / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        if container:
            docker = home / "bin" / "docker"
            docker.write_text(STAND_IN_DOCKER.format(container=container, calls=host.docker_calls))
            docker.chmod(0o755)
        host.set_gpus(gpus if gpus is not None else [idle_gpu(0)])
        host.start()
        if trusted:
            self.trust(host)
        self.hosts.append(host)
        return host

    def trust(self, host: SshHost) -> None:
        with open(self.known_hosts, "a") as f:
            f.write(host.known_hosts_line + "\n")

    def write_hosts_toml(
        self, path: Path, hosts: list[SshHost], *, local: bool = True, overrides: Optional[dict[str, dict]] = None
    ) -> Path:
        overrides = overrides or {}
        lines = ["[defaults]", f'known_hosts = "{self.known_hosts}"', ""]
        for host in hosts:
            lines.append(f'[hosts."{host.name}"]')
            chosen = {"transport": self.client} if self.client else {}
            for key, value in host.hosts_entry(**chosen, **overrides.get(host.name, {})).items():
                lines.append(f"{key} = {json.dumps(value)}")
            lines.append("")
        if local:
            lines += ["[hosts.local]", 'transport = "local"', 'arch = "auto"', f'remote_root = "{self.base / "local-root"}"', ""]
        path.write_text("\n".join(lines))
        return path

    def stop_all(self) -> None:
        for host in self.hosts:
            host.stop()


def run_inv(*args: str, env: Optional[dict[str, str]] = None, cwd: Path = REPO, timeout: float = 300,
            input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run the real `inv` command line of this checkout, as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, input=input,
    )
