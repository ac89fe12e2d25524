"""The runner's children (Runner, runner.py): the prepare worker (both builds and the device probe) and the run's
judge, each held to its limits (children.py), and the environment they run in: this agent importable, the leased GPU
only, the run's Triton cache."""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import AGENT_HOME
from ..harness.judgeprocess import JudgeProcess
from ..protocol import RunExit
from ..task import buildrules
from ..task.build import triton_cache_dir
from ..children import ChildLimits, WorkerOutcome, crash_description, run_child


class RunChildren:
    """Methods of Runner: they read its ctx (RunContext), run_dir, secret and judges."""

    def _judges(self) -> JudgeProcess:
        if self.judges is None:
            self.judges = JudgeProcess(self._worker_env(), self.run_dir, self.run_dir, self.secret,
                                       namespace=bool(self.ctx.sandbox and self.ctx.sandbox.pid_namespace))
        return self.judges

    def _judge_row(self, job: dict[str, Any], stem: Path) -> WorkerOutcome:
        """One row through the run's judge (started for the first row, and again after a row that did not pass)."""
        stem.parent.mkdir(parents=True, exist_ok=True)
        out, job_path, log_path = stem.with_suffix(".json"), stem.with_suffix(".job.json"), stem.with_suffix(".log")
        ready_path = stem.with_suffix(".ready")  # touched by the runner when the pipe says so: a marker for people
        for stale in (out, ready_path):
            stale.unlink(missing_ok=True)
        job_path.write_text(json.dumps(job, indent=1))  # for the record: the judge gets its job on stdin
        outcome = self._judges().row(job, log_path, self.ctx.spec.timing.timeout_s, ready_path)
        if outcome.result is not None:
            out.write_text(json.dumps(outcome.result, indent=1, default=str))  # the record, written by the runner
        return outcome

    def _run_worker(self, what: str, job: dict[str, Any], stem: Path, limit_s: float) -> WorkerOutcome:
        """Start a worker (the "prepare" step), hold it to its time limit, and collect its result.

        It gets a pipe for its trusted output (the device probe) that no process it starts inherits.
        """
        stem.parent.mkdir(parents=True, exist_ok=True)
        out, job_path, log_path = stem.with_suffix(".json"), stem.with_suffix(".job.json"), stem.with_suffix(".log")
        out.unlink(missing_ok=True)
        job_path.write_text(json.dumps(job, indent=1))

        def command(result_fd: int) -> list[str]:
            return [sys.executable, "-m", "kpremote.agent.run.worker", what, "--job", str(job_path), "--out", str(out),
                    "--result-fd", str(result_fd)]

        outcome = run_child(command, ChildLimits(self._worker_env(), self.run_dir, log_path, limit_s))
        if outcome.timed_out:
            return outcome
        if out.exists():
            return replace(outcome, result=json.loads(out.read_text()))
        if outcome.returncode == RunExit.DISK_FULL:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))
        return replace(outcome, crashed=crash_description(outcome.returncode, log_path))

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AGENT_HOME), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONSAFEPATH"] = "1"  # Python >= 3.11: the working directory never shadows torch or the agent
        env["TRITON_CACHE_DIR"] = str(triton_cache_dir(self.run_dir))
        # An autotuned kernel keeps the configuration it chose in the run's cache: the Nsight Compute audit then runs
        # the configuration that was timed (choosing afresh under ncu picked one 1.3-1.9x slower for SGLang's rotary).
        env["TRITON_CACHE_AUTOTUNING"] = "1"
        if self.ctx.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = self.ctx.gpu.uuid
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # an unleased run must not touch any GPU
            if buildrules.needs_triton_interpreter(self.ctx.spec.build, self.ctx.device):
                env["TRITON_INTERPRET"] = "1"
        return env
