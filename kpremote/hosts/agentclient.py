"""Calling the agent on a host: ship it once per content hash, then `python -c BOOT ROOT HASH subcommand ...`."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional

from ..agent.protocol import ExitCode
from .config import Host
from ..errors import HostError, RemoteCommandError
from ..transport import Command, Completed, Transport

AGENT_MISSING = ExitCode.AGENT_MISSING
"""BOOT's exit code when ROOT/agent/HASH is not there (yet): ship, then call again."""
SLURM_SUBCOMMANDS = {"follow": "slurm-follow", "status": "slurm-status", "cancel": "slurm-cancel"}
"""A Slurm cluster's twins of the usual subcommands: same arguments, same answers, read from Slurm (docs/slurm.md)."""

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""kpremote/ (this module is kpremote/hosts/agentclient.py): the agent ships as its __init__.py and agent/."""


@functools.lru_cache(maxsize=1)
def agent_bundle() -> tuple[str, bytes]:
    """(content hash, tar of kpremote/__init__.py + kpremote/agent/**.py), built once per process."""
    files = [PACKAGE_DIR / "__init__.py", *sorted((PACKAGE_DIR / "agent").rglob("*.py"))]
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            name = "kpremote/" + path.relative_to(PACKAGE_DIR).as_posix()
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buffer.getvalue()


def boot_source() -> str:
    from ..agent.boot import BOOT

    return BOOT


class Agent:
    """The agent on one host, reached through a transport."""

    def __init__(self, host: Host, transport: Transport) -> None:
        self.host = host
        self.transport = transport
        self.shipped = 0  # how many times this client sent the agent (tests assert "once")

    def argv(self, subcommand: str, args: tuple[str, ...] = ()) -> list[str]:
        agent_hash, _ = agent_bundle()
        return [self.host.python, "-c", boot_source(), self.host.remote_root, agent_hash, subcommand, *args]

    def call(
        self,
        subcommand: str,
        *args: str,
        stdin: Optional[bytes] = None,
        on_stdout: Optional[Callable[[bytes], None]] = None,
        timeout: Optional[float] = None,
        idle_timeout: Optional[float] = None,
    ) -> Completed:
        """Run a subcommand; ship the agent first if the host does not have this version."""
        command = Command(self.argv(subcommand, args), stdin=stdin, on_stdout=on_stdout, timeout=timeout,
                          idle_timeout=idle_timeout)
        result = self.transport.send(command)
        if result.exit_code == AGENT_MISSING:
            self.ship()
            result = self.transport.send(command)
        self._raise_if_no_python(result)
        return result

    def ship(self) -> None:
        _, bundle = agent_bundle()
        result = self.transport.run(self.argv("ship"), stdin=bundle)
        self._raise_if_no_python(result)
        if not result.ok:
            raise RemoteCommandError(
                self.host.name, f"could not ship the agent: {error_message(result)}", result.exit_code, result.stderr_tail()
            )
        self.shipped += 1

    def call_json(self, subcommand: str, *args: str, **kwargs: Any) -> dict[str, Any]:
        """A subcommand that answers one JSON object; a failure raises with the agent's own message."""
        result = self.call(subcommand, *args, **kwargs)
        if not result.ok:
            raise RemoteCommandError(self.host.name, error_message(result), result.exit_code, result.stderr_tail())
        try:
            return json.loads(result.stdout)
        except ValueError:
            raise RemoteCommandError(
                self.host.name, f"agent {subcommand} answered something that is not JSON: {result.stdout[:200]!r}",
                result.exit_code, result.stderr_tail(),
            ) from None

    def _raise_if_no_python(self, result: Completed) -> None:
        if result.exit_code == ExitCode.NO_PYTHON:
            raise HostError(
                self.host.name,
                f"remote python {self.host.python!r} not found ({result.stderr_tail(1)}); "
                f"set python = \"/path/to/python3\" for this host in hosts.toml",
            )


def agent_subcommand(host: Host, name: str) -> str:
    """The agent subcommand that does `name` on this host: its slurm-* twin on a cluster."""
    return SLURM_SUBCOMMANDS.get(name, name) if host.is_cluster else name


def error_message(result: Completed) -> str:
    """The agent's one-line error: its JSON message if it printed one, else the end of stderr."""
    try:
        payload = json.loads(result.stdout.decode().strip().splitlines()[-1])
        if isinstance(payload, dict) and payload.get("message"):
            return str(payload["message"])
    except (ValueError, IndexError, UnicodeDecodeError):
        pass
    tail = result.stderr_tail(3)
    return tail or f"exit code {result.exit_code}"
