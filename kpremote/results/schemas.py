"""docs/schemas/ drawn from the records: the schema of each document the agent writes through a record (results.json:
kpremote/agent/results.py's RunResults; state.json: its RunState; run-event.json: a run's event line,
kpremote/runs/eventstream.py's StreamEvent over kpremote/agent/run/events.py's RunEvent; sync-header.json: a sync
stream's header line, results.py's SyncHeader) made from the records' fields and types (record.json_schema), one source.

    python -m kpremote.results.schemas            writes them
    python -m kpremote.results.schemas --check    says which differ from what is committed (exit 1), writes nothing

tests/unit/test_generated_schemas.py fails when a record and its committed schema differ. The schemas of the other
documents (each command's --json) are hand-written and stay so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from ..agent.record import json_schema
from ..agent.results import RESULTS_SCHEMA, RunResults, RunState, SyncHeader
from ..cli.jsonout import schema_name
from ..runs.eventstream import EVENT_SCHEMA, StreamEvent

__all__ = ["GENERATED", "SCHEMAS", "draw", "main"]

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


RESULTS_NOTE = ("One record per run: provenance, one row per workload, the headline. Generated from the records "
                "(python -m kpremote.results.schemas): every record is closed, this harness writes only the keys its "
                "records declare; a reader keeps a newer harness's keys apart (record.newer_fields). A field changes "
                "meaning or goes away only with a new schema version.")
EVENT_NOTE = ("JSON lines, one event each, in the order they happened (kpremote/runs/eventstream.py). Before the run: "
              "connecting, syncing, created, waiting, submitted (Slurm); started; then the agent's own events (phase, "
              "build, provenance, warning, error, row, audit, profile, headline, done, slurm); last, end (every "
              "stream's last line; its `ended` says whether the run is over). Generated from the records (python -m "
              "kpremote.results.schemas): every field an event kind shares is declared and typed; the keys of a kind "
              "that carries a whole document (provenance, audit, profile, slurm, the rest of a headline) and an event "
              "kind not listed here may appear: read the ones you know. inv run --json-stream ends with the "
              "kpremote.run/1 document on one line.")


def _results() -> dict[str, Any]:
    parts = json.loads((SCHEMAS / "parts" / "results.json").read_text(encoding="utf-8"))["$defs"]
    drawn = json_schema(RunResults, parts)
    drawn["properties"]["schema"] = {"const": RESULTS_SCHEMA, "description": "the record's shape and version"}
    return _document("results", drawn, "a run's summary/results.json (kpremote/agent/results.py RunResults, written by "
                     "report.py)", description=RESULTS_NOTE)


def _state() -> dict[str, Any]:
    drawn = json_schema(RunState, {})
    return _document("state", drawn, "a run's state.json on its host (kpremote/agent/results.py RunState, written by "
                     "run/runstate.py)")


def _run_event() -> dict[str, Any]:
    drawn = json_schema(StreamEvent, {})
    drawn["properties"]["schema"] = {"const": schema_name(EVENT_SCHEMA), "description": "the line's shape and "
                                     "version; the stream's last line under inv run --json-stream is kpremote.run/1 "
                                     "instead"}
    # open: the keys of the kinds that carry a whole document (provenance, audit, ...) and a newer agent's kinds
    drawn["additionalProperties"] = True
    return _document("run-event", drawn, "one line of inv run --json-stream and inv logs --json: one event of one run "
                     "(kpremote/runs/eventstream.py StreamEvent, the agent's kpremote/agent/run/events.py RunEvent)",
                     description=EVENT_NOTE)


def _sync_header() -> dict[str, Any]:
    drawn = json_schema(SyncHeader, {})
    return _document("sync-header", drawn, "a sync stream's first line (kpremote/agent/results.py SyncHeader: the "
                     "client's runs/sync.py writes it, the agent's sync.py reads it)")


def _document(name: str, drawn: dict[str, Any], title: str, **more: Any) -> dict[str, Any]:
    """A drawn schema as its file holds it: its dialect, id and title first, then what the record drew."""
    return {"$schema": drawn.pop("$schema"), "$id": f"https://kpremote.invalid/schemas/{name}.json", "title": title,
            **drawn, **more}


GENERATED: dict[str, Callable[[], dict[str, Any]]] = {"results": _results, "state": _state, "run-event": _run_event,
                                                      "sync-header": _sync_header}
"""Schema file name (docs/schemas/<name>.json) -> how it is drawn from its records."""


def draw(name: str) -> str:
    """The schema file's text, as committed."""
    return json.dumps(GENERATED[name](), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python -m kpremote.results.schemas [--check]", file=sys.stderr)
        return 2
    stale = []
    for name in GENERATED:
        path, text = SCHEMAS / f"{name}.json", draw(name)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path}: {'differs from its records' if check else 'written from its records'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
