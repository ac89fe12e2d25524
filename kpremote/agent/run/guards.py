"""What guards a run while it runs: a watch for foreign use of the leased GPU, and a disk reserve for its record.

- ForeignWatch polls NVML while a row runs; any process beyond ours on the leased GPU makes that row invalid.
- DiskReserve sets a little room aside at the start, given back when the run writes its final record, so a run
  on a disk that fills up meanwhile can still say why it ended.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any
from dataclasses import dataclass
from pathlib import Path

WATCH_INTERVAL_S = 1.0
MEMORY_SETTLE_S = 3.0  # a killed judge's CUDA contexts leave NVML's count a moment after the processes are gone
def ours_per_row(pairs: int) -> int:
    """The judge and each pair's two side processes each hold a CUDA context (kept across clean rows)."""
    return 1 + 2 * pairs
RESERVE_BYTES = 256 * 1024  # room kept for the final record, in case the disk fills up during the run


class ForeignWatch:
    """Polls NVML while workloads run; any process beyond ours on the leased GPU makes the rows it overlaps invalid.

    Ours are recognised by pid: every process this runner started (its descendants, gathered at each look and
    remembered for the run, so a judge of an earlier row still tearing its CUDA context down is never foreign).
    Inside a container NVML reports host pids this /proc does not show: those are counted instead (while a row
    runs, ours are the judge and its side processes: ours_per_row). The memory check runs only when none of
    ours is alive (after a row whose judge ended).
    """

    def __init__(self, uuid: str, baseline_pids: set[int], baseline_memory_mib: int, memory_margin_mib: int) -> None:
        self.uuid = uuid
        self.baseline_pids = baseline_pids
        self.memory_limit_mib = baseline_memory_mib + memory_margin_mib
        self.seen: list[str] = []
        self.known_ours: set[int] = set()  # every pid of this runner's tree seen so far
        self._ours = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def row_started(self, ours: int) -> None:
        self.seen = []
        self._ours = ours
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def row_ended(self, ours: int = 0) -> str | None:
        """Stop polling, look once more (`ours`: how many of our processes are still alive, the judge and its
        sides when they go on to the next row), and say what foreign use was seen."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._ours = ours
        self._look()
        return "; ".join(dict.fromkeys(self.seen)) or None

    def _poll(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            self._look()

    def _look(self) -> None:
        from .. import nvml

        gpu = nvml.snapshot().find(self.uuid)
        if gpu is None:
            return
        from ..procfs import descendants, pid_exists

        self.known_ours.update(descendants(os.getpid()))
        others = [p for p in gpu.processes or [] if p.get("pid") not in self.baseline_pids | self.known_ours]
        unseen = [p for p in others if not pid_exists(int(p.get("pid") or 0))]  # host pids of a container's NVML
        if gpu.processes is None:  # a look that could not be taken is not a clean look
            self.seen.append("the GPU's process list was unreadable during the run")
        elif len(others) > len(unseen) or len(unseen) > self._ours:
            names = ", ".join(f"pid {p.get('pid')} {p.get('name') or '?'} {p.get('used_mib')} MiB" for p in others)
            self.seen.append(f"foreign process on the GPU during the run ({names})")
        if self._ours == 0 and gpu.memory_used_mib > self.memory_limit_mib:
            used = self._memory_settled(nvml)
            if used > self.memory_limit_mib:
                self.seen.append(f"GPU memory in use rose to {used} MiB with no worker of ours running")

    def _memory_settled(self, nvml: Any) -> int:
        """The GPU's memory in use once the driver had MEMORY_SETTLE_S to free what our ended processes held."""
        deadline = time.monotonic() + MEMORY_SETTLE_S
        while True:
            gpu = nvml.snapshot().find(self.uuid)
            used = gpu.memory_used_mib if gpu is not None else 0
            if used <= self.memory_limit_mib or time.monotonic() > deadline:
                return used
            time.sleep(0.1)


@dataclass
class DiskReserve:
    """RESERVE_BYTES set aside in one file, given back just before the final record is written."""

    path: Path

    def claim(self) -> None:
        """Best effort: a disk already full just gets no reserve."""
        try:
            with open(self.path, "wb") as f:
                f.write(bytes(RESERVE_BYTES))
        except OSError:
            self.give_back()

    def give_back(self) -> None:
        self.path.unlink(missing_ok=True)
