"""The transport for a hosts.toml entry: this machine or SSH, inside the entry's container when it names one.

An SSH host goes through the system's `ssh` client when there is one (OpenSSHTransport: every ssh_config feature,
one master connection reused by every command), else through paramiko (SSHTransport); `transport = "openssh"` or
`"paramiko"` in the host's table picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .config import Host, load_inventory
from ..transport import ContainerTransport, LocalTransport, Transport
from ..errors import KpremoteError
from ..transport.errors import HostError

if TYPE_CHECKING:
    from ..transport.openssh import OpenSSHTransport
    from ..transport.ssh import SSHTransport


_EARLY: dict[str, Transport] = {}  # transports already connecting (connect_early), each for the first open_transport


def connect_early_to(hosts_file: Optional[str], host: Optional[str], tasks: int) -> None:
    """connect_early to the hosts a run of `tasks` tasks will start on (the first `tasks` of --host), beside the
    run's imports and task checks; a bad hosts file or host name is said later, in its turn."""
    try:
        connect_early(load_inventory(hosts_file).select(host)[:tasks])
    except KpremoteError:
        pass


def connect_early(hosts: list[Host]) -> None:
    """Start connecting to these OpenSSH hosts now, in the background, so that the handshake (the slowest part of a
    day's first command: ssh's key exchange and its authentication's round trips) passes while the command imports
    and checks its input; the first open_transport of each host gets that transport, and with it how the attempt
    ended (an error is raised there, once, as if it had connected then). A master outlives this process: a command
    that stops early (bad input, a candidate measured already) leaves one that ControlPersist ends later. Paramiko
    hosts connect when they are used, as before: their connection would die with the process."""
    for host in hosts:
        if host.transport == "local" or host.name in _EARLY or ssh_client_of(host) != "openssh":
            continue
        try:
            transport = open_transport(host)
        except HostError:
            continue  # said when the host is used
        transport.connect_soon()
        _EARLY[host.name] = transport


def open_transport(host: Host) -> Transport:
    """The transport for a host; SSH connects lazily, on the first command (or early: connect_early)."""
    early = _EARLY.pop(host.name, None)
    if early is not None:
        return early
    if host.transport == "local":
        base: Transport = LocalTransport(host.name)
    elif ssh_client_of(host) == "openssh":
        base = openssh_transport(host)
    else:
        base = ssh_transport(host)
    return ContainerTransport(base, host.container) if host.container else base


def ssh_client_of(host: Host) -> str:
    """Which SSH client a host's commands go through: "openssh" or "paramiko"."""
    from ..transport.openssh import ssh_client

    if host.transport in ("openssh", "paramiko"):
        return host.transport
    return "openssh" if ssh_client() else "paramiko"


def openssh_transport(host: Host) -> OpenSSHTransport:
    """The host over the system's ssh client (not connected)."""
    from ..transport.openssh import OpenSSHTransport, ssh_client

    if not ssh_client():
        raise HostError(host.name, 'transport = "openssh", but there is no ssh client on PATH (install '
                                   'openssh-client, or set transport = "paramiko")')
    return OpenSSHTransport(*_target(host), **_ssh_options(host))


def ssh_transport(host: Host) -> SSHTransport:
    """The host over paramiko, with the target, timeout, known_hosts and keys its entry names (not connected);
    `inv trust-host` walks a host's hops with it, whichever client runs the commands."""
    from ..transport.ssh import SSHTransport  # paramiko is slow to import; local-only commands skip it

    return SSHTransport(*_target(host), **_ssh_options(host))


def _target(host: Host) -> tuple[str, str]:
    """The host's name and what ssh connects to (its `ssh` target, or its name)."""
    return host.name, host.ssh or host.name


def _ssh_options(host: Host) -> dict[str, Any]:
    """What both SSH clients take from a host's entry: its timeout, known_hosts, key and ssh_config."""
    return {"connect_timeout": host.connect_timeout, "known_hosts": host.known_hosts,
            "identity_file": host.identity_file, "ssh_config": host.ssh_config}
