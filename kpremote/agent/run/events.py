"""The run's event stream: one JSON object per line in raw/events.jsonl, flushed as it happens, each line a
`RunEvent` (checked against its declared types as it is written; the client reads each line it follows with
RunEvent.from_json).

The client follows this file (agent `follow`) to draw its live view, so every line must be complete JSON
and written in one call.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..record import Record, absent_fields, newer_fields, typed
from ..results import CONTEXT_REGIMES, RowResult

__all__ = ["EventLog", "RunEvent", "complete_lines", "kind_rule", "read_events", "row_event"]


def kind_rule(name: str, required: list[str], **properties: Any) -> dict[str, Any]:
    """An event kind's own rule in the schema: the fields it always carries, and what they hold for this kind."""
    then: dict[str, Any] = {"required": required, **({"properties": properties} if properties else {})}
    return {"if": {"properties": {"event": {"const": name}}, "required": ["event"]}, "then": then}


_REGIME_WORDS = {"type": "object", "properties": {"verdict": {"type": ["string", "null"]},
                                                  "speedup": {"type": ["number", "null"]}}}


@dataclass
class RunEvent(Record):
    """One line of a run's raw/events.jsonl (EventLog.emit), and of the agent's follow stream that carries them to
    the client (run/follow.py adds heartbeat and end). Every field an event kind shares is declared and typed here;
    the keys only one kind carries as a whole document (provenance's, audit's, profile's, slurm's) ride in `newer`,
    unchecked, as a newer agent's kinds do: a reader reads the kinds it knows."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["event"], "allOf": [
        kind_rule("phase", ["phase"]), kind_rule("build", ["side", "ok"]), kind_rule("warning", ["message"]),
        kind_rule("error", ["message"]), kind_rule("row", ["workload", "i", "n", "status", "verdict", "speedup"],
                                                   regimes={"additionalProperties": _REGIME_WORDS}),
        kind_rule("done", ["status", "exit_code"])]}

    t: float | None = None  # when, in seconds since the epoch: the agent's clock for its events (every line but a
    # heartbeat), the client's for the stream's own kinds
    event: str = "?"  # what happened: phase, build, provenance, warning, error, row, audit, profile, headline, done,
    # slurm; heartbeat and end on the follow stream; another kind a newer agent adds
    phase: str | None = None  # validate, lease, build, workloads, workload, audit, report, ...
    workload: str | None = None
    i: int | None = None  # this workload's number, from 1
    n: int | None = None  # how many workloads the run has (headline: production rows counted)
    side: str | None = None  # baseline or candidate (build, profile)
    ok: bool | None = None  # whether the side built
    seconds: float | None = None
    log: str | None = None
    error: str | None = None  # build: why the side did not build; the client's end: why the run did not end well
    status: str | None = None  # row: PASSED, INCORRECT, ...; done: passed, failed, error, cancelled
    exit_code: int | None = None
    message: str | None = None
    production: bool | None = None
    speedup: float | None = None
    verdict: str | None = typed(enum=["FASTER", "SAME", "SLOWER", None])  # from the speedup's 95 % interval; null
    # for a row not timed and in a smoke run (its timings mean nothing)
    speedup_low: float | None = None
    speedup_high: float | None = None
    mode: str | None = None
    invalid: str | None = None
    implausible: str | None = None
    label: str | None = None
    baseline_n: int | None = None
    baseline_median_us: float | None = None
    baseline_p10_us: float | None = None
    baseline_p90_us: float | None = None
    candidate_n: int | None = None
    candidate_median_us: float | None = None
    candidate_p10_us: float | None = None
    candidate_p90_us: float | None = None
    regimes: dict[str, Any] | None = None  # row (harness 2.18 on, a row that names a context): each regime's
    # verdict and speedup; headline: each regime's geomean
    context_note: str | None = None  # the row's one line when it is FASTER alone but not in its context
    geomean: float | None = None  # headline: the rest of its fields are results.json's Headline
    low: float | None = None
    high: float | None = None
    state: dict[str, Any] | None = None  # end (follow stream): the run's state.json (RunState) when it ended
    offset: int | None = None  # end: the byte offset in events.jsonl the stream reached
    summary: bool | None = None  # end: the summary tar follows this line
    summary_refused: str | None = None  # end: why the summary asked for does not follow
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


class EventLog:
    """Appends events; safe to share between the runner and its workload processes (O_APPEND)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"t": round(time.time(), 6), "event": event, **fields}
        RunEvent.from_json(record, f"{event} event")  # RecordError: a writer's field of another type than declared
        line = (json.dumps(record, default=str, allow_nan=False) + "\n").encode()
        os.write(self._fd, line)  # one write per line: readers never see half a line from us
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The events of the complete lines from byte offset on, and the offset just past the last complete line."""
    data, end = complete_lines(path, offset)
    return [json.loads(line) for line in data.splitlines() if line.strip()], end


def complete_lines(path: Path, offset: int = 0) -> tuple[bytes, int]:
    """The bytes of the complete lines from byte offset on (a line still being written is left for later), and the
    offset just past them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b"", offset
    end = data.rfind(b"\n") + 1
    return data[:end], offset + end


def row_event(row: RowResult, number: int, total: int) -> dict[str, Any]:
    """The "row" event's fields (docs/schemas/run-event.json): the row as the live view and run_log.md show it."""
    timing = row.timing
    # the row's FASTER / SAME / SLOWER and its interval, as results.md shows them: a smoke run's mean nothing
    verdict = row.verdict if not row.smoke else None
    event = {"workload": row.workload, "i": number, "n": total, "status": row.status,
             "production": row.production, "message": row.message, "speedup": row.speedup,
             "verdict": verdict.verdict if verdict else None, "speedup_low": verdict.low if verdict else None,
             "speedup_high": verdict.high if verdict else None, "mode": timing.mode if timing else None,
             "invalid": row.invalid, "implausible": row.implausible, "label": row.label, "seconds": row.seconds}
    for side in ("baseline", "candidate"):
        summary = getattr(timing, side) if timing else None
        for key in ("n", "median", "p10", "p90"):
            event[f"{side}_{key}" + ("_us" if key != "n" else "")] = getattr(summary, key) if summary else None
    if row.regimes is not None:  # a row with a context: each regime's word, as the cold one's above
        event["regimes"] = {regime: {"verdict": None if row.smoke else row.regime_word(regime),
                                     "speedup": part.speedup if (part := row.regime(regime)) else None}
                            for regime in CONTEXT_REGIMES}
        event["context_note"] = None if row.smoke else row.context_note
    return event
