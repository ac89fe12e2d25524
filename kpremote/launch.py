"""`inv run`, `inv logs`, `inv check`: runs placed on hosts, followed live, summaries brought home."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel

from . import view
from .config import Host
from .errors import HostError, KpremoteError
from .fetch import SummaryReceiver, fetch_run
from .runs import (NoIdleGpu, RunOptions, RunSession, StartedRun, cancel_run, find_task_of_run, follow_run,
                   reattach_hint, start_run)


class Outcome(BaseModel):
    host: str
    task: str
    run_id: Optional[str] = None
    job_id: Optional[str] = None  # Slurm's, on a cluster
    status: str = "not started"
    exit_code: Optional[int] = None
    headline: Optional[dict[str, Any]] = None
    summary_dir: Optional[str] = None
    error: Optional[str] = None
    channels: int = 0
    synced_files: Optional[int] = None
    seconds: float = 0.0
    agent_seconds: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "detached")


def require_tasks(kernels_dir: Path, tasks: list[str]) -> None:
    """Every task must be a folder under kernels/ with a task.toml; an unknown one suggests the closest."""
    known = sorted(p.parent.name for p in kernels_dir.glob("*/task.toml"))
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, known, n=1, cutoff=0.5)
            hint = f" — did you mean {close[0]!r}?" if close else ""
            raise KpremoteError(f"unknown task {task!r}: no {kernels_dir / task / 'task.toml'}{hint}")


def launch(hosts: list[Host], tasks: list[str], kernels_dir: Path, options: RunOptions, *, detach: bool = False,
           as_json: bool = False) -> list[Outcome]:
    """Start every task on an idle GPU of the given hosts, follow them together, fetch each summary."""
    require_tasks(kernels_dir, tasks)
    started: dict[str, tuple[RunSession, StartedRun]] = {}
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    with view.RunView(quiet=as_json or detach) as live, ThreadPoolExecutor(max_workers=max(1, len(tasks))) as pool:
        futures: dict[Future, str] = {}
        for index, task in enumerate(tasks):
            order = hosts[index % len(hosts):] + hosts[: index % len(hosts)]
            futures[pool.submit(_one_run, order, task, kernels_dir, options, detach, live, started, lock)] = task
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                outcomes += [_outcome_of(f, futures[f], hosts) for f in done]
        except KeyboardInterrupt:
            _cancel_all(started, lock)
            raise
    outcomes.sort(key=lambda o: tasks.index(o.task))
    _report(outcomes, kernels_dir, as_json, detach)
    return outcomes


def _outcome_of(future: Future, task: str, hosts: list[Host]) -> Outcome:
    try:
        return future.result()
    except KpremoteError as exc:  # this task could not start: the tasks that did must still be reported
        return Outcome(host=",".join(h.name for h in hosts), task=task, status="not started", error=str(exc))


def _one_run(hosts: list[Host], task: str, kernels_dir: Path, options: RunOptions, detach: bool,
             live: view.RunView, started: dict, lock: threading.Lock) -> Outcome:
    t0 = time.monotonic()
    session, run = _start_somewhere(hosts, task, kernels_dir, options)
    if run is None:
        return Outcome(host=",".join(h.name for h in hosts), task=task, status="no idle GPU", error=session,
                       seconds=time.monotonic() - t0)
    key = f"{run.host}/{run.run_id}"
    with lock:
        started[key] = (session, run)
    live.add(key, run.host, task, run.run_id, run.gpu)
    outcome = Outcome(host=run.host, task=task, run_id=run.run_id, status="detached" if detach else "running",
                      synced_files=run.synced_files, job_id=run.job_id)
    try:
        if not detach:
            seen: list[float] = []

            def on_event(event: dict) -> None:
                seen.append(float(event.get("t", 0.0)))
                live.event(key, event)

            summary = SummaryReceiver(session.host, run.run_id)  # the tar comes after the end line: no channel
            state = follow_run(session, task, run.run_id, on_event, summary_sink=summary)
            # The agent's own time: its first event to its last. Everything else is kpremote's overhead.
            outcome.agent_seconds = round(max(seen) - min(seen), 3) if seen else None
            outcome.status = state.get("status", "unknown")
            outcome.exit_code = state.get("exit_code")
            outcome.headline = state.get("headline")
            if outcome.status != "passed":
                # why it ended (e.g. "disk full on ...", "agent process died"), shown with the summary
                outcome.error = state.get("message") or state.get("error")
            if outcome.status != "cancelled":
                fetched = fetch_run(session.agent, task, state, kernels_dir, run.host, summary.data)
                outcome.summary_dir = str(fetched.path)
    except HostError as exc:
        outcome.status = "connection lost"
        outcome.error = f"{exc}; {reattach_hint(run.host, task, run.run_id)}"
    except KpremoteError as exc:
        outcome.status = "error"
        outcome.error = str(exc)
    finally:
        outcome.channels = session.channels
        outcome.seconds = time.monotonic() - t0
        with lock:
            started.pop(key, None)
        session.close()
    return outcome


def _start_somewhere(hosts: list[Host], task: str, kernels_dir: Path, options: RunOptions):
    """Try each host in turn; only when none has an idle GPU does --wait wait, on the first host."""
    reasons = []
    for position, host in enumerate(hosts):
        waiting_here = options.wait and position == len(hosts) - 1
        attempt = options if waiting_here or len(hosts) == 1 else options.model_copy(update={"wait": None})
        session = RunSession(host)
        try:
            return session, start_run(session, task, kernels_dir, attempt)
        except NoIdleGpu as exc:
            reasons.append(str(exc))
            session.close()
        except BaseException:
            session.close()
            raise
    if len(hosts) == 1:
        raise KpremoteError(reasons[0])
    return "no idle GPU on any host: " + " | ".join(reasons), None


def _cancel_all(started: dict, lock: threading.Lock) -> None:
    with lock:
        runs = list(started.values())
    for following, run in runs:
        # A connection of its own: the run's follow thread closes its session as soon as the run ends.
        session = RunSession(following.host)
        try:
            cancel_run(session, run.task, run.run_id)
            view.errors.print(f"cancelled run {run.run_id} on {run.host}: its processes are gone and its GPU lease "
                              "is released")
        except KpremoteError as exc:
            view.error_line(f"could not cancel run {run.run_id} on {run.host}: {exc}")
        finally:
            session.close()


def _report(outcomes: list[Outcome], kernels_dir: Path, as_json: bool, detach: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps([o.model_dump() for o in outcomes], indent=1) + "\n")
        return
    for outcome in outcomes:
        if detach and outcome.run_id:
            view.console.print(f"{outcome.host}: {outcome.task}: started run {outcome.run_id} "
                               f"(follow: inv logs --host {outcome.host} --run {outcome.run_id} --follow)")
            continue
        if outcome.summary_dir:
            results = Path(outcome.summary_dir) / "results.md"
            if results.exists():
                view.console.print(view.summary_markdown(results))
            view.console.print(f"{outcome.host}: {outcome.task}: run {outcome.run_id} {outcome.status}; "
                               f"summary: {outcome.summary_dir}")
        if outcome.error:
            view.error_line(f"{outcome.task}: {outcome.error}")


def show_logs(host: Host, run_id: str, task: Optional[str], follow: bool) -> bool:
    session = RunSession(host)
    try:
        task = task or find_task_of_run(session, run_id)
        # Leaving the block prints what is pending, so Ctrl-C's message below comes after every event received.
        with view.BatchedPrinter(view.print_events) as printer:
            state = follow_run(session, task, run_id, printer.add, once=not follow)
    except KeyboardInterrupt:
        view.errors.print(f"stopped following; the run goes on (cancel it with: inv cancel --host {host.name} "
                          f"--run {run_id})")
        return True
    finally:
        session.close()
    view.console.print(f"run {run_id}: {state.get('status', '?')}")
    return state.get("status") not in ("failed", "error")


def smoke_check(kernels_dir: Path, task: str, workloads: Optional[str]) -> bool:
    """Run the agent right here on the CPU (Triton interpreter): the task's contract and correctness, not speed."""
    require_tasks(kernels_dir, [task])
    run_dir = kernels_dir / task / "results" / "check" / time.strftime("%Y%m%d-%H%M%S")
    argv = [sys.executable, "-m", "kpremote.agent.runner", "--task-dir", str(kernels_dir / task),
            "--run-dir", str(run_dir), "--device", "cpu"]
    if workloads:
        argv += ["--workloads", workloads]
    view.console.print(f"[bold yellow]smoke: timings are not meaningful[/] — {task} on the CPU through Triton's "
                       "interpreter")
    code = subprocess.call(argv)
    results = run_dir / "summary" / "results.md"
    if results.exists():
        view.console.print(view.summary_markdown(results))
    view.console.print(f"summary: {run_dir / 'summary'}")
    return code == 0
