"""The judge's end of one side process: started with a socket of its own (forked by the judge's starter,
sidestarter.py, or by exec where there is none), asked one command at a time (a JSON reply or a SideFailed),
killed when the row is done.

The side itself (side.py) holds the adapter and only its own module; the channel (channel.py) carries JSON and
file descriptors, never a pickle.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import sandbox
from . import guard
from .channel import BadReply, Channel, ChannelClosed
from .correctness import SideFailed
from .sidestarter import SideStarter, StartedSide, StartFailed


MAX_TAMPERED = 8  # names kept per side: enough to say what was replaced


class SideProcess:
    """One side's process and the judge's end of its channel."""

    def __init__(self, side: str, env: dict[str, str], cwd: Path, scratch: Path | None = None,
                 starter: SideStarter | None = None) -> None:
        """Started by the judge's starter (forked, torch already imported), or where there is none by exec."""
        self.side = side
        if scratch is not None:
            env = {**env, **sandbox.scratch_env(sandbox.make_scratch(scratch))}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = ["--fd", str(theirs.fileno()), "--side", side, "--run-dir", str(cwd)]
        try:
            if starter is not None:
                self.process: subprocess.Popen | StartedSide = starter.start(argv, env, str(cwd), theirs.fileno())
            else:
                self.process = subprocess.Popen([sys.executable, "-m", "kpremote.agent.harness.side", *argv],
                                                pass_fds=(theirs.fileno(),), env=env, cwd=cwd,
                                                stdin=subprocess.DEVNULL)
        except (OSError, StartFailed) as exc:
            ours.close()
            raise SideFailed(f"{side} side did not start: {exc}") from None
        finally:
            theirs.close()
        self.channel = Channel(ours)
        self.tampered: list[str] = []  # what this side's process reported replaced of its own machinery (seal.py)

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, command: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
        """Send one command, wait for its JSON reply; a raise, a crash or a bad reply is a SideFailed."""
        self.send(command, fds)
        return self.reply()

    def send(self, command: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
        """The first half of a request: the judge may send to several sides before it waits (their imports)."""
        try:
            self.channel.send_command(command, fds)
        except ChannelClosed:
            raise SideFailed(f"{self.side} side crashed: {self._exit()}") from None

    def reply(self) -> dict[str, Any]:
        """The second half: the reply to the command last sent."""
        try:
            reply = self.channel.recv_reply()
        except ChannelClosed:
            raise SideFailed(f"{self.side} side crashed: {self._exit()}") from None
        except BadReply as exc:
            raise SideFailed(f"{self.side} side broke the protocol: {exc}") from None
        self._note_tampered(reply.get("tampered"))
        if not reply.get("ok"):
            raise SideFailed(str(reply.get("error") or "failed without saying why"), reply.get("traceback"))
        return reply

    def _note_tampered(self, names: Any) -> None:
        """The names a side's seal found replaced (side.serve): kept for the row's end, a few and short."""
        if not names:
            return
        names = names if isinstance(names, list) else [names]
        for name in names[:MAX_TAMPERED]:
            text = str(name)[:200]
            if text not in self.tampered and len(self.tampered) < MAX_TAMPERED:
                self.tampered.append(text)

    def _exit(self) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "closed its channel and did not exit"
        if code < 0:
            import signal

            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def threads(self) -> int | None:
        return guard.thread_count(self.pid)

    def stop(self) -> None:
        """Killed, not asked: a side has nothing to save, and torch's teardown can take seconds on a busy host."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.channel.close()


def request_guarded(process: SideProcess, command: dict[str, Any], where: str,
                    fds: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
    """process.request, with whatever it raises (a Refused aside) turned into this row's ERROR at `where`."""
    from .correctness import guarded as _guarded

    return _guarded(where, lambda: process.request(command, fds))
