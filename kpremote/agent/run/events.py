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
