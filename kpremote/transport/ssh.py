"""Commands on an SSH host: one Fabric Connection, one paramiko channel per command.

Fabric resolves the target (an ~/.ssh/config alias with Hostname, Port, User, IdentityFile and ProxyJump, or
user@host[:port]); we replace its trust-on-first-use default with strict verification against known_hosts,
and open raw channels so binary stdin/stdout stream both ways and every channel is counted.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
from typing import Optional

import paramiko
from fabric import Config, Connection

from . import known_hosts as known
from .base import ChannelCounter, Command, Completed, ConnectsInBackground, command_line
from .errors import HostError, HostKeyError, changed_host_key, no_greeting, not_ssh, unknown_host_key
from .streams import Output, feed_in_background

KEEPALIVE_S = 5
# paramiko logs a failed handshake with its traceback (40 lines for a port that is not SSH); our one-line
# HostError says what happened instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

EOF_AFTER_EXIT_S = 0.5  # how long output may trail the exit status (see SSHTransport._pump)


class StrictHostKeys(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, naming the fingerprint and the exact way to accept it (for a ProxyJump hop too:
    `inv trust-host` walks the hops and trusts the first one whose key is not known)."""

    def __init__(self, host: str, known_hosts: str, hop: Optional[str] = None) -> None:
        self.host = host
        self.known_hosts = known_hosts
        self.hop = hop  # "jump host ..." when this is a ProxyJump hop, not the host itself

    def missing_host_key(self, client, hostname: str, key: paramiko.PKey) -> None:
        what = f"{self.hop} {hostname}" if self.hop else hostname
        raise unknown_host_key(self.host, what, self.known_hosts, key.get_name(), key.fingerprint)


def hops(connection: Connection) -> list[Connection]:
    """The connections on the way, first hop first: ProxyJump gateways, then the host itself."""
    chain: list[Connection] = []
    hop: object = connection
    while isinstance(hop, Connection):
        chain.append(hop)
        hop = hop.gateway
    return chain[::-1]


