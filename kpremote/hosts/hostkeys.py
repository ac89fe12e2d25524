"""Accepting a host key on purpose: only the key whose fingerprint the user verified is written.

The hops to a host are walked in order (ProxyJump hosts first, the host itself last); the first hop whose key
known_hosts does not hold (unknown, or changed) is the one the fingerprint must belong to. A changed key is
replaced (every old line of that entry goes), and the answer says so; nothing is written for any other case.
"""

from __future__ import annotations

import base64
import os
import socket
from dataclasses import dataclass, field

import paramiko
from fabric import Connection

from .config import Host
from .connect import ssh_transport
from ..errors import HostError, HostKeyError
from ..transport import known_hosts as known
from ..transport.ssh import hops


@dataclass
class Trusted:
    entry: str          # the known_hosts name written, "[host]:port" or "host"
    line: str
    hop: str            # "the host" or "jump host ..."
    replaced: list[str] = field(default_factory=list)  # fingerprints of the keys that were removed

    def describe(self, known_hosts: str) -> str:
        if self.replaced:
            return (f"replaced the key of {self.hop} {self.entry} in {known_hosts}: {', '.join(self.replaced)} "
                    f"-> {self.line.split()[1]} {_fingerprint_of(self.line)}")
        return f"added to {known_hosts} for {self.hop} {self.entry}: {self.line}"


def trust(host: Host, fingerprint: str) -> Trusted:
    transport = ssh_transport(host)
    path = os.path.expanduser(host.known_hosts)
    chain = hops(transport.connection)
    try:
        for index, hop in enumerate(chain):
            entry = known.entry_name(hop.host, int(hop.port))
            key = _offered_key(host, hop, chain[index - 1] if index else None)
            have = known.keys_for(path, entry)
            if any(k.get_name() == key.get_name() and k.asbytes() == key.asbytes() for k in have):
                continue  # this hop is trusted already: the next one is reached through it
            who = "the host" if hop is transport.connection else f"jump host (ProxyJump for {host.name})"
            if key.fingerprint != fingerprint:
                raise HostKeyError(host.name, f"{who} {entry} offers {key.get_name()} {key.fingerprint}, not "
                                              f"{fingerprint}: nothing written")
            removed = known.replace(path, entry, key)
            return Trusted(entry, f"{entry} {key.get_name()} {key.get_base64()}", who,
                           [k.fingerprint for k in removed])
    finally:
        transport.close()
    raise HostKeyError(host.name, f"every host key on the way to {host.name} is already in {path}; nothing written")


def _offered_key(host: Host, hop: Connection, previous: Connection | None) -> paramiko.PKey:
    """The key `hop` offers now: reached directly, or through the (already trusted) hop before it."""
    where = f"{hop.host}:{hop.port}"
    if previous is None:
        try:
            sock = socket.create_connection((hop.host, int(hop.port)), timeout=host.connect_timeout)
        except OSError as exc:
            raise HostError(host.name, f"unreachable: {where}: {exc}") from None
    else:
        try:
            previous.open()
            sock = previous.transport.open_channel("direct-tcpip", (hop.host, int(hop.port)), ("", 0),
                                                   timeout=host.connect_timeout)
        except HostError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(host.name, f"cannot reach {where} through {previous.host}:{previous.port}: {exc}") from None
    session = paramiko.Transport(sock)
    session.banner_timeout = host.connect_timeout
    try:
        session.start_client(timeout=host.connect_timeout)
        return session.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostError(host.name, f"SSH handshake with {where} failed: {exc or type(exc).__name__}") from None
    finally:
        session.close()


def _fingerprint_of(line: str) -> str:
    _, key_type, data = line.split()[:3]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(data)).fingerprint
