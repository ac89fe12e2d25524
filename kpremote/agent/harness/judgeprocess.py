"""The runner's end of a run's judge: one judge process (and its two side processes) for row after row.

Starting a judge and its sides costs three interpreters, three torch imports and three CUDA contexts, about 8 s a
row on an H200 (benchmarks/README.md, "the cost of the trusted harness"); a run's rows therefore share them. What
a row shares with the row before it is only those processes: the judge builds each row's cases afresh from the
run's secret, hands them to the sides, and drops them when the row ends.

The rule that keeps sharing safe: a judge is kept only after a row that PASSED with nothing invalid. Any other row
(failed, timed out, crashed, a side that started threads, a foreign process) ends the judge with everything it
started, and the next row gets fresh processes, as every row did before processes were shared.

Each row is held to its own limits: STARTUP_LIMIT_S until the judge says the row's sides are ready (interpreter,
torch and the task's import, for a fresh judge), then the workload's timeout. A row over a limit, or a judge that
dies without its result, costs that row only. The job and the run's secret go down the judge's stdin; its ready
lines and results come up a pipe that no process it starts inherits (children.PipeReader).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..run.children import (EXIT_GRACE_S, POLL_S, STARTUP_LIMIT_S, PipeReader, WorkerOutcome, crash_description,
                       kill_strays_noted, wait_or_kill)
from .correctness import PASSED
from .rowlog import CappedLog
from ..procfs import kill_tree, namespace_pids


def keeps_its_judge(result: dict[str, Any] | None) -> bool:
    """Whether the processes that ran this row may run the next: only after a clean pass."""
    return bool(result) and result.get("status") == PASSED and not result.get("invalid") and not result.get("implausible")


class JudgeProcess:
    """Rows of one run, each sent to the run's judge and held to its limits; started on the first row."""

    def __init__(self, env: dict[str, str], cwd: Path, run_dir: Path, secret: bytes,
                 namespace: bool = False) -> None:
        self.env = env
        self.namespace = namespace  # the judge as process 1 of a PID namespace of its own (sandbox/namespace.py)
        self.cwd = cwd
        self.run_dir = run_dir
        self.secret = secret
        self.child: subprocess.Popen | None = None
        self.pipe: PipeReader | None = None

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def row(self, job: dict[str, Any], log_path: Path, limit_s: float, ready_path: Path | None = None) -> WorkerOutcome:
        """Send one row's job, wait for its result within the limits; the judge is ended unless the row passed."""
        started = time.monotonic()
        log = CappedLog(log_path)
        try:
            if self.child is None:
                self._start(log_path)
            self._send({"job": {**job, "log": str(log_path)}})
            outcome = self._await_result(started, limit_s, log_path, ready_path, log)
        except BaseException:  # Cancelled above all: no judge outlives the runner's decision to stop
            self.close(log_path, kill=True)
            log.end()
            raise
        if not keeps_its_judge(outcome.result):
            self.close(log_path, kill=True)  # nothing of it is wanted: no wait for torch's teardown
        outcome.log_dropped_bytes = log.end()
        return outcome

    def close(self, log_path: Path | None = None, *, kill: bool = False) -> None:
        """End the judge: asked (its stdin closes: it stops its sides and exits), or killed with all it started."""
        child, self.child, pipe, self.pipe = self.child, None, self.pipe, None
        if child is None:
            return
        if kill:
            if child.poll() is None:
                kill_tree(child)
        else:
            try:
                child.stdin.close()
            except OSError:
                pass
            wait_or_kill(child, EXIT_GRACE_S)
        if pipe is not None:
            pipe.finish()
        kill_strays_noted(log_path or self.run_dir / "raw" / "judge.log")

    # ---------------------------------------------------------------- internals

    def _start(self, log_path: Path) -> None:
        read_end, write_end = os.pipe()
        try:
            with open(log_path, "ab") as log:  # the judge moves its output to each row's log itself
                judge = [sys.executable, "-m", "kpremote.agent.harness.judge", "--result-fd", str(write_end),
                         "--run-dir", str(self.run_dir)]
                launcher = [sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--"] if self.namespace else []
                self.child = subprocess.Popen(
                    launcher + judge,
                    stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, pass_fds=(write_end,),
                    stdin=subprocess.PIPE)
        finally:
            os.close(write_end)
        self.pipe = PipeReader(read_end)
        self._send({"secret": self.secret.hex()})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.child.stdin.write((json.dumps(message) + "\n").encode())
            self.child.stdin.flush()
        except OSError:
            pass  # a judge that died is reported by its exit

    def _await_result(self, started: float, limit_s: float, log_path: Path, ready_path: Path | None,
                      log: CappedLog) -> WorkerOutcome:
        ready_at: float | None = None
        while True:
            line = self._next_line()
            log.hold()  # at each poll: a row that prints without end never fills the disk
            now = time.monotonic()
            if line is not None and "ready" in line and ready_at is None:
                ready_at = now
                if ready_path:
                    ready_path.touch()
            if line is not None and "result" in line:
                result = line["result"] if isinstance(line["result"], dict) else None
                if result is not None:
                    self._name_by_host_pid(result)
                    return WorkerOutcome(result, now - started, piped=line)
            if line is None and self.child.poll() is not None and self.pipe.closed.is_set() and self.pipe.arrived.empty():
                returncode = self.child.returncode
                return WorkerOutcome(None, now - started, crashed=crash_description(returncode, log_path),
                                     returncode=returncode)
            deadline = ready_at + limit_s if ready_at is not None else started + STARTUP_LIMIT_S
            if now > deadline:
                kill_tree(self.child)
                why = (f"no result within {limit_s:g} s" if ready_at is not None
                       else f"the worker did not start within {STARTUP_LIMIT_S:g} s")
                self.close(log_path, kill=True)
                return WorkerOutcome(None, now - started, timed_out=why)

    def _name_by_host_pid(self, result: dict[str, Any]) -> None:
        """A judge in a namespace of its own names its processes 1, 2, 3: the record gets the pids of this host."""
        processes = result.get("processes")
        if not self.namespace or not isinstance(processes, dict) or self.child is None:
            return
        here = namespace_pids(self.child.pid)
        for key, pid in processes.items():
            if key != "row_of_these" and isinstance(pid, int) and pid in here:
                processes[key] = here[pid]

    def _next_line(self) -> dict[str, Any] | None:
        try:
            return self.pipe.arrived.get(timeout=POLL_S)
        except queue.Empty:
            return None
