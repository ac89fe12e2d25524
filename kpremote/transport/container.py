"""Run commands inside a long-lived container on the host: `docker exec -i NAME bash -s`, script on stdin.

The script travels on stdin, so nothing in it is expanded by the host's shell: variables and quotes are
interpreted once, inside the container (the users' nested-quoting incident cannot happen). Bash reads a
script from a pipe one byte at a time, so after the `exec` line the rest of stdin belongs to the command.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from .base import Command, Completed, StdinSource, Transport, command_line
from .streams import stdin_chunks


class ContainerTransport(Transport):
    def __init__(self, inner: Transport, container: str) -> None:
        self.inner = inner
        self.container = container
        self.host = inner.host
        self.channels = inner.channels

    def wrapper_argv(self) -> list[str]:
        return ["docker", "exec", "-i", self.container, "bash", "-s"]

    def send(self, command: Command) -> Completed:
        script = ("exec " + command_line(command.argv) + "\n").encode()
        wrapped = replace(command, argv=self.wrapper_argv(), stdin=_prepend(script, command.stdin))
        return replace(self.inner.send(wrapped), argv=list(command.argv))

    def connect_soon(self) -> None:
        self.inner.connect_soon()

    def connect(self) -> None:
        self.inner.connect()

    def close(self) -> None:
        self.inner.close()


def _prepend(first: bytes, rest: StdinSource) -> Callable[[], "bytes | None"]:
    def chained() -> Iterator[bytes]:
        yield first
        yield from stdin_chunks(rest)

    chunks = chained()
    return lambda: next(chunks, None)
