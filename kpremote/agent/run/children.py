"""One child of a run (a prepare worker or a judge), held to its time limit and read through a trusted pipe.

The child gets the write end of a pipe that no process it starts inherits (the probe; a judge's ready line and
result come through it, never through a file the task's code could write), its job on stdin when it takes one,
and a time limit: counted from its start, or from its ready line for a judge (interpreter, torch and the task's
import come first, within STARTUP_LIMIT_S). A child over its limit, or one alive when the run is cancelled, is
killed with all it started; whatever it left in the run's process group goes too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..procfs import kill_strays, kill_tree

STARTUP_LIMIT_S = 300.0  # interpreter + torch + task import, before a workload's own timeout starts
POLL_S = 0.05
EXIT_GRACE_S = 10.0  # a worker whose result is in gets this long to exit before it is killed
LOG_TAIL_LINES = 15


@dataclass
class WorkerOutcome:
    result: dict[str, Any] | None  # the worker's JSON, when it wrote one
    seconds: float
    timed_out: str | None = None  # why, when it was stopped for taking too long
    crashed: str | None = None  # how it died without a result
    piped: dict[str, Any] | None = None  # what came through the trusted pipe, merged line by line
    returncode: int | None = None
    log_dropped_bytes: int = 0  # of the row's output, past its log's cap (harness/rowlog.py)


@dataclass
class ChildLimits:
    """How one child is started and held."""

    env: dict[str, str]
    cwd: Path
    log_path: Path  # its stdout and stderr, appended
    limit_s: float
    stdin_line: bytes | None = None  # handed over on stdin, which is then closed
    from_ready: bool = False  # the limit counts from its ready line (then ready_path is touched), not its start
    ready_path: Path | None = None
    done_when_piped: bool = False  # its pipe closing means its result is in: a slow exit then costs nothing


class PipeReader:
    """Drains a worker's result pipe on a thread (a large result must never block the writer)."""

    MAX_BYTES = 256 * 1024 * 1024

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.ready = threading.Event()
        self.closed = threading.Event()  # every writer closed its end: nothing more will come
        self.lines: list[dict[str, Any]] = []
        self.arrived: queue.Queue[dict[str, Any]] = queue.Queue()  # each line as it comes, for a child of many rows
        self._buffer = b""
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        total = 0
        with os.fdopen(self.fd, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                total += len(chunk)
                if total > self.MAX_BYTES:
                    continue  # read on so the writer never blocks, keep nothing more
                self._buffer += chunk
                *complete, self._buffer = self._buffer.split(b"\n")
                for line in complete:
                    self._take(line)
        if self._buffer.strip():
            self._take(self._buffer)
        self.closed.set()

    def _take(self, line: bytes) -> None:
        try:
            value = json.loads(line)
        except ValueError:
            return
        if isinstance(value, dict):
            self.lines.append(value)
            self.arrived.put(value)
            if value.get("ready"):
                self.ready.set()

    def finish(self) -> dict[str, Any]:
        self._thread.join(timeout=30)
        merged: dict[str, Any] = {}
        for line in self.lines:
            merged.update(line)
        return merged


def run_child(command_for: Callable[[int], list[str]], limits: ChildLimits) -> WorkerOutcome:
    """Start the child (command_for gets the pipe's write end), hold it to its limits, and say how it ended:
    timed out, or exited with its return code and what it piped (result and crashed are the caller's to read)."""
    read_end, write_end = os.pipe()
    started = time.monotonic()
    try:
        with open(limits.log_path, "ab") as log:
            child = subprocess.Popen(command_for(write_end), stdout=log, stderr=subprocess.STDOUT, env=limits.env,
                                     cwd=limits.cwd, pass_fds=(write_end,), stdin=subprocess.PIPE)
    finally:
        os.close(write_end)
    pipe = PipeReader(read_end)
    _hand_over(child, limits.stdin_line)
    try:
        returncode, timed_out = _hold(child, pipe, limits, started)
    except BaseException:  # Cancelled above all: no worker outlives the runner's decision to stop
        if child.poll() is None:
            kill_tree(child)
        raise
    finally:
        kill_strays_noted(limits.log_path)
    seconds = time.monotonic() - started
    if timed_out:
        return WorkerOutcome(None, seconds, timed_out=timed_out)
    return WorkerOutcome(None, seconds, piped=pipe.finish(), returncode=returncode)


def crash_description(returncode: int, log_path: Path) -> str:
    """How a child died without a result, with the tail of its log."""
    tail = _tail(log_path)
    return _exit_description(returncode) + (f"; log tail:\n{tail}" if tail else "")


def _hold(child: subprocess.Popen, pipe: PipeReader, limits: ChildLimits, started: float) -> tuple[int | None, str | None]:
    """(return code, None) once the child is done; (None, why) after killing one over its limit."""
    ready_at = None if limits.from_ready else started
    while True:
        try:
            return child.wait(timeout=POLL_S), None
        except subprocess.TimeoutExpired:
            pass
        if limits.done_when_piped and pipe.closed.is_set():  # the result is in: a slow exit costs no row
            return wait_or_kill(child, EXIT_GRACE_S), None
        now = time.monotonic()
        if ready_at is None and pipe.ready.is_set():
            ready_at = now
            if limits.ready_path:
                limits.ready_path.touch()
        deadline = ready_at + limits.limit_s if ready_at is not None else started + STARTUP_LIMIT_S
        if now > deadline:
            kill_tree(child)
            return None, (f"no result within {limits.limit_s:g} s" if ready_at is not None
                          else f"the worker did not start within {STARTUP_LIMIT_S:g} s")


def _hand_over(child: subprocess.Popen, line: bytes | None) -> None:
    try:
        if line is not None:
            child.stdin.write(line)
        child.stdin.close()
    except OSError:
        pass  # a child that died at once is reported by its exit


def wait_or_kill(process: subprocess.Popen, grace_s: float) -> int:
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_tree(process)
        return process.returncode


def kill_strays_noted(log_path: Path) -> None:
    """Whatever a finished child left in the run's process group, killed, and named in its log."""
    strays = kill_strays()
    if strays:
        with open(log_path, "a") as log:
            log.write(f"runner: killed {len(strays)} process(es) left behind: {strays}\n")


def _exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode} and no result"


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""
