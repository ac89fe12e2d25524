"""docs/schemas/ drawn from the records: the schema of each document the agent writes through a record (results.json:
kpremote/agent/results.py's RunResults; state.json: its RunState) made from the records' fields and types (record.json_schema), one source.

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
from ..agent.results import RESULTS_SCHEMA, RunResults, RunState

__all__ = ["GENERATED", "SCHEMAS", "draw", "main"]

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _results() -> dict[str, Any]:
    parts = json.loads((SCHEMAS / "parts" / "results.json").read_text(encoding="utf-8"))["$defs"]
    drawn = json_schema(RunResults, parts)
    drawn["properties"]["schema"] = {"const": RESULTS_SCHEMA, "description": "the record's shape and version"}
    return {"$schema": drawn.pop("$schema"), "$id": "https://kpremote.invalid/schemas/results.json",
            "title": "a run's summary/results.json (kpremote/agent/results.py RunResults, written by report.py)",
            **drawn,
            "description": "One record per run: provenance, one row per workload, the headline. Generated from the "
                           "records (python -m kpremote.results.schemas): every record is closed, this harness "
                           "writes only the keys its records declare; a reader keeps a newer harness's keys apart "
                           "(record.newer_fields). A field changes meaning or goes away only with a new schema "
                           "version."}


def _state() -> dict[str, Any]:
    drawn = json_schema(RunState, {})
    return {"$schema": drawn.pop("$schema"), "$id": "https://kpremote.invalid/schemas/state.json",
            "title": "a run's state.json on its host (kpremote/agent/results.py RunState, written by run/runstate.py)",
            **drawn}


GENERATED: dict[str, Callable[[], dict[str, Any]]] = {"results": _results, "state": _state}
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
