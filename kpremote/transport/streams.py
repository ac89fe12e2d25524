"""Feeding a command's stdin while its output is read, and gathering that output, the same way for every transport."""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from .base import Command, Completed, StdinSource

CHUNK = 256 * 1024


def stdin_chunks(source: StdinSource) -> Iterator[bytes]:
    """Yield the bytes of any StdinSource in chunks."""
    if source is None:
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = memoryview(source)
        for start in range(0, len(data), CHUNK):
            yield bytes(data[start : start + CHUNK])
        return
    if callable(source):
        while (chunk := source()) is not None:
            if chunk:
                yield chunk
        return
    while chunk := source.read(CHUNK):
        yield chunk


def feed_in_background(
    source: StdinSource, write: Callable[[bytes], None], close: Callable[[], None]
) -> threading.Thread:
    """Write stdin from a thread, so a command that answers before it has read everything cannot deadlock us."""

    def pump() -> None:
        try:
            for chunk in stdin_chunks(source):
                write(chunk)
        except (BrokenPipeError, OSError, EOFError):
            pass  # the command stopped reading; its exit code tells the story
        finally:
            try:
                close()
            except (OSError, EOFError):  # the connection is gone: nothing left to close
                pass

    thread = threading.Thread(target=pump, name="kpremote-stdin", daemon=True)
    thread.start()
    return thread


class Output:
    """What a command prints, as it arrives: stdout to the command's on_stdout (or kept), stderr kept."""

    def __init__(self, command: Command) -> None:
        self.command = command
        self._stdout: list[bytes] = []
        self._stderr: list[bytes] = []
        self.stdout = command.on_stdout or self._stdout.append
        self.stderr = self._stderr.append

    def completed(self, exit_code: int) -> Completed:
        return Completed(list(self.command.argv), exit_code, b"".join(self._stdout), b"".join(self._stderr))
