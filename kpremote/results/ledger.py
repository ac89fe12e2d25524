"""The task's ledger, kernels/<task>/ledger.jsonl: one JSON line per run fetched or checked, appended, never rewritten.

What a line holds: which run (id, host, GPU), what was measured (the candidate's sha256, the baseline pin, the
harness version), what came out (headline with its interval, each row's verdict, the exit code) and the command line
that brought it. Several `inv` processes may append at once (an engineer's panes, an agent's parallel runs): each
line goes out in one os.write on a file opened with O_APPEND, under an exclusive flock, so lines never interleave.
The ledger is the user's local record: git ignores it and provenance leaves it out (agent/provenance.py).
Every line kpremote appends carries a "mac" over the rest of it (records.py), and a fetched run's line the sha256 of
its results.json (summary_sha256): only a line that verifies, pointing to a fetched run whose results.json is that
one, is trusted (measured_before, and inv history / inv compare through runstore.py). Lines of older versions stay
readable; they simply do not verify.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..agent.atomicfile import read_json_lines
from ..agent.filelock import held
from ..agent.protocol import PROFILE_MODE_PREFIX
from ..agent.results import CONTEXT_REGIMES, Headline, RowResult, RunResults
from ..errors import KpremoteError
from .records import line_verifies, record_problem, results_json, signed

LEDGER_NAME = "ledger.jsonl"
SCHEMA = "kpremote.ledger/1"


def ledger_path(task_dir: Path) -> Path:
    return Path(task_dir) / LEDGER_NAME


def record_run(task_dir: Path, summary_dir: Path, host: str, exit_code: Optional[int],
               command: Optional[list[str]] = None, kind: str = "run") -> dict[str, Any]:
    """Append the line for the run whose summary is summary_dir (its results.json, hashed into the line as read);
    returns the line's value. kind: run (a timing run), profile or check."""
    path = Path(summary_dir) / "results.json"
    try:
        data = path.read_bytes()
    except OSError:
        data = None
    try:
        results = RunResults.from_json(json.loads(data)) if data is not None else RunResults.from_json({})
    except ValueError:
        results = RunResults.from_json({})  # no readable summary: the line says what it knows, the rest null
    entry = {**ledger_entry(results, host, exit_code, command if command is not None else sys.argv), "kind": kind,
             "summary_sha256": hashlib.sha256(data).hexdigest() if data is not None else None}
    try:
        append_line(ledger_path(task_dir), entry)
    except OSError as exc:
        raise KpremoteError(f"{ledger_path(task_dir)}: the run's ledger line was not written: {exc}") from None
    return entry


def kind_of(state: dict[str, Any]) -> str:
    """A fetched run's kind from its record (state.json): a profile run's mode names its request."""
    return "profile" if str(state.get("mode") or "").startswith(PROFILE_MODE_PREFIX) else "run"


def as_typed(argv: list[str]) -> list[str]:
    """The command line as one would type it again: `inv ...` or `kpremote ...`, not the interpreter's path to
    invoke's __main__.py or to a venv's bin/inv."""
    words = [str(part) for part in argv]
    if not words:
        return words
    first = words[0].replace("\\", "/")
    if first.endswith("invoke/__main__.py") or first.rsplit("/", 1)[-1] in ("inv", "invoke"):
        return ["inv", *words[1:]]
    if first.endswith("kpremote/program.py") or first.rsplit("/", 1)[-1] == "kpremote":
        return ["kpremote", *words[1:]]
    return words


def ledger_entry(results: RunResults, host: str, exit_code: Optional[int], command: list[str]) -> dict[str, Any]:
    """One ledger line from a run's results (kpremote.results/1); a missing part is null, never guessed. A summary
    of another shape (a stand-in's "rows": 200) is not read at all: record_run writes what it knows, the rest null."""
    upstream = results.part("baseline_upstream")
    return {
        "schema": SCHEMA,
        "recorded": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_id": results.run_id,
        "host": host,
        "gpu": results.part("gpu").get("name") or None,
        "device": results.provenance.get("device"),
        "candidate_sha256": results.part("source").get("solution_sha256"),
        "baseline_sha256": results.part("source").get("baseline_sha256"),
        "baseline_pin": {key: upstream.get(key) for key in ("repo", "ref", "commit", "release")
                         if upstream.get(key) is not None} or None,
        "harness": results.part("harness").get("version"),
        "pinned": results.provenance.get("pinned"),
        "task_digest": results.task_digest,
        "task_state": results.task_state,
        "status": None if "status" in results.absent else results.status,
        "exit_code": exit_code if exit_code is not None else results.exit_code,
        "smoke": bool(results.smoke),
        "unsandboxed": results.unsandboxed,
        "headline": _headline(results.headline),
        "rows": {row.workload: _row(row) for row in results.rows},
        "command": shlex.join(as_typed(command)),
    }


