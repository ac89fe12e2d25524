"""The transport interface: run one command on a host, over one channel, with bytes in and out."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Protocol, Sequence, Union

StdinSource = Union[bytes, BinaryIO, Callable[[], "bytes | None"], None]
"""What a command reads: nothing, a bytes blob, a binary file object, or a chunk producer (None ends it)."""


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


class Transport(Protocol):
    """A way to run commands on one host. Implementations: LocalTransport, SSHTransport, ContainerTransport."""

    host: str
    channels: ChannelCounter

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: StdinSource = None,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        idle_timeout: float | None = None,
    ) -> Completed:
        """Run argv (each element one word; never re-split) and wait for it.

        on_stdout, when given, receives stdout chunks as they arrive (Completed.stdout is then empty).
        idle_timeout: over a network, this long without a byte means the link is gone (HostError).
        Raises HostError when the host cannot be reached; a non-zero exit is NOT an exception.
        """
        ...

    def connect_soon(self) -> None:
        """Start connecting now, in the background, while the caller does local work (scanning a task); the next
        run() waits for that connection, or raises what stopped it. A no-op where there is nothing to connect."""
        ...

    def connect(self) -> None:
        """Connect now (or raise HostError); a no-op where there is nothing to connect."""
        ...

    def close(self) -> None: ...


def command_line(argv: Sequence[str]) -> str:
    """The one place argv becomes a shell string: every word quoted."""
    return shlex.join(list(argv))
