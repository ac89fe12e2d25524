"""The one JSON envelope of every command's --json: {"schema": "kpremote.<command>/N", ...}, one schema file each.

Every document is an object whose first key names its shape; docs/schemas/<command>.json describes it (validated in
tests/test_json_schemas.py). A document printed once is indented; under --watch each refresh is one line (JSON lines),
so `inv gpu-status --watch 2 --json | jq -c ...` reads one document per refresh. A run's events stream the same way,
one kpremote.run-event/1 line each (`inv run --json-stream`, `inv logs --json`: kpremote/runs/eventstream.py).

A command asked for JSON that refuses its input (a bad option, an unknown task or host, a task it will not run) still
prints one document: kpremote.error/1, {"command", "error", "exit_code"} (print_error), on one line, so a script
that reads stdout always has one object to read, whatever the exit code.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# The version of each command's document: raise it when a field changes meaning or goes away (adding one does not).
VERSIONS = {
    "hosts": 1, "gpu-status": 1, "sync": 1, "run": 1, "status": 1, "fetch-results": 1, "profile": 1, "check": 1,
    "baseline": 1, "compare": 1, "history": 1, "run-event": 1, "error": 1,
}
# Commands whose --json is a stream of lines, one object of this schema a line (kpremote/runs/eventstream.py).
STREAMS = {"logs": "run-event"}


def schema_name(command: str) -> str:
    return f"kpremote.{command}/{VERSIONS[command]}"


def document(command: str, body: dict[str, Any]) -> dict[str, Any]:
    """The envelope: the schema name first, then the command's own fields."""
    return {"schema": schema_name(command), **{k: v for k, v in body.items() if k != "schema"}}


def print_document(command: str, body: dict[str, Any], *, one_line: bool = False) -> None:
    """Print the command's document: indented, or on one line (a --watch refresh, JSON lines)."""
    text = json.dumps(document(command, body), default=str, indent=None if one_line else 1)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(command: str, message: str, exit_code: int) -> None:
    """The one document of a --json command that refused its input: why, and the exit code it ends with."""
    print_document("error", {"command": command, "error": message, "exit_code": exit_code}, one_line=True)


def json_asked(words: object) -> bool:
    """Whether a command's options (its keyword arguments, or the words of its command line) ask for JSON."""
    if isinstance(words, dict):
        return bool(words.get("json") or words.get("json_stream"))
    return any(word in ("--json", "--json-stream") for word in words)  # type: ignore[union-attr]
