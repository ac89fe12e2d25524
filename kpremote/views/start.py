"""What `inv run` and `inv profile` show while a run starts: connecting, syncing (files, bytes), starting, waiting
for a GPU; on a Slurm cluster, the job id once sbatch took it (then the run's line shows Slurm's reason while pending).

On a terminal the task's line in the live run view says it, with the seconds so far, until the run's own live line
takes its place; elsewhere (a pipe, CI, --detach) one plain line per phase on stderr; with --json none of it; with
--json-stream each progress event as a JSON line on stdout (kpremote/runs/eventstream.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from .run import RunView

if TYPE_CHECKING:
    from ..runs.eventstream import EventStream


class StartView:
    """One task's start on screen, through every host a group tries: `on(host)` is runs.start_run's on_progress.

    Used as a `with` block around the start: leaving it takes the starting line away unless a run's line took
    its place (RunView.not_started).
    """

    def __init__(self, live: RunView, key: str, task: str, *, silent: bool,
                 stream: Optional["EventStream"] = None) -> None:
        self.live = live
        self.key = key
        self.task = task
        self.silent = silent  # --json: stdout is the JSON document, and nothing else is said about the start
        self.stream = stream  # --json-stream: each progress event as a line
        self._last_line: Optional[str] = None

    def __enter__(self) -> "StartView":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.not_started(self.key)

    def on(self, host: str) -> Callable[[dict[str, Any]], None]:
        """The on_progress of a start on host."""
        return lambda event: self.show(host, event)

    def show(self, host: str, event: dict[str, Any]) -> None:
        if self.stream is not None:
            self.stream.emit(host, self.task, event.get("run_id"), event)
        if event.get("event") == "waiting":
            self.say(waiting_line(host, event))
        phase = phase_text(event)
        if self.silent or phase is None:
            return
        if self.live.drawing:
            self.live.starting(self.key, host, self.task, phase)
        elif event.get("event") != "waiting":  # its own line, above, says more
            self._say_once(f"{host}: {self.task}: {phase}")

    def say(self, text: Optional[str]) -> None:
        """A line about this start, whatever the mode (--json too: on stderr), never tearing the live lines."""
        if text:
            self.live.say(text)

    def _say_once(self, line: str) -> None:
        if line != self._last_line:
            self._last_line = line
            self.say(line)


PHASES = {"connecting": "connecting", "created": "starting", "waiting": "waiting for a GPU"}


def phase_text(event: dict[str, Any]) -> Optional[str]:
    """`connecting`, `syncing 12 files (3.4 MiB)`, `starting`, `waiting for a GPU`: a start's progress in words."""
    if event.get("event") == "submitted":
        return f"submitted as Slurm job {event.get('job_id')}"
    if event.get("event") != "syncing":
        return PHASES.get(str(event.get("event")))
    files = int(event.get("files") or 0)
    if event.get("retry"):  # the first request's files were not what the workspace needed: say what it did need
        return "syncing: the workspace had them already (synced from elsewhere)" if not files else \
            f"syncing {_files(files, event)} instead: the workspace was not as this client last left it"
    return f"syncing {_files(files, event)}" if files else "syncing: nothing changed"


def _files(files: int, event: dict[str, Any]) -> str:
    return f"{files} file{'s' if files != 1 else ''} ({size_text(int(event.get('bytes') or 0))})"


def size_text(size: float) -> str:
    """812 B, 4.1 KiB, 3.4 MiB, 1.2 GiB: a size as people read it."""
    if size < 1024:
        return f"{int(size)} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


_last_wait: dict[str, list] = {}


def waiting_line(host: str, event: dict[str, Any]) -> Optional[str]:
    """What a --wait start waits for, said once per change: which GPUs, busy with what or leased by whom, since when."""
    gpus = event.get("gpus") or []
    if _last_wait.get(host) == gpus:
        return None
    _last_wait[host] = gpus
    described = "; ".join(f"GPU {g.get('index')} {g.get('why')}" + ("" if " since " in str(g.get("why")) else
                          f" (since {g.get('since')})") for g in gpus)
    return f"{host}: waiting for a GPU (Ctrl-C cancels the wait): {described or 'no GPU fits'}"
