"""The run's event stream: one JSON object per line in raw/events.jsonl, flushed as it happens.

The client follows this file (agent `follow`) to draw its live view, so every line must be complete JSON
and written in one call.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..results import CONTEXT_REGIMES, RowResult


class EventLog:
    """Appends events; safe to share between the runner and its workload processes (O_APPEND)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"t": round(time.time(), 6), "event": event, **fields}
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
