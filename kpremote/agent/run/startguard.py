"""What may stop a start before its runner begins: a signal (a cancel, Ctrl-C, a hang-up) or a client that went
away, and the waiting for a GPU that tells the client (and state.json) what it waits for.

sshd sends no SIGHUP to a session without a terminal: a closed channel shows only as the far end of our stdout
going away, so the start watches that, and its waiting lines double as heartbeats.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .follow import HEARTBEAT_S, reader_gone
from ..lease import utc_now_iso
from ..nvml import GpuState, Snapshot
from ..protocol import StartCancelled
from .runstate import update_state

CLIENT_GONE = "its client went away before the run began"


class ClientWatch:
    """Whether the client that asked for this start is still there: our parent (sshd's session, or the local
    client) is alive and someone still reads our stdout. sshd sends no SIGHUP to a session without a terminal:
    a closed channel shows only as the far end of our stdout going away."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def gone(self) -> bool:
        return os.getppid() != self.parent or reader_gone(sys.stdout)


class StartGuard:
    """SIGTERM, SIGINT and SIGHUP during a start: raise StartCancelled while it waits; remember them while it
    records or spawns (checked before the runner is let go); ignore them once the runner has its lease."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.client = ClientWatch()
        self.requested: str | None = None
        self.raising = False
        self.handed_over = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StartGuard":
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.handed_over:
            return  # a run now: only `cancel` (by its process group) or its own end stops it
        reason = CLIENT_GONE if signum == signal.SIGHUP else f"cancelled ({signal.Signals(signum).name}) before it began"
        if self.raising:
            self.raising = False
            raise StartCancelled(reason)
        self.requested = self.requested or reason

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.requested:
            raise StartCancelled(self.requested)
        self.raising = True
        try:
            yield
        finally:
            self.raising = False

    def stop_reason(self) -> str | None:
        return self.requested or (CLIENT_GONE if self.client.gone() else None)

    def hand_over(self) -> None:
        self.handed_over = True


class Waiter:
    """While no GPU is free: stop if the client left, and tell the client (and state.json) what we wait for."""

    def __init__(self, run_dir: Path, announce: Callable[[dict[str, Any]], None] | None, client: ClientWatch) -> None:
        self.run_dir = run_dir
        self.announce = announce
        self.client = client
        self.first_seen: dict[tuple[str, str], str] = {}
        self.last: list[dict[str, Any]] | None = None
        self.last_sent = 0.0

    def tick(self, snap: Snapshot, verdicts: dict[str, str]) -> None:
        if self.client.gone():
            raise StartCancelled("its client went away while it waited for a GPU")
        gpus = [self._describe(g, verdicts[g.uuid]) for g in snap.gpus if g.uuid in verdicts]
        changed = gpus != self.last
        if changed:
            update_state(self.run_dir, waiting_for=gpus)
            self.last = gpus
        if self.announce and (changed or time.monotonic() - self.last_sent > HEARTBEAT_S):
            # Also a heartbeat: a write to a closed channel fails (BrokenPipeError), so a lost client is noticed.
            self.announce({"event": "waiting", "hostname": snap.hostname, "gpus": gpus})
            self.last_sent = time.monotonic()

    def _describe(self, gpu: GpuState, verdict: str) -> dict[str, Any]:
        kind = verdict.split(":", 1)[0]
        since = self.first_seen.setdefault((gpu.uuid, kind), utc_now_iso())
        holder = re.search(r" since (\S+)$", verdict) if kind == "leased" else None
        return {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "why": verdict,
                "since": holder.group(1) if holder else since}
