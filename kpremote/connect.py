"""The transport for a hosts.toml entry: this machine or SSH, inside the entry's container when it names one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import Host
from .transport import ContainerTransport, LocalTransport, Transport

if TYPE_CHECKING:
    from .transport.ssh import SSHTransport


def open_transport(host: Host) -> Transport:
    """The transport for a host; SSH connects lazily, on the first command."""
    base = LocalTransport(host.name) if host.transport == "local" else ssh_transport(host)
    return ContainerTransport(base, host.container) if host.container else base


def ssh_transport(host: Host) -> SSHTransport:
    """An SSH transport to the host, with the target, timeout, known_hosts and keys its entry names (not connected)."""
    from .transport.ssh import SSHTransport  # paramiko is slow to import; local-only commands skip it

    return SSHTransport(
        host.name,
        host.ssh or host.name,
        connect_timeout=host.connect_timeout,
        known_hosts=host.known_hosts,
        identity_file=host.identity_file,
        ssh_config=host.ssh_config,
    )
