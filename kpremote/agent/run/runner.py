"""One run, start to end: validate → lease → build → (correctness → timing) per workload → report.

`python -m kpremote.agent.run.runner` (its options: runoptions.py) is what `start` spawns for a timing run.

The runner itself never imports torch: the builds run in a worker process (worker.py) and the workload rows in
a judge (judge.py, driven through judgeprocess.py), which keeps each side in a process of its own; the judge and
its sides serve row after row while rows pass clean, and any other row ends them. Every row has a timeout, so a
hang or a crash costs one row. The runner draws the run's secret (the seeds of every case derive from it) and
hands it to the judge on stdin with each row's job; results come back through a pipe no side inherits.
state.json says where the run is; raw/events.jsonl says what happened, as it happens.

Exit codes: 0 every selected workload PASSED; 1 some row did not pass, its timing is invalid, or a check did not
run (NOT CHECKED: a side that cannot run on this device, e.g. a CUDA side on a CPU machine, whose build was only
compile-checked); 2 the task was refused (contract or symmetry) before
anything ran; 3 the run could not proceed (no GPU, build failed, ...); 130 cancelled.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .. import harness, sandbox
from ..task import buildrules
from . import records, report
from ..harness import floors, guard, timing
from ..task.buildrules import NOT_CHECKED
from .auditstep import AuditStep
from ..children import WorkerOutcome
from ..harness.judgeprocess import JudgeProcess
from ..harness.correctness import ERROR, PASSED, TIMEOUT
from .events import EventLog, read_events, row_event
from .guards import DiskReserve, ForeignWatch, ours_per_row
from .leasestep import LeaseStep
from ..protocol import RunExit
from ..record import RecordError
from ..results import RowResult
from ..provenance import baseline_upstream, source_provenance, task_pin_record
from .runchildren import RunChildren
from .runoptions import Options, parse_args
from .runstate import disk_full_message, is_disk_full, update_state
from .stopping import Abort, Cancelled, StopVerdict
from ..task.taskspec import TaskSpec, TaskSpecError, Workload, load_task

PREPARE_LIMIT_S = 3600.0  # both builds (a CUDA build can take many minutes) and the device probe


def main(argv: list[str], stopped_by: Callable[[Path], StopVerdict | None] | None = None) -> int:
    """stopped_by(run_dir): who stopped a run that a signal ended, when not a cancel (a Slurm job's step passes
    Slurm's answer: time limit, preemption, node failure)."""
    options = parse_args(argv)
    return Runner(options, [sys.executable, "-m", "kpremote.agent.run.runner", *argv], stopped_by).run()


# --------------------------------------------------------------------------------------------- the run


@dataclass
class RunContext:
    spec: TaskSpec | None = None
    selected: list[Workload] = field(default_factory=list)
    device: str = "cpu"
    gpu: Any = None  # nvml.GpuState of the leased GPU
    lease: Any = None
    lease_root: Path | None = None
    driver: str | None = None
    gpu_before: dict[str, Any] | None = None
    gpu_after: dict[str, Any] | None = None
    prepared: dict[str, Any] = field(default_factory=dict)
    rows: list[RowResult] = field(default_factory=list)  # each row as the judge made it (_row_record), whole
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # a row with a context: each context regime's samples, {regime: {workload: {side: times}}}
    regime_samples: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    watch: ForeignWatch | None = None
    gpu_readings: str | None = None  # "nvml" or "fixture": where the GPU's state came from
    audit: str | None = None  # what the audit did: "on", "unaudited: ..."
    sandbox: Any = None  # sandbox.Support: what this host lets the sides' sandbox hold


class Runner(LeaseStep, RunChildren, AuditStep):
    """One run's steps in order (run); the lease step, the child processes and the audit step are its mixins'
    (leasestep.py, runchildren.py, auditstep.py), which share its ctx."""

    def __init__(self, options: Options, command: list[str],
                 stopped_by: Callable[[Path], StopVerdict | None] | None = None) -> None:
        self.options = options
        self.command = command
        self.stopped_by = stopped_by
        self.run_dir = options.run_dir
        self.raw = self.run_dir / "raw"
        self.reserve = DiskReserve(self.raw / ".disk-reserve")
        self.events: EventLog | None = None
        self.ctx = RunContext()
        self.started_iso = _utc_now()
        self.secret = secrets.token_bytes(32)  # seeds every case of this run; only the judge ever sees it
        self.judges: JudgeProcess | None = None

    # ---------------------------------------------------------------- top level

    def run(self) -> int:
        guard.make_undumpable()
        self.raw.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "summary").mkdir(parents=True, exist_ok=True)
        self.reserve.claim()
        self.events = EventLog(self.raw / "events.jsonl")
        update_state(self.run_dir, run_id=self.run_dir.name, status="running", phase="validate", pid=os.getpid(),
                     pgid=os.getpgrp(), started=self.started_iso)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        status, exit_code, message, ended_by = "error", RunExit.INFRA, None, None
        try:
            status, exit_code, message = self._run_all()
        except Cancelled:
            status, exit_code, message, ended_by = self._stopped_by()
        except Abort as abort:
            status, exit_code, message = abort.status, abort.exit_code, str(abort)
            self.events.emit("error", message=message)
        except Exception as exc:  # noqa: BLE001 - an agent bug still ends the run with a record of it
            if is_disk_full(exc):  # nothing more can be written until _finish gives the reserve back
                status, exit_code, message = "error", RunExit.INFRA, disk_full_message(exc.filename or self.run_dir)
            else:
                status, exit_code, message = "error", RunExit.INFRA, f"agent error: {type(exc).__name__}: {exc}"
                self.events.emit("error", message=message)
        finally:
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)  # finishing the record must not be interrupted
        self._finish(status, exit_code, message, ended_by)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        return exit_code

    def _on_signal(self, signum: int, _frame: Any) -> None:
        raise Cancelled(signal.Signals(signum).name)

    def _stopped_by(self) -> tuple[str, int, str, str | None]:
        """(status, exit code, message, ended_by) of a run a signal stopped: a cancel, unless whoever started the
        runner says otherwise (a Slurm job stopped by Slurm itself: failed, as Slurm says)."""
        verdict = self.stopped_by(self.run_dir) if self.stopped_by else None
        if verdict:
            return verdict["status"], verdict["exit_code"], verdict["message"], verdict["ended_by"]
        return "cancelled", RunExit.CANCELLED, "cancelled by a signal", None

    def _run_all(self) -> tuple[str, int, str | None]:
        self._get_ready()
        self._phase("workloads")
        self._run_rows(self.ctx.selected)
        self._audit()
        return self._verdict()

    def _run_rows(self, workloads: list[Workload]) -> None:
        """The rows, one after another through the run's judge, which is ended once they are done: what comes
        next (the audit, a profile under ncu) measures on a GPU that no process of the rows still holds."""
        try:
            for number, workload in enumerate(workloads, start=1):
                self._run_row(number, workload, len(workloads))
        finally:
            self._judges().close()

    # ---------------------------------------------------------------- steps

    def _get_ready(self) -> None:
        """The steps every kind of run takes first: validate → lease → build, then the provenance event."""
        self._phase("validate")
        self._validate()
        self.ctx.sandbox = sandbox.support()
        self._phase("lease")
        self._take_gpu()
        self._phase("build")
        self._prepare()
        self.events.emit("provenance", **self._provenance())

    def _validate(self) -> None:
        try:
            spec = load_task(self.options.task_dir, timing_mode=self.options.mode)
            self.ctx.selected = spec.select(self.options.workloads)
        except TaskSpecError as exc:
            raise Abort(f"refused: {exc}", RunExit.REFUSED) from None
        self.ctx.spec = spec
        update_state(self.run_dir, task=spec.task.name)

    def _prepare(self) -> None:
        spec = self.ctx.spec
        job = {"task_dir": str(spec.root), "run_dir": str(self.run_dir), "device": self.ctx.device,
               "mode": self.options.mode}
        outcome = self._run_worker("prepare", job, self.raw / "prepare", PREPARE_LIMIT_S)
        result = outcome.result or {}
        if self.ctx.device == "cuda":  # only the probe taken before any task code ran counts
            result["device"] = (outcome.piped or {}).get("probe")
        build = result.get("build")
        if build is None:
            why = outcome.timed_out or outcome.crashed or result.get("message") or "no result"
            raise Abort(f"build: {why}")
        self.ctx.prepared = result
        for side, record in build["sides"].items():
            self.events.emit("build", side=side, ok=record["ok"], seconds=record["seconds"], log=record["log"],
                             error=record.get("error"))
        if build.get("note"):
            self.events.emit("warning", message=build["note"])
        not_checked = self._not_checked_here()  # the build's sides that cannot run here, and the task's own word
        if not_checked:
            self.events.emit("warning", message=f"{NOT_CHECKED}: " + "; ".join(not_checked.values()))
        if not build["ok"]:
            failed = {s: r for s, r in build["sides"].items() if not r["ok"]}
            reasons = "; ".join(f"{s}: {r['error']}" for s, r in failed.items())
            raise Abort(f"build failed — {reasons}; {self._raw_file_hint(next(iter(failed.values()))['log'])}")

    def _raw_file_hint(self, log: str) -> str:
        """Where a log under raw/ is, and the command that brings it home (the run's host named by its alias)."""
        alias = self.options.host_alias
        if not alias or not log.startswith("raw/"):
            return f"its log: {log} in the run's folder"
        return (f"its log, on the host: inv fetch-results --host {alias} --task {self.ctx.spec.task.name} "
                f"--run {self.run_dir.name} --raw-file {log[len('raw/'):]}")

    def _run_row(self, number: int, workload: Workload, total: int) -> None:
        self._phase("workload", workload=workload.id, i=number, n=total)
        update_state(self.run_dir, workload={"i": number, "n": total, "id": workload.id})
        judged = self._row_result(workload)
        samples = judged.pop("samples", None)
        regime_samples = judged.pop("regime_samples", None) or {}
        row = _row_record(judged)
        if samples:
            self.ctx.samples[workload.id] = samples
            self._append_samples(workload.id, row.timing.mode if row.timing else None, samples)
        for regime, timed in regime_samples.items():
            self.ctx.regime_samples.setdefault(regime, {})[workload.id] = timed
            self._append_samples(workload.id, regime, timed, regime=regime)
        self.ctx.rows.append(row)
        event = self.events.emit("row", **row_event(row, number, total))
        speedup = f" {event['speedup']:.3f}x" if event.get("speedup") else ""
        detail = f" — {event['message']}" if event.get("message") else ""
        print(f"[{number}/{total}] {workload.id}: {row.status}{speedup}{detail}", file=sys.stderr, flush=True)

    def _row_result(self, workload: Workload) -> dict[str, Any]:
        """The row's JSON object as the judge's outcome and the runner's own keys make it (with its samples, which
        _run_row takes out before the row becomes its record)."""
        base = {"workload": workload.id, "production": workload.production, "params": workload.params,
                "tolerance_override": {"atol": workload.atol, "rtol": workload.rtol}}
        smoke = self.ctx.device != "cuda"
        not_checked = self._not_checked_here()
        if not_checked:  # a side that cannot run here: whatever was checked of its build, its rows are not passed
            why = "; ".join(not_checked.values())
            build_note = (self.ctx.prepared.get("build") or {}).get("note")
            return {**base, "status": NOT_CHECKED, "message": why + (f"; {build_note}" if build_note else ""),
                    "timing": None, "smoke": True, "label": report.SMOKE_LABEL, "seconds": 0.0}
        device_info = self.ctx.prepared.get("device") or {}
        job = {"task_dir": str(self.ctx.spec.root), "run_dir": str(self.run_dir), "device": self.ctx.device,
               "mode": self.options.mode, "workload": workload.id,
               "modules": {side: rec.get("module") for side, rec in self.ctx.prepared["build"]["sides"].items()},
               "gpu": self.ctx.gpu.to_json() if self.ctx.gpu else None,
               "copy_gbps": floors.reachable_gbps(device_info.get("copy_bandwidth")),
               "l2_copy_gbps": floors.reachable_gbps(device_info.get("l2_copy_bandwidth")),
               "l2_bytes": device_info.get("l2_bytes")}
        ours = ours_per_row(timing.side_pairs(self.ctx.device, self.ctx.spec.timing.mode))
        if self.ctx.watch:
            self.ctx.watch.row_started(ours=ours)
        outcome = self._judge_row(job, self.raw / "workloads" / workload.id)
        foreign = self.ctx.watch.row_ended(ours=ours if self._judges().alive else 0) if self.ctx.watch else None
        row = {**base, **_outcome_fields(outcome), "smoke": smoke, "label": report.SMOKE_LABEL if smoke else None,
               "seconds": round(outcome.seconds, 3), "log": f"raw/workloads/{workload.id}.log"}
        row["speedup"] = (row.get("timing") or {}).get("speedup") if row["status"] == PASSED else None
        if outcome.log_dropped_bytes:
            row["log_dropped_bytes"] = outcome.log_dropped_bytes  # results.md says the row's log was cut
        if foreign and row.get("timing"):
            row["invalid"] = "; ".join(filter(None, [row.get("invalid"), foreign]))
        return row

    def _not_checked_here(self) -> dict[str, str]:
        """{side: why} for the sides that cannot run on this device (buildrules decides, per build kind), and the
        task's own word where it can be checked on a GPU only (task.toml [task] gpu_only)."""
        why = buildrules.not_checked_here(self.ctx.spec.build, self.ctx.device)
        if self.ctx.spec.task.gpu_only and self.ctx.device != "cuda":
            why["task"] = f"checked on a GPU only: {self.ctx.spec.task.gpu_only}"
        return why

    def _append_samples(self, workload_id: str, mode: str | None, samples: dict[str, list[float]],
                        regime: str = "cold") -> None:
        with open(self.raw / "samples.jsonl", "a") as f:
            for side, times in samples.items():
                f.write(json.dumps({"workload": workload_id, "side": side, "mode": mode, "regime": regime,
                                    "unit": "us", "times": times}) + "\n")

    # ---------------------------------------------------------------- ending

    def _verdict(self) -> tuple[str, int, str | None]:
        """passed, or failed with why (state.json's message: what `inv status` and `inv run`'s `error` show)."""
        rows = self.ctx.rows
        bad = [r for r in rows if r.status != PASSED or r.invalid]
        return ("passed", RunExit.PASSED, None) if not bad else ("failed", RunExit.FAILED, why_failed(bad, len(rows)))

    def _finish(self, status: str, exit_code: int, message: str | None, ended_by: str | None = None) -> None:
        """Release the GPU, write the summary, and only then say the run is over (state last). ended_by: the Slurm
        state that ended the run (TIMEOUT, PREEMPTED, ...), when Slurm did."""
        head: dict[str, Any] | None = None
        sealed: dict[str, Any] = {}  # summary/results.json's sha256 and MAC (records.py): only that summary leaves
        self.reserve.give_back()  # its room is what lets a run on a full disk still record why it ended
        try:
            self._release_gpu()
            self._phase("report")
            results = report.build_results(provenance=self._provenance(), rows=self.ctx.rows,
                                           samples=self.ctx.samples, regime_samples=self.ctx.regime_samples,
                                           status=status, exit_code=exit_code,
                                           message=message, smoke=self.ctx.device != "cuda",
                                           unsandboxed=self._unsandboxed(), ended_by=ended_by)
            report.write_summary(self.run_dir, results, read_events(self.raw / "events.jsonl")[0])
            sealed = records.seal_summary(self.run_dir)
            head = results.headline.to_json()
            self.events.emit("headline", **head)
        except Exception as exc:  # noqa: BLE001 - the run must still end with a terminal state
            status, exit_code = "error", RunExit.INFRA
            if not (is_disk_full(exc) and (message or "").startswith("disk full")):  # one disk-full line is enough
                why = disk_full_message(self.run_dir) if is_disk_full(exc) else \
                    f"report failed: {type(exc).__name__}: {exc}"
                message = f"{message}; {why}" if message else why
            with suppress(OSError):
                self.events.emit("error", message=message)
        with suppress(OSError):  # a full disk may refuse the event; the state below is what must get written
            self.events.emit("done", status=status, exit_code=exit_code, message=message,
                             **{"summary_sha256": None, **sealed}, ended_by=ended_by)
        update_state(self.run_dir, status=status, phase="done", exit_code=exit_code, headline=head, message=message,
                     finished=_utc_now(), **{"summary_sha256": None, **sealed},
                     **({"ended_by": ended_by} if ended_by else {}))
        self.events.close()
        print(json.dumps({"run_dir": str(self.run_dir), "status": status, "exit_code": exit_code, "message": message,
                          "headline": head}, default=str), flush=True)

    def _phase(self, phase: str, **fields: Any) -> None:
        self.events.emit("phase", phase=phase, **fields)
        update_state(self.run_dir, phase=phase)

    def _unsandboxed(self) -> str | None:
        """Why this run's numbers came from sides that were not (wholly) sandboxed; None when they all were."""
        support = self.ctx.sandbox
        if support is None:
            return None
        if support.level != "sandboxed":
            why = "; ".join(support.why_not)
            return f"no sandbox ({why})" if support.level == "unsandboxed" else f"only a partial sandbox here ({why})"
        loose = sorted({f"{side}: {how}" for row in self.ctx.rows for side, how in (row.sandbox or {}).items()
                        if how.startswith("unsandboxed") or "missing" in how})
        return "; ".join(loose) or None

    def _provenance(self) -> dict[str, Any]:
        spec, ctx = self.ctx.spec, self.ctx
        prepared = ctx.prepared
        device_info = prepared.get("device") or {}
        gpu = ctx.gpu
        return {
            "command": self.command,
            "run_id": self.run_dir.name,
            "started": self.started_iso,
            "task": {"name": spec.task.name, "arch": spec.task.arch, "family": spec.task.family,
                     "dir": str(spec.root)} if spec else {"dir": str(self.options.task_dir)},
            "source": (source := source_provenance(spec.root) if spec else None),
            "task_pin": task_pin_record(spec.root, source) if spec else None,
            "baseline_upstream": baseline_upstream(spec.baseline) if spec else None,
            "host": {"alias": self.options.host_alias, "hostname": socket.gethostname()},
            "device": ctx.device,
            "gpu": {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "cc": list(gpu.cc),
                    "driver": ctx.driver} if gpu else None,
            "device_info": {k: v for k, v in device_info.items()
                            if k not in ("copy_bandwidth", "l2_copy_bandwidth", "l2_flush_probe", "empty_window")} or None,
            "harness": harness.harness_record(),
            "pinned": harness.pinned_inputs(spec.root) if spec else None,
            "gpu_readings": ctx.gpu_readings or "none (CPU run)",
            "audit": ctx.audit or ("unaudited: CPU run" if ctx.device != "cuda" else "not reached"),
            "sandbox": ctx.sandbox.to_json() if ctx.sandbox else None,
            "l2_copy_bandwidth": device_info.get("l2_copy_bandwidth"),
            "l2_flush_probe": device_info.get("l2_flush_probe"),
            "empty_window": device_info.get("empty_window"),
            "versions": prepared.get("versions"),
            "build": prepared.get("build"),
            "timing_settings": spec.timing.to_json() if spec else None,
            "mode": ("smoke" if ctx.device != "cuda" else spec.timing.mode) if spec else None,
            "workloads": [w.id for w in ctx.selected],
            "gpu_before": ctx.gpu_before,
            "gpu_after": ctx.gpu_after,
            "copy_bandwidth": device_info.get("copy_bandwidth"),
            "lease_root": str(ctx.lease_root) if ctx.lease_root else None,
        }


