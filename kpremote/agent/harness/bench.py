"""What the rows of a run share in its judge (judge.py): the task, its adapter, the memory each side may see, and
the side processes, one pair per side pair the row is timed by (timing.side_pairs), started once and kept while rows
pass clean."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

from . import regimes, timing
from ..sandbox import side_scratch
from .cases import Sharing, per_side
from .correctness import ERROR, SideFailed
from .sideprocess import SideProcess
from .sidestarter import SideStarter
from ..task.taskspec import SIDES, TaskSpec, load_task


class Bench:
    """What the rows of a run share: the task, its adapter, the memory each side may see, and the side processes."""

    def __init__(self, job: dict[str, Any], starter: SideStarter | None = None) -> None:
        self.starter = starter  # forks the side processes (sidestarter.py); None: each by exec
        self.spec: TaskSpec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
        self.device = "cuda" if job["device"].startswith("cuda") else "cpu"
        self.run_dir = Path(job.get("run_dir") or ".")
        self.modules = job.get("modules") or {}
        self.mode = self.spec.timing.mode if self.device == "cuda" else "smoke"
        self.pairs: list[dict[str, SideProcess]] = []  # one process per side, timing.side_pairs(...) times over
        self.active = 0  # the pair the row's commands go to now (pair 0: correctness and everything but timing)
        self.adapter: Any = None
        self.sharing: Sharing | None = None
        self.rows_started = 0  # rows these side processes have begun (1 for the first row they serve)
        self.sandbox: dict[str, str] = {}  # what each side process entered, in its own words

    @property
    def sides(self) -> dict[str, SideProcess]:
        """The active pair's side processes (empty before start and after stop)."""
        return self.pairs[self.active] if self.pairs else {}

    def every_process(self) -> list[SideProcess]:
        return [process for pair in self.pairs for process in pair.values()]

    def processes(self) -> dict[str, Any]:
        """Which processes ran the row, for the record: a pid shared by two rows is one process serving both.
        The first pair is named by side, the others by side and number (candidate_2, ...)."""
        named = {(side if k == 0 else f"{side}_{k + 1}"): process.pid
                 for k, pair in enumerate(self.pairs) for side, process in pair.items()}
        return {"judge": os.getpid(), **named, "row_of_these": self.rows_started}

    def start(self) -> dict[str, Any] | None:
        """Every pair's side processes up with their modules imported; None, or the row's ERROR."""
        if self.pairs:
            self.rows_started += 1
            return None
        self.rows_started = 1
        from ..task.build import side_reads  # task/build.py is first imported here, as when sandbox/ held it

        env = dict(os.environ)
        self.active = 0
        self.pairs = []
        try:
            for k in range(timing.side_pairs(self.device, self.mode)):  # they import while we do
                self.pairs.append(per_side(k, lambda side: SideProcess(
                    side, {**env, **side_reads(self.run_dir, side, self.spec.root)}, self.run_dir,
                    side_scratch(self.run_dir, side), self.starter)))
        except SideFailed as exc:
            self.stop()
            return {"status": ERROR, "message": f"start: {exc.message}", "where": "import"}
        from ..task import build

        failed = self._import_all(build)
        if failed:
            self.stop()  # the next row tries afresh
        return failed

    def _import_all(self, build: Any) -> dict[str, Any] | None:
        try:
            self.adapter = build.import_adapter(self.spec)
        except Exception as exc:  # noqa: BLE001 - a task that does not import is this row's ERROR
            return {"status": ERROR, "message": f"import: bench/adapter.py: {type(exc).__name__}: {exc}",
                    "where": "import", "traceback": traceback.format_exc()}
        self.sharing = self.sharing or Sharing(self.device)
        sent = []
        try:  # every side imports its module at once: the start command to all, then the replies
            for process in self.every_process():
                process.send({"op": "start", "side": process.side, "task_dir": str(self.spec.root),
                              "device": self.device, "module_file": self.modules.get(process.side)})
                sent.append(process)
            for process in sent:
                reply = process.reply()
                self.sandbox[process.side] = str(reply.get("sandbox") or "unsandboxed: the side did not say")
        except SideFailed as exc:
            side = process.side
            return {"status": ERROR, "message": f"import: {side}: {exc.message}", "where": "import",
                    "traceback": exc.traceback_text}
        return None

    def stop(self) -> None:
        for process in self.every_process():
            process.stop()
        self.pairs = []
        self.active = 0

    def context(self, name: str) -> Any:
        """The contract.Context bench/context.py names `name` (regimes.load_context; ContextProblem if it cannot)."""
        return regimes.load_context(self.spec, name)
