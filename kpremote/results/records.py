"""The client's records that a later process cannot rewrite unnoticed: the client's secret key (outside every
workspace: $KPREMOTE_STATE_DIR, else $XDG_STATE_HOME/kpremote, else ~/.local/state/kpremote; file records.key), the
MAC every ledger line carries (HMAC-SHA256 over the canonical JSON of the line without its "mac"), and whether a
fetched run's results.json is the one its ledger line recorded. docs/trust.md, "Records after the run", has the
threat model.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional

from ..agent.atomicfile import read_or_create_key
from ..errors import KpremoteError

STATE_DIR_ENV = "KPREMOTE_STATE_DIR"
KEY_FILE = "records.key"
CHECK_HOST = "check"  # inv check's runs: kernels/T/results/check/<stamp>/summary/results.json
NO_LINE = "no verified ledger line"
EDITED = "record edited: results.json is not what was fetched"


def state_dir() -> Path:
    """Where the client keeps its own state, outside every project and workspace."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser()
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]).expanduser() / "kpremote"
    return Path.home() / ".local" / "state" / "kpremote"


def client_key() -> bytes:
    return _key(str(state_dir() / KEY_FILE))


@functools.lru_cache(maxsize=4)
def _key(path: str) -> bytes:
    try:
        return read_or_create_key(path)
    except (OSError, ValueError) as exc:
        raise KpremoteError(f"the client's records key {path} cannot be read or made: {exc}") from None


def _canonical(entry: dict[str, Any]) -> bytes:
    body = {key: value for key, value in entry.items() if key != "mac"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed(entry: dict[str, Any]) -> dict[str, Any]:
    """entry with its "mac": HMAC-SHA256(client key, the canonical JSON of every other field)."""
    body = {key: value for key, value in entry.items() if key != "mac"}
    return {**body, "mac": hmac.new(client_key(), _canonical(body), hashlib.sha256).hexdigest()}


def line_verifies(entry: dict[str, Any]) -> bool:
    """Whether a ledger line is one this client wrote, unchanged since (a line of an older kpremote has no mac)."""
    mac = entry.get("mac")
    if not isinstance(mac, str):
        return False
    return hmac.compare_digest(hmac.new(client_key(), _canonical(entry), hashlib.sha256).hexdigest(), mac)


def results_json(task_dir: Path, host: str, run_id: str) -> Path:
    """Where a fetched run's results.json lies under kernels/T/results/ (a check's under its summary/)."""
    folder = Path(task_dir) / "results" / host / run_id
    return folder / "summary" / "results.json" if host == CHECK_HOST else folder / "results.json"


def file_sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def record_problem(lines: Iterable[dict[str, Any]], host: str, run_id: str, results: Path) -> Optional[str]:
    """Why the fetched run (host, run_id) with this results.json does not verify, or None when it does: its
    results.json must hash to the summary_sha256 of a ledger line of that run whose MAC verifies."""
    recorded = {line.get("summary_sha256") for line in lines
                if line.get("host") == host and line.get("run_id") == run_id and line.get("summary_sha256")
                and line_verifies(line)}
    if not recorded:
        return NO_LINE
    got = file_sha256(results)
    if got is None:
        return f"no fetched results.json at {results}"
    return None if got in recorded else EDITED
