"""The judge's side starter: a copy of the judge, forked once torch is imported and before anything else happens,
that forks every side process of the run, so that no side pays torch's import again (~1.4 CPU-seconds each: a
cold GPU run starts eight sides, a CPU run two).

What the copy holds is what the judge held at that moment: the agent's modules and torch, imported, never run.
It is forked before the judge reads the run's secret, touches a GPU, makes a case or imports the adapter, and it
keeps no descriptor of the judge's but its own socket: a side forked from it starts as if started afresh
(`python -m kpremote.agent.harness.side`), with the environment, folder, standard output and channel the judge
names, dumpable again, and then enters its sandbox itself, exactly as one started by exec does (side.main).

Each side is forked twice and its middle process exits at once: the side's parent is then the judge (process 1
of its namespace, or a child subreaper outside one), which waits for it, kills it and reads its exit status as
it would a child of its own (StartedSide). Where the copy cannot be made (no fork, torch missing, or
$KPREMOTE_SIDE_START=exec), sides are started by exec as before 2.13.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from ..procfs import pid_exists

START_ENV = "KPREMOTE_SIDE_START"  # "exec": every side by `python -m kpremote.agent.harness.side` (a diagnosis)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
MAX_REQUEST = 1 << 20


class StartFailed(Exception):
    """The starter could not fork a side (it is gone, or the fork failed): the row is an ERROR, as a side that
    did not start always was."""


class SideStarter:
    """The judge's end of its starter: ask for a side, get a StartedSide."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    @classmethod
    def fork(cls) -> "SideStarter | None":
        """The starter, forked from this process with torch imported; None where it cannot be (sides by exec)."""
        if os.environ.get(START_ENV, "").lower() == "exec" or not hasattr(os, "fork"):
            return None
        try:
            import torch  # noqa: F401 - the point: imported once, here, for every side
        except ImportError:
            return None
        _adopt_orphans()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()  # nothing of ours is written twice
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:  # the starter: never returns
            ours.close()
            _serve(theirs)
        theirs.close()
        return cls(pid, ours)

    def start(self, argv: list[str], env: dict[str, str], cwd: str, channel_fd: int) -> "StartedSide":
        """A side process running `side.main(argv)` with env and cwd, its channel on channel_fd's number, and this
        process's standard output and error (a row's log, as an exec'd side would inherit them)."""
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "channel_fd": channel_fd}).encode()
        try:
            socket.send_fds(self.sock, [request], [channel_fd, 1, 2])
            reply = json.loads(_read_line(self.sock) or "{}")
        except (OSError, ValueError) as exc:
            raise StartFailed(f"the side starter is gone ({type(exc).__name__}: {exc})") from None
        if not isinstance(reply.get("pid"), int):
            raise StartFailed(str(reply.get("error") or "the side starter answered nothing"))
        return StartedSide(reply["pid"])

    def stop(self) -> None:
        self.sock.close()  # the starter ends when its socket closes
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


class StartedSide:
    """A side the starter forked, adopted by this process: the part of subprocess.Popen the judge uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours to collect (never adopted): alive, or gone with its status
                if pid_exists(self.pid):
                    return None
                self.returncode = -signal.SIGKILL
                return self.returncode
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(f"side {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _adopt_orphans() -> None:
    """Outside a PID namespace, become the parent of the sides our starter forks (process 1 already is)."""
    if os.getpid() != 1 and sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


# --------------------------------------------------------------------------------------------- the starter


def _serve(sock: socket.socket) -> None:
    """The starter's loop: one side per request, until the judge closes the socket or dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _keep_only(sock.fileno())
        while True:
            try:
                message, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 3)
            except OSError:
                break
            if not message:
                break
            try:
                pid = _fork_side(json.loads(message.decode()), fds, sock)
                reply = {"pid": pid}
            except Exception as exc:  # noqa: BLE001 - the judge hears why, and the row is an ERROR
                reply = {"error": f"could not start a side: {type(exc).__name__}: {exc}"}
            finally:
                for fd in fds:
                    os.close(fd)
            sock.sendall(json.dumps(reply).encode() + b"\n")
    finally:
        os._exit(0)


def _keep_only(fd: int) -> None:
    """Close every descriptor the judge had but this socket; standard input from /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    os.closerange(3, fd)
    os.closerange(fd + 1, _max_fd())


def _max_fd() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _fork_side(request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """Fork twice; the middle process exits, so the side is adopted by the judge. The side's pid, once adopted."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        try:
            side = os.fork()
            if side == 0:
                os.close(write_end)
                _become_side(request, fds, sock)
            os.write(write_end, str(side).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    answer = b""
    while chunk := os.read(read_end, 64):
        answer += chunk
    os.close(read_end)
    os.waitpid(middle, 0)  # once the middle process is gone, the side's parent is the judge
    if not answer:
        raise OSError("the side's fork failed")
    return int(answer)


def _become_side(request: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    """In the side: the process an exec of `python -m kpremote.agent.harness.side ARGV` would have been."""
    code = 1
    try:
        channel, out, err = fds
        sock.close()
        os.dup2(out, 1)
        os.dup2(err, 2)
        wanted = int(request["channel_fd"])
        if channel != wanted:
            os.dup2(channel, wanted)
        os.closerange(3, wanted)
        os.closerange(wanted + 1, _max_fd())
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the side's scratch now
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a fresh exec is
        from . import side

        sys.argv = [side.__file__, *request["argv"]]
        code = side.main(list(request["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a side that fails prints why, as an exec'd one would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