def append_line(path: Path, value: dict[str, Any]) -> None:
    """value, signed (its "mac", records.py), as one JSON line at the end of path, whole: one write, O_APPEND, under
    an exclusive flock."""
    data = (json.dumps(signed(value), separators=(",", ":")) + "\n").encode()
    with held(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT) as descriptor:
        written = os.write(descriptor, data)
        if written != len(data):  # a full disk: say so rather than leave half a line unnoticed
            raise OSError(f"{path}: wrote {written} of {len(data)} bytes")


def read_ledger(task_dir: Path) -> list[dict[str, Any]]:
    """Every whole line of the task's ledger, oldest first; a line that does not parse is skipped."""
    return read_json_lines(ledger_path(task_dir))


def lines_by_run(task_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The ledger's newest line that verifies for each (host, run id): what inv history and inv compare add to a
    fetched run (the command line that brought it, its kind)."""
    return {(str(entry.get("host")), str(entry.get("run_id"))): entry for entry in read_ledger(task_dir)
            if line_verifies(entry)}


def _headline(head: Headline) -> Optional[dict[str, Any]]:
    """The headline's numbers and why; None for a summary that had none."""
    keep = ("geomean", "low", "high", "level", "n", "of", "verdicts", "label", "note", "regime", "regimes")
    written = head.to_json()
    return {key: written[key] for key in keep if key in written} or None


def _row(row: RowResult) -> dict[str, Any]:
    verdict = row.verdict
    line = {"status": row.status, "verdict": verdict.verdict if verdict else None,
            "speedup": verdict.speedup if verdict else None, "implausible": row.implausible, "invalid": row.invalid}
    if row.regimes is not None:  # a row with a context (harness 2.18): each context regime's verdict and speedup
        line["regimes"] = {regime: {"verdict": part.verdict.verdict if part.verdict else None,
                                    "speedup": part.verdict.speedup if part.verdict else None}
                           for regime in CONTEXT_REGIMES if (part := getattr(row.regimes, regime)) is not None}
    return line


def measured_before(task_dir: Path, host_names: list[str]) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(line, note): the newest trusted ledger line of a timing run that measured this very candidate against this
    very baseline (sha256 of each side's files), with this harness and these bench/ and task.toml, on one of these
    hosts, cleanly (exit 0, a headline) and on a GPU (a smoke run measures nothing), of the pinned task measured as
    the pinned task (a TASK EDITED or UNPINNED run never stands for another), or None; and a line to say when a newer
    line that claims as much is not trusted (its MAC does not verify, or it points to no fetched run whose
    results.json it recorded), else None."""
    from ..agent.harness import HARNESS_VERSION, pinned_inputs  # the runner's own rules for both stamps
    from ..agent.provenance import task_provenance

    source, pinned = task_provenance(task_dir), pinned_inputs(task_dir)
    if source["task_pin"] is None or source["task_pin"] != source["task_digest"]:
        return None, None
    lines = read_ledger(task_dir)
    note = None
    for entry in reversed(lines):
        if (entry.get("kind") == "run" and entry.get("host") in host_names and not entry.get("smoke")
                and entry.get("task_state") == "pinned" and entry.get("task_digest") == source["task_digest"]
                and entry.get("exit_code") == 0 and (entry.get("headline") or {}).get("geomean")
                and entry.get("harness") == HARNESS_VERSION and entry.get("pinned") == pinned and entry.get("run_id")
                and entry.get("candidate_sha256") == source["solution_sha256"]
                and entry.get("baseline_sha256") == source["baseline_sha256"]):
            host, run_id = str(entry["host"]), str(entry["run_id"])
            why = record_problem([entry], host, run_id, results_json(task_dir, host, run_id)) \
                if line_verifies(entry) else "its MAC does not verify: not a line this kpremote (2.17 on) wrote"
            if why is None:
                return entry, note
            note = note or (f"{Path(task_dir).name}: the ledger says run {run_id} on {host} measured this candidate, "
                            f"but that line is not trusted ({why}); it does not count as measured")
    return None, note


def measured_line(task: str, entry: dict[str, Any]) -> str:
    """`T: this candidate (sha 681fe9d53185) was already measured on H (GPU): 1.120x (...), run ID; ...`."""
    from ..views.run import headline_text

    gpu = f" ({entry['gpu']})" if entry.get("gpu") else ""
    return (f"{task}: this candidate (sha {str(entry.get('candidate_sha256'))[:12]}) was already measured on "
            f"{entry.get('host')}{gpu}: {headline_text(entry.get('headline'))}, run {entry.get('run_id')}; "
            "--again measures it again")