class SSHTransport(ConnectsInBackground):
    def __init__(
        self,
        host: str,
        target: str,
        *,
        connect_timeout: float = 10,
        known_hosts: str = "~/.ssh/known_hosts",
        identity_file: Optional[str] = None,
        ssh_config: Optional[str] = None,
    ) -> None:
        self.host = host
        self.target = target
        self.connect_timeout = connect_timeout
        self.known_hosts = os.path.expanduser(known_hosts)
        self.channels = ChannelCounter()
        # A port that accepts and never greets must not hold us longer than the connect timeout (paramiko: 15 s).
        connect_kwargs: dict = {"look_for_keys": identity_file is None, "banner_timeout": max(1.0, connect_timeout),
                                "auth_timeout": max(1.0, connect_timeout)}
        if identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(identity_file)]
        config = Config(runtime_ssh_path=os.path.expanduser(ssh_config)) if ssh_config else Config()
        super().__init__()
        self.connection = Connection(
            target, config=config, connect_timeout=int(max(1, connect_timeout)), connect_kwargs=connect_kwargs
        )
        self._verify_host_keys(self.connection)

    def _verify_host_keys(self, connection: Connection) -> None:
        """Apply strict checking to this connection and to every ProxyJump hop before it."""
        lines = [line for line in known.read(self.known_hosts) if line.key is not None]  # bad lines skipped
        for hop in hops(connection):
            store = hop.client.get_host_keys()
            for line in lines:
                for name in line.names:
                    store.add(name, line.key.get_name(), line.key)
            label = None if hop is connection else f"jump host (ProxyJump for {self.host})"
            hop.client.set_missing_host_key_policy(StrictHostKeys(self.host, self.known_hosts, label))

    @property
    def hostname(self) -> str:
        return self.connection.host

    @property
    def port(self) -> int:
        return int(self.connection.port)

    def is_open(self) -> bool:
        return bool(self.connection.is_connected)

    def open_connection(self) -> None:
        started = time.monotonic()
        try:
            self.connection.open()
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise self._changed_key(exc) from None
        except paramiko.AuthenticationException as exc:
            raise HostError(
                self.host, f"authentication failed for {self.connection.user}@{self.hostname}:{self.port} ({exc})"
            ) from None
        except (socket.timeout, TimeoutError):
            raise HostError(
                self.host, f"unreachable: no answer from {self.hostname}:{self.port} within {self.connect_timeout:g} s"
            ) from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            raise HostError(self.host, f"unreachable: {self.hostname}:{self.port}: {_first_reason(exc)}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(self.host, self._handshake_failure(exc, time.monotonic() - started)) from None
        self.connection.transport.set_keepalive(KEEPALIVE_S)
        _drop_when_unacknowledged(self.connection, self.connect_timeout)

    def _changed_key(self, exc: paramiko.BadHostKeyException) -> HostKeyError:
        """The hop whose key changed (the host, or a ProxyJump host on the way), and remedies for that very entry."""
        chain = hops(self.connection)
        hop = next((h for h in reversed(chain) if h.host == exc.hostname), self.connection)
        entry = known.entry_name(hop.host, int(hop.port))
        what = entry if hop is self.connection else f"jump host {entry} (ProxyJump for {self.host})"
        return changed_host_key(self.host, what, entry, self.known_hosts,
                                (exc.expected_key.get_name(), exc.expected_key.fingerprint),
                                (exc.key.get_name(), exc.key.fingerprint))

    def _handshake_failure(self, exc: BaseException, seconds: float) -> str:
        """One line for a port that is not SSH, a port that never greets, or another failed handshake.

        paramiko says "Error reading SSH protocol banner" (or "No existing session") for all of them; what tells
        them apart is time: a port that never greets fails only when the banner timeout (connect_timeout) ends.
        """
        where = f"{self.hostname}:{self.port}"
        text = str(exc)
        handshake = ("Error reading SSH protocol banner", "No existing session", "Indecipherable protocol version")
        if any(phrase in text for phrase in handshake) or isinstance(exc, EOFError):
            if seconds >= 0.9 * max(1.0, self.connect_timeout):
                return self._silent(where)
            return not_ssh(where)
        return f"cannot connect to {where}: {text or type(exc).__name__}"

    def _silent(self, where: str) -> str:
        return no_greeting(where, self.connect_timeout)

    def send(self, command: Command) -> Completed:
        self.connect()
        self.channels.note(command.argv)
        try:
            channel = self.connection.transport.open_session(timeout=self.connect_timeout)
            channel.exec_command(command_line(command.argv))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host, f"connection lost while starting a command: {exc or type(exc).__name__}") from None
        feeder = feed_in_background(command.stdin, channel.sendall, channel.shutdown_write)
        output = Output(command)
        try:
            self._pump(channel, output, command.deadline(), command.idle_timeout)
            code = channel.recv_exit_status()
            if code == -1 and self._connection_died():
                raise HostError(self.host, "connection lost mid-command (the link dropped or the host's sshd went away)")
        finally:
            channel.close()
            feeder.join(timeout=5)
        return output.completed(code)

    def _pump(self, channel, output: Output, deadline: float | None, idle_timeout: float | None) -> None:
        """Read stdout and stderr until the command exits; notice a dead link through keepalives.

        The channel stays blocking (a timeout on it would also cut the stdin writer short); select on its
        fileno, which paramiko makes readable when stdout or stderr has data.
        """
        last_byte = time.monotonic()
        exited_at = None
        while True:
            if channel.eof_received and not channel.recv_ready() and not channel.recv_stderr_ready():
                # All output is in, and paramiko keeps such a channel's fd readable for good: select would spin
                # (thousands of turns, holding the GIL other hosts' threads need) until the exit status comes.
                channel.status_event.wait(0.5)
                last_byte = time.monotonic()
                readable = []
            else:
                readable, _, _ = select.select([channel], [], [], 0.5)
            if readable:
                last_byte = time.monotonic()
            while channel.recv_stderr_ready():
                output.stderr(channel.recv_stderr(65536))
            while channel.recv_ready():
                output.stdout(channel.recv(65536))
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                # sshd may send the exit status before the last of the output (the child exited while its pipe still
                # held data): the output is complete at EOF. A command whose stdout a detached child keeps open never
                # sends EOF, so wait for it at most EOF_AFTER_EXIT_S past the exit status.
                exited_at = exited_at or time.monotonic()
                if channel.eof_received or time.monotonic() - exited_at > EOF_AFTER_EXIT_S:
                    return
            if not readable:
                if not self.connection.transport.is_active():
                    raise HostError(self.host, "connection lost (the host stopped answering)")
                if deadline is not None and time.monotonic() > deadline:
                    raise HostError(self.host, "command timed out")
                if idle_timeout is not None and time.monotonic() - last_byte > idle_timeout:
                    raise HostError(self.host, f"connection lost: no answer for {idle_timeout:g} s")

    def _connection_died(self) -> bool:
        """Why a channel ended with no exit status: the connection died (sshd killed), or only the command did."""
        transport = self.connection.transport
        transport.join(timeout=1.0)  # a dying transport's thread ends at once: wait for it to say so
        return not transport.is_active()

    def close(self) -> None:
        self.connection.close()


def _drop_when_unacknowledged(connection: Connection, seconds: float) -> None:
    """Let the kernel drop a connection whose bytes stay unacknowledged for `seconds` (Linux TCP_USER_TIMEOUT).

    Without it a cut link looks alive for ~15 minutes of TCP retransmissions: a command sending a sync or waiting
    for an answer would hang. A slow but working link keeps acknowledging, and the keepalive above makes even a
    silent wait send something every KEEPALIVE_S, so only a dead link trips it.
    """
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    hop: object = connection
    while option is not None and isinstance(hop, Connection):
        sock = hop.transport.sock if hop.transport is not None else None
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
        hop = hop.gateway


def _first_reason(exc: paramiko.ssh_exception.NoValidConnectionsError) -> str:
    for error in exc.errors.values():
        return os.strerror(error.errno) if getattr(error, "errno", None) else str(error)
    return str(exc)

