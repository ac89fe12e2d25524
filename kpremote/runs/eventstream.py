"""A run's events as JSON lines on stdout, as they happen: `inv run --json-stream` and `inv logs --json`.

One line per event, each a kpremote.run-event/1 object (docs/schemas/run-event.json) naming its host, task and run:
the start's progress (connecting, syncing, created, waiting), `started`, then the agent's own events as its stream
has them (phase with workload i/n, build, row with its verdict, headline, warning, error, done), and `end`, the
run's outcome as the client saw it, the last line of every stream (its `ended` says whether the run is over).
Heartbeats are not passed on. Lines from runs followed in parallel never interleave: each goes out whole, under one
lock, and is flushed at once, so an agent reading a pipe sees it then. A reader that goes away (`| head -3`) changes
nothing about the run: the lines stop, stderr says so once, and the run is followed, fetched and recorded in the
ledger as it would have been.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, TextIO

from ..agent.run.events import RunEvent, kind_rule
from ..cli.jsonout import schema_name

__all__ = ["EVENT_SCHEMA", "EventStream", "OWN_KEYS", "StreamEvent"]

EVENT_SCHEMA = "run-event"


@dataclass
class StreamEvent(RunEvent):
    """One line of inv run --json-stream and inv logs --json: one event of one run, the agent's (RunEvent) or the
    client's own (connecting, syncing, created, waiting, submitted, started, end), in the envelope that names its
    host, task and run. EventStream.emit checks every line against it before it goes out."""

    SCHEMA: ClassVar[dict[str, Any]] = {
        "required": ["schema", "event", "host", "task", "run_id", "t"],
        "allOf": [*RunEvent.SCHEMA["allOf"], kind_rule("syncing", ["files", "bytes"]),
                  kind_rule("started", ["run_id", "gpu"], run_id={"type": "string"}),
                  kind_rule("end", ["status", "exit_code", "headline", "error", "ended"], status={
                      "description": "as kpremote.run/1's status: passed, failed, error, cancelled, detached, no idle "
                                     "GPU, not started, connection lost, already measured; under inv logs without "
                                     "--follow, the run's state as the host has it (running: it goes on, ended is "
                                     "false)"})]}

    schema: str | None = None  # the line's shape and version, kpremote.run-event/1
    host: str | None = None  # the host (for an outcome that no host took: every host tried, comma-separated)
    task: str | None = None
    run_id: str | None = None  # null until the host created the run (connecting, syncing)
    files: int | None = None  # syncing: the task's files sent
    bytes: int | None = None
    gpu: dict[str, Any] | None = None  # started: the GPU the run leased (protocol.GpuState)
    synced_files: int | None = None
    job_id: str | None = None  # started on a Slurm cluster: its job
    headline: dict[str, Any] | str | None = None  # end: the run's headline
    summary_dir: str | None = None  # end: where the fetched summary is
    # end: whether the run itself is over (passed, failed, error, cancelled, or never started: not started, no idle
    # GPU, already measured); false when the client stopped looking at a run that goes on: detached, connection
    # lost, or status running (inv logs without --follow)
    ended: bool | None = None


OWN_KEYS = ("schema", "event", "host", "task", "run_id", "t")  # the envelope's; an event's own are kept beside them


class EventStream:
    """Writes event lines to out (stdout by default); safe to share between the threads that follow runs."""

    def __init__(self, out: Optional[TextIO] = None) -> None:
        self._out = out
        self._lock = threading.Lock()
        self.reader_gone = False

    def emit(self, host: str, task: str, run_id: Optional[str], event: dict[str, Any]) -> None:
        """One event of a run as one line: the envelope first, then the event's own fields as they came."""
        line = {"schema": schema_name(EVENT_SCHEMA), "event": str(event.get("event") or "?"), "host": host,
                "task": task, "run_id": run_id, "t": _number(event.get("t")) or round(time.time(), 6),
                **{key: value for key, value in event.items() if key not in OWN_KEYS}}
        StreamEvent.from_json(line)  # RecordError: a client's or agent's field of another type than declared
        self.write_line(json.dumps(line, default=str))

    def write_line(self, text: str) -> None:
        """One line, whole and flushed; nothing once the reader has gone."""
        with self._lock:
            if self.reader_gone:
                return
            out = self._out or sys.stdout
            try:
                out.write(text + "\n")
                out.flush()
            except BrokenPipeError:
                self._stop_writing(out)

    def _stop_writing(self, out: TextIO) -> None:
        """The reader closed its end: what is still buffered goes to /dev/null (no error at exit), and stderr says
        why the lines stopped."""
        self.reader_gone = True
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError):  # not a file descriptor (a test's StringIO): nothing is buffered there
            pass
        sys.stderr.write("kpremote: stdout was closed: the event lines stop here; the run goes on, and is fetched "
                         "and recorded as usual\n")
        sys.stderr.flush()

    def for_run(self, host: str, task: str, run_id: Optional[str]):
        """on_event for one run's follow: each event streamed as that run's."""
        return lambda event: self.emit(host, task, run_id, event)

    def end(self, host: str, task: str, run_id: Optional[str], *, ended: bool, **outcome: Any) -> None:
        """The run's last line: how it ended for the client (status, exit code, headline, where its summary is), and
        `ended`: whether the run itself is over. It is not when the client stopped looking at a run that goes on
        (`inv run --detach`, a lost connection, `inv logs` without --follow of a running run: status `running`)."""
        self.emit(host, task, run_id, {"event": "end", "ended": ended, **outcome})


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
