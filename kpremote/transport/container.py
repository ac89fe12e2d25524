"""Run commands inside a long-lived container on the host: `docker exec -i NAME bash -s`, script on stdin.

The script travels on stdin, so nothing in it is expanded by the host's shell: variables and quotes are
interpreted once, inside the container (the users' nested-quoting incident cannot happen). Bash reads a
script from a pipe one byte at a time, so after the `exec` line the rest of stdin belongs to the command.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from .base import Completed, StdinSource, Transport, command_line
from .streams import stdin_chunks


class ContainerTransport:
    def __init__(self, inner: Transport, container: str) -> None:
        self.inner = inner
        self.container = container
        self.host = inner.host
        self.channels = inner.channels

    def wrapper_argv(self) -> list[str]:
        return ["docker", "exec", "-i", self.container, "bash", "-s"]

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: StdinSource = None,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        idle_timeout: float | None = None,
    ) -> Completed:
        script = ("exec " + command_line(argv) + "\n").encode()
        result = self.inner.run(
            self.wrapper_argv(), stdin=_prepend(script, stdin), timeout=timeout, on_stdout=on_stdout,
            idle_timeout=idle_timeout,
        )
        result.argv = list(argv)
        return result

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
