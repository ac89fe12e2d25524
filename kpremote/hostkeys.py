"""Accepting a host key on purpose: only the key whose fingerprint the user verified is written."""

from __future__ import annotations

import os
import socket

import paramiko

from .config import Host
from .errors import HostError, HostKeyError
from .transport.ssh import SSHTransport, known_hosts_entry_name


def offered_key(host: Host) -> tuple[str, int, paramiko.PKey]:
    """The key the host offers right now (hostname and port resolved like a real connection)."""
    transport = SSHTransport(host.name, host.ssh or host.name, connect_timeout=host.connect_timeout,
                             known_hosts=host.known_hosts, ssh_config=host.ssh_config)
    hostname, port = transport.hostname, transport.port
    if transport.connection.gateway is not None:
        raise HostError(host.name, "trust-host cannot reach hosts behind ProxyJump; accept the key with ssh instead")
    try:
        sock = socket.create_connection((hostname, port), timeout=host.connect_timeout)
    except OSError as exc:
        raise HostError(host.name, f"unreachable: {hostname}:{port}: {exc}") from None
    session = paramiko.Transport(sock)
    try:
        session.start_client(timeout=host.connect_timeout)
        return hostname, port, session.get_remote_server_key()
    except paramiko.SSHException as exc:
        raise HostError(host.name, f"SSH handshake with {hostname}:{port} failed: {exc}") from None
    finally:
        session.close()


def trust(host: Host, fingerprint: str) -> str:
    hostname, port, key = offered_key(host)
    if key.fingerprint != fingerprint:
        raise HostKeyError(host.name, f"{hostname}:{port} offers {key.get_name()} {key.fingerprint}, not {fingerprint}: "
                                      "nothing written")
    line = f"{known_hosts_entry_name(hostname, port)} {key.get_name()} {key.get_base64()}"
    path = os.path.expanduser(host.known_hosts)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")
    return line
