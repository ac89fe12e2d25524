"""Commands on this machine: the same pipeline as SSH hosts, without SSH (host `local`)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import Callable, Optional

from .base import ChannelCounter, Command, Completed, Transport
from .errors import HostError
from .streams import Output, feed_in_background


class LocalTransport(Transport):
    def __init__(self, host: str = "local") -> None:
        self.host = host
        self.channels = ChannelCounter()

    def send(self, command: Command) -> Completed:
        # idle_timeout guards network links; two local processes have none to lose.
        self.channels.note(command.argv)
        try:
            # A session of its own: the terminal's Ctrl-C reaches the client only, which then cancels what it
            # started, as for an SSH host (a start whose client vanished notices its closed stdout and stops).
            proc = subprocess.Popen(
                command.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise HostError(self.host, f"command not found: {command.argv[0]}") from None
        feeder = feed_in_background(command.stdin, proc.stdin.write, proc.stdin.close)
        output = Output(command)
        reader = _drain_in_background(proc.stderr, output.stderr)
        deadline = command.deadline()
        try:
            if not _read_until(proc.stdout.fileno(), output.stdout, deadline):
                _kill_session(proc)  # past its timeout, printing or silent
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            code = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            code = proc.wait()
        except BaseException:
            _kill_session(proc)
            proc.wait()
            raise
        finally:
            feeder.join(timeout=5)
            reader.join(timeout=5)
            proc.stdout.close()
        return output.completed(code)


def _read_until(fd: int, sink: Callable[[bytes], None], deadline: Optional[float]) -> bool:
    """Hand what fd gives to sink until its end (True) or the deadline (False), whether or not anything comes: a
    command that prints nothing is held to its timeout too."""
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return True
        sink(chunk)


def _kill_session(proc: subprocess.Popen) -> None:
    """The command and whatever it started (its own session: start_new_session), killed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _drain_in_background(stream, sink: Callable[[bytes], None]):
    import threading

    def drain() -> None:
        while chunk := os.read(stream.fileno(), 65536):
            sink(chunk)
        stream.close()

    thread = threading.Thread(target=drain, name="kpremote-stderr", daemon=True)
    thread.start()
    return thread
