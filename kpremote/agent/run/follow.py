"""The follow stream of one run: its events.jsonl line by line as it grows, a heartbeat after HEARTBEAT_S of
silence (the client takes a silent link for a lost one), then an end line with the final state and, when asked,
the summary tar after it. Where the state comes from is a watch: this host's processes (ProcessWatch), or Slurm
(slurmsettle.SlurmWatch).
"""

from __future__ import annotations

import json
import select
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from .events import complete_lines
from .liveness import current_state
from ..protocol import TERMINAL, SummaryUnverified
from .records import verified_results
from .runpaths import existing_run_dir
from .summary import write_summary_tar

HEARTBEAT_S = 2.0
FOLLOW_POLL_S = 0.05


class RunWatch(Protocol):
    def look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run's state now, and lines to send before its events (e.g. where it waits in a queue)."""

    def over(self, state: dict[str, Any]) -> bool:
        """Whether the run is over and its state final: the end line goes out once its events are drained."""


class ProcessWatch:
    """A run on this host: its state with a vanished process marked failed; over once terminal."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return current_state(self.run_dir), []

    def over(self, state: dict[str, Any]) -> bool:
        return state.get("status") in TERMINAL


def follow(root: Path, task: str, run_id: str, offset: int = 0, out: BinaryIO | None = None,
           once: bool = False, with_summary: bool = False) -> int:
    """`follow` of a run on this host (see follow_run)."""
    run_dir = existing_run_dir(root, task, run_id)
    return follow_run(run_dir, ProcessWatch(run_dir), offset, out, once=once, with_summary=with_summary)


def follow_run(run_dir: Path, watch: RunWatch, offset: int = 0, out: BinaryIO | None = None,
               once: bool = False, with_summary: bool = False) -> int:
    """Copy events.jsonl to out as it grows; end with the final state once the run is over and all is sent.

    With once, send what is there now and end with the current state (`inv logs` without --follow).
    With with_summary, a finished run's end line says "summary": true and the summary tar follows it to the end
    of the stream: `inv run` then needs no pack-summary channel (a round trip or two, and a remote Python start).
    """
    stream = _Stream(out if out is not None else sys.stdout.buffer)
    events = run_dir / "raw" / "events.jsonl"
    while True:
        # State first, events second: once the state is final, this read drains everything written before it.
        state, said = watch.look()
        for line in said:
            stream.send(json.dumps(line).encode() + b"\n")
        chunk, offset = complete_lines(events, offset)
        if chunk:
            stream.send(chunk)
        if once or watch.over(state):
            _end(stream.out, run_dir, state, offset, with_summary)
            return 0
        if reader_gone(stream.out):
            return 0
        if time.monotonic() - stream.last_sent > HEARTBEAT_S:
            stream.send(b'{"event": "heartbeat"}\n')
        time.sleep(FOLLOW_POLL_S)


class _Stream:
    """out, and when we last wrote to it."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.last_sent = time.monotonic()

    def send(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()
        self.last_sent = time.monotonic()


def _end(out: BinaryIO, run_dir: Path, state: dict[str, Any], offset: int, with_summary: bool) -> None:
    """The end line; after it, for a finished run that was asked for it, the summary tar, once its host's sealed
    record vouches for it (otherwise the end line says why not, as "summary_refused", and no tar follows)."""
    summary = with_summary and state.get("status") in TERMINAL and state.get("status") != "cancelled"
    results, refused = None, None
    if summary:
        try:
            results = verified_results(run_dir, state)
        except SummaryUnverified as exc:
            refused = str(exc)
    end = {"event": "end", "state": state, "offset": offset, **({"summary": True} if results is not None else {}),
           **({"summary_refused": refused} if refused else {})}
    out.write(json.dumps(end, default=str).encode() + b"\n")
    if results is not None:
        write_summary_tar(run_dir / "summary", out, results)
    out.flush()


def reader_gone(stream: BinaryIO) -> bool:
    """True once nobody reads our stdout (client gone), so a quiet run does not keep an orphan follow alive."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # only POLLERR / POLLHUP / POLLNVAL are reported
    return any(events & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, events in poller.poll(0))
