"""`inv check`: the agent run right here on the CPU (Triton's interpreter), its rows shown as they come on stdout,
its summary shown at the end, each check in a results folder of its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from rich.text import Text

from ..agent.run.events import RunEvent
from ..views import terminal
from ..views.results import summary_markdown
from ..views.run import event_line, row_pieces
from ..results.ledger import record_run
from ..task.taskdir import TaskDir

# The runner's own progress lines on its stderr ("[1/2] w: PASSED 1.02x"): shown from the events instead.
RUNNER_ROW_LINE = re.compile(r"^\[\d+/\d+\] ")
POLL_S = 0.2
NOT_CHECKED = "NOT CHECKED"  # a row's status when it could not be checked here (the judge's word, results.json)
NOT_CHECKED_HERE = "not checked"
"""The check's status when no row could be checked on this CPU: said, exit 0, never passed (run it on a GPU)."""


def new_check_dir(parent: Path) -> Path:
    """parent/<YYYYmmdd-HHMMSS>, or -2, -3 ... when a check of the same second has it: made here, so two checks
    started together never share a folder."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 1000):
        folder = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise RuntimeError(f"no free results folder for {stamp} under {parent}")


def smoke_check(task: TaskDir, workloads: Optional[str], quiet: bool = False) -> dict[str, Any]:
    """Run the task's agent on this machine; returns the check's document (docs/schemas/check.json).
    Unless quiet, each row's verdict is printed as it comes and the results table at the end."""
    run_dir = new_check_dir(task.results / "check")
    argv = [sys.executable, "-m", "kpremote.agent.run.runner", "--task-dir", str(task.path),
            "--run-dir", str(run_dir), "--device", "cpu"]
    if workloads:
        argv += ["--workloads", workloads]
    if not quiet:
        terminal.console.print(Text.assemble(("smoke: timings are not meaningful", "bold yellow"),
                                             f" — {task.name} on the CPU through Triton's interpreter"))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    relay = threading.Thread(target=_relay_stderr, args=(process.stderr,), daemon=True)
    relay.start()
    show = (lambda event: None) if quiet else _show_event
    follow_events(run_dir / "raw" / "events.jsonl", process.poll, show)
    final = _last_json_line(process.stdout.read())
    code = process.wait()
    relay.join(timeout=5)
    summary = run_dir / "summary"
    results_path = summary / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    record_run(task.path, summary, "check", code, kind="check")
    status, message = final.get("status", "error"), final.get("message")
    why_not = not_checked_here(results)
    if why_not:
        status, message = NOT_CHECKED_HERE, f"not checked on this CPU: {why_not}; run it on a GPU host: inv run --host HOST --task {task.name}"
    if not quiet:
        if (summary / "results.md").is_file():
            terminal.show(summary_markdown(summary / "results.md"))
        terminal.say(f"summary: {summary}")
        if why_not:
            terminal.say(f"{task.name}: {message}", style="bold yellow")
    return {"task": task.name, "run_dir": str(run_dir.resolve()), "summary_dir": str(summary.resolve()), "exit_code": code,
            "status": status, "message": message, "headline": final.get("headline"), "results": results}


def not_checked_here(results: Optional[dict[str, Any]]) -> Optional[str]:
    """Why nothing of the task could be checked on this CPU (every row NOT CHECKED: a side that needs a GPU, or the
    task's [task] gpu_only), or None: then the check's verdict is the runner's."""
    rows = (results or {}).get("rows") or []
    if not rows or any(row.get("status") != NOT_CHECKED for row in rows):
        return None
    return str(rows[0].get("message") or "a side needs a GPU")


def follow_events(path: Path, finished: Callable[[], Optional[int]], on_event: Callable[[dict], None]) -> None:
    """Hand each new line of events.jsonl to on_event until the process has ended and the file is read through."""
    offset = 0
    pending = b""
    while True:
        done = finished() is not None  # asked before reading: what the runner wrote before it ended is read below
        if path.is_file():
            with path.open("rb") as stream:
                stream.seek(offset)
                chunk = stream.read()
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    try:
                        event = RunEvent.from_json(json.loads(line), "event")  # as a remote run's (remote.py)
                    except ValueError:  # RecordError too: a line of another shape is not shown
                        continue
                    on_event(event.to_json())
        if done:
            return
        time.sleep(POLL_S)


def _show_event(event: dict) -> None:
    if event.get("event") == "row":
        terminal.console.print(Text.assemble(*row_pieces(event)))
    elif event.get("event") in ("error", "warning"):
        terminal.console.print(event_line(event))


def _relay_stderr(stream) -> None:
    """The runner's stderr, less its row lines (shown from the events on stdout): errors still reach the user."""
    for line in stream:
        if not RUNNER_ROW_LINE.match(line):
            sys.stderr.write(line)
            sys.stderr.flush()


def _last_json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}
