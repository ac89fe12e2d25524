"""Watching a run from the host's side: its state file, its processes, and polling until something holds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable


def state_of(run_dir: Path) -> dict[str, Any]:
    """The run's state.json, or {} while it does not exist yet (a run folder appears before its state)."""
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             poll: float = 0.1) -> Any:
    """condition()'s first truthy value; fails the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not met within {timeout:g} s"
        time.sleep(poll)
    return value


def processes_mentioning(*words: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains every one of words."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(word in cmdline for word in words) and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie holds nothing and runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rfind(")") + 2:].startswith(("Z", "X"))
