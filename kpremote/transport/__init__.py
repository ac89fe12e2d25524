"""Ways to run commands on a host. `open_transport(host)` picks the right one from hosts.toml."""

from __future__ import annotations

from ..config import Host
from .base import ChannelCounter, Command, Completed, StdinSource, Transport, command_line
from .container import ContainerTransport
from .local import LocalTransport

__all__ = [
    "ChannelCounter",
    "Command",
    "Completed",
    "ContainerTransport",
    "LocalTransport",
    "StdinSource",
    "Transport",
    "command_line",
    "open_transport",
]


def open_transport(host: Host) -> Transport:
    """The transport for a host; SSH connects lazily, on the first command."""
    if host.transport == "local":
        base: Transport = LocalTransport(host.name)
    else:
        from .ssh import SSHTransport  # paramiko is slow to import; local-only commands skip it

        base = SSHTransport(
            host.name,
            host.ssh or host.name,
            connect_timeout=host.connect_timeout,
            known_hosts=host.known_hosts,
            identity_file=host.identity_file,
            ssh_config=host.ssh_config,
        )
    return ContainerTransport(base, host.container) if host.container else base
