"""A run's summary sealed by its host, so that a later edit of the run folder is seen before the summary leaves.

The host's secret key lies outside every task workspace and run folder (ROOT/keys/records.key, `keys_dir`: the one
path the sandbox must deny reads of). When the runner has written summary/, `seal_summary` records the sha256 of
results.json and its MAC, HMAC-SHA256(key, task, run id, sha256), in state.json (and the done event, by the runner),
and appends the same to an append-only index outside the run folder (ROOT/index/<task>.jsonl). `verified_results`,
which pack-summary and follow --with-summary call before they send anything, checks that state.json and the index
agree, that the MAC verifies and that results.json's bytes hash to it; it returns those very bytes, which are what
is sent. docs/trust.md, "Records after the run", has the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from ..atomicfile import read_json_lines, read_or_create_key
from ..lease import utc_now_iso
from ..protocol import SummaryUnverified
from .runpaths import validate_task_name

KEYS = "keys"
KEY_FILE = "records.key"
INDEX = "index"
MAC_SCHEMA = "kpremote.summary-mac/1"


def keys_dir(root: Path) -> Path:
    """ROOT/keys: the host's secret keys, read by the runner and the agent only; no sandboxed process may read it."""
    return Path(root) / KEYS


def index_path(root: Path, task: str) -> Path:
    return Path(root) / INDEX / f"{validate_task_name(task)}.jsonl"


def place_of(run_dir: Path) -> tuple[Path, str] | None:
    """(ROOT, task) of a run folder ROOT/tasks/<task>/runs/<id>; None for a run folder elsewhere (inv check's, whose
    record is the client's ledger line)."""
    run_dir = Path(run_dir)
    parents = run_dir.parents
    if len(parents) >= 4 and parents[0].name == "runs" and parents[2].name == "tasks":
        return parents[3], parents[1].name
    return None


def summary_mac(key: bytes, task: str, run_id: str, sha256: str) -> str:
    """HMAC-SHA256 over the canonical string of what the seal vouches for."""
    message = json.dumps([MAC_SCHEMA, task, run_id, sha256], separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal_summary(run_dir: Path) -> dict[str, Any]:
    """What the runner records once summary/ is written: summary_sha256, and for a run under a root summary_mac,
    appended to the root's index first."""
    digest = hashlib.sha256((Path(run_dir) / "summary" / "results.json").read_bytes()).hexdigest()
    place = place_of(run_dir)
    if place is None:
        return {"summary_sha256": digest}
    root, task = place
    mac = summary_mac(read_or_create_key(keys_dir(root) / KEY_FILE), task, Path(run_dir).name, digest)
    _append(index_path(root, task), {"run_id": Path(run_dir).name, "summary_sha256": digest, "summary_mac": mac,
                                      "sealed": utc_now_iso()})
    return {"summary_sha256": digest, "summary_mac": mac}


def _append(path: Path, value: dict[str, Any]) -> None:
    """value as one JSON line at the end of path, in one write on a file opened O_APPEND."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = (json.dumps(value, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"{path}: the index line was cut short")
    finally:
        os.close(fd)


def verified_results(run_dir: Path, state: dict[str, Any]) -> bytes:
    """summary/results.json's bytes, once this host's sealed record vouches for them; else SummaryUnverified, naming
    the run and what did not verify."""
    run_dir = Path(run_dir)
    task = (place_of(run_dir) or (None, "?"))[1]

    def refuse(what: str) -> SummaryUnverified:
        return SummaryUnverified(f"run {run_dir.name} of {task}: {what}; its summary is not sent")

    want, mac = state.get("summary_sha256"), state.get("summary_mac")
    if not want or not mac:
        missing = "summary hash" if not want else "summary MAC"
        raise refuse(f"its runner recorded no {missing} (a runner before harness 2.17, or one that ended before it "
                     "wrote a summary)")
    place = place_of(run_dir)
    if place is None:
        raise refuse("its folder is not under a kpremote root, where its host's key is")
    root, task = place
    try:
        key = read_or_create_key(keys_dir(root) / KEY_FILE)
    except (OSError, ValueError) as exc:
        raise refuse(f"this host's key cannot be read: {exc}") from None
    if not hmac.compare_digest(summary_mac(key, task, run_dir.name, str(want)), str(mac)):
        raise refuse("the summary MAC in its state.json does not verify with this host's key")
    sealed = [line for line in read_json_lines(index_path(root, task)) if line.get("run_id") == run_dir.name]
    if not sealed:
        raise refuse(f"this host's index ({index_path(root, task)}) has no line for it")
    if any((line.get("summary_sha256"), line.get("summary_mac")) != (want, mac) for line in sealed):
        raise refuse("this host's index and its state.json disagree on its summary")
    try:
        data = (run_dir / "summary" / "results.json").read_bytes()
    except OSError:
        raise refuse("its summary/results.json is missing") from None
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise refuse(f"its summary/results.json has sha256 {got}, but its runner sealed {want}")
    return data