# --------------------------------------------------------------------------------------------- helpers


def why_failed(bad: list[RowResult], total: int, shown: int = 3, detail_chars: int = 200) -> str:
    """A failed run in one line: which rows and how, then the first one's own words (shortened)."""
    def how(row: RowResult) -> str:
        return f"{row.workload} {row.status if row.status != PASSED else 'invalid'}"

    names = ", ".join(how(row) for row in bad[:shown]) + (f" and {len(bad) - shown} more" if len(bad) > shown else "")
    first = bad[0]
    detail = " ".join(str(first.message or first.invalid or "").split())
    if len(detail) > detail_chars:
        detail = detail[:detail_chars - 3] + "..."
    return f"{len(bad)} of {total} row(s) not passed: {names}" + (f" — {first.workload}: {detail}" if detail else "")


def _outcome_fields(outcome: WorkerOutcome) -> dict[str, Any]:
    if outcome.timed_out:
        return {"status": TIMEOUT, "message": f"timeout: {outcome.timed_out}", "timing": None}
    if outcome.result is None:
        return {"status": ERROR, "message": f"worker crashed: {outcome.crashed}", "where": "worker", "timing": None}
    return outcome.result


def _row_record(judged: dict[str, Any]) -> RowResult:
    """The row's record, made once from its JSON object; a judge's answer of another shape (a harness bug) is the
    row's ERROR, saying what was wrong, rather than the run's end."""
    try:
        return RowResult.from_json(judged, f"row {judged.get('workload')}")
    except RecordError as exc:
        return RowResult(workload=str(judged.get("workload")), production=bool(judged.get("production")),
                         status=ERROR, message=f"judge: its answer is not a row: {exc}", where="judge",
                         smoke=bool(judged.get("smoke")))


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")



if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
