"""The transport interface: one command as a value, run on a host over one channel, with bytes in and out.

A caller describes what to run as a `Command` (its words, stdin, time limits, where stdout goes) and a transport
`send`s it, the way an httpx transport handles a Request; `run(argv, **options)` builds the Command for it, as
httpx's `Client.request` does. Each transport implements only `send`, and `connect`/`close` where it has a
connection.
"""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Sequence, Union

StdinSource = Union[bytes, BinaryIO, Callable[[], "bytes | None"], None]
"""What a command reads: nothing, a bytes blob, a binary file object, or a chunk producer (None ends it)."""


@dataclass(frozen=True)
class Command:
    """One command for a host: argv (each element one word; never re-split) and how to run it."""

    argv: list[str]
    stdin: StdinSource = None
    timeout: float | None = None
    """Seconds the whole command may take."""
    on_stdout: Callable[[bytes], None] | None = None
    """When given, receives stdout chunks as they arrive (Completed.stdout is then empty)."""
    idle_timeout: float | None = None
    """Over a network, this long without a byte means the link is gone (HostError)."""

    def deadline(self) -> float | None:
        """The time.monotonic() by which the command must end, counted from now; None: no limit."""
        return None if self.timeout is None else time.monotonic() + self.timeout


@dataclass
class Completed:
    """What a remote command left behind."""

    argv: list[str]
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return "\n".join(text[-lines:])


@dataclass
class ChannelCounter:
    """Counts channels opened: every one is a round trip, and runs must stay cheap over slow links."""

    opened: int = 0
    log: list[str] = field(default_factory=list)

    def note(self, argv: Sequence[str]) -> None:
        self.opened += 1
        self.log.append(argv[min(len(argv) - 1, 4)] if argv else "")


class Transport:
    """A way to run commands on one host. Kinds: LocalTransport, OpenSSHTransport, SSHTransport (paramiko),
    ContainerTransport."""

    host: str
    channels: ChannelCounter

    def run(self, argv: Sequence[str], **options: Any) -> Completed:
        """Run argv with Command's options (stdin, timeout, on_stdout, idle_timeout) and wait for it."""
        return self.send(Command(list(argv), **options))

    def send(self, command: Command) -> Completed:
        """Run the command and wait for it.

        Raises HostError when the host cannot be reached; a non-zero exit is NOT an exception.
        """
        raise NotImplementedError

    def connect_soon(self) -> None:
        """Start connecting now, in the background, while the caller does local work (scanning a task); the next
        send() waits for that connection, or raises what stopped it. A no-op where there is nothing to connect."""

    def connect(self) -> None:
        """Connect now (or raise HostError); a no-op where there is nothing to connect."""

    def close(self) -> None:
        """Let the connection go; a no-op where there is none."""


class ConnectsInBackground(Transport):
    """A transport with a connection to open (OpenSSH's master, paramiko's connection): connect_soon() opens it in a
    thread while the caller scans the task, and connect() waits for that attempt and raises what stopped it. Once:
    while an attempt is under way, or its failure waits for connect() to raise it, a second would only wait again.
    A transport gives is_open() and open_connection()."""

    def __init__(self) -> None:
        self._connecting = threading.Lock()  # one connect at a time: the background one and send()'s
        self._background_failure: BaseException | None = None

    def is_open(self) -> bool:
        raise NotImplementedError

    def open_connection(self) -> None:
        """Open the connection now, in the calling thread (HostError when the host cannot be reached)."""
        raise NotImplementedError

    def connect_soon(self) -> None:
        if not self.is_open() and self._background_failure is None and not self._connecting.locked():
            threading.Thread(target=self._connect_in_background, name="kpremote-connect", daemon=True).start()

    def _connect_in_background(self) -> None:
        with self._connecting:  # the failure is recorded before send()'s connect can look for it
            if self.is_open():
                return
            try:
                self.open_connection()
            except BaseException as exc:  # noqa: BLE001 - raised by the next connect(), in the caller's thread
                self._background_failure = exc

    def connect(self) -> None:
        with self._connecting:
            failure, self._background_failure = self._background_failure, None
            if failure is not None:
                raise failure  # a second attempt would wait out the connect timeout all over again
            if not self.is_open():
                self.open_connection()


def command_line(argv: Sequence[str]) -> str:
    """The one place argv becomes a shell string: every word quoted."""
    return shlex.join(list(argv))
