"""`inv run` and `inv logs`: runs placed on hosts, followed live, summaries brought home."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, Iterable, Optional

from ..hosts.config import Host
from ..hosts.fanout import in_daemon_thread
from .eventstream import EventStream
from ..errors import HostBusy, HostCannotTake, HostError, KpremoteError, StoppedByUser
from ..agent.protocol import TERMINAL
from .fetch import SummaryReceiver, fetch_run, has_sealed_summary
from ..cli.jsonout import document, print_document
from .remote import find_task_of_run, follow_run, reattach_hint, start_run
from .session import RunOptions, RunSession, open_session
from ..views import terminal
from ..views.results import summary_markdown
from ..views.run import BatchedPrinter, RunView, print_events
from ..views.start import StartView
from ..task.taskdir import TaskDir

MEASURED = "already measured"
GOES_ON = frozenset({"detached", "running", "connection lost"})
"""Outcomes of a run that is not over: the client stopped looking at it (a stream's `end` says ended: false)."""
"""An outcome's status when the ledger says this candidate was measured on the host already (no run started)."""


@dataclasses.dataclass
class Outcome:
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
        return self.status in ("passed", "detached", MEASURED, "not checked")  # not checked: never a pass, not 1


def launch(hosts: list[Host], tasks: list[TaskDir], options: RunOptions, *, detach: bool = False,
           as_json: bool = False, already: Iterable[Outcome] = (), stream: Optional[EventStream] = None
           ) -> list[Outcome]:
    """Start every task on an idle GPU of the given hosts, follow them together, fetch each summary.

    Each task has a daemon thread of its own: a Ctrl-C (commandline.py, interrupt.py) cancels what they started and
    leaves at once, never waiting for one of them. Each has one line in the live view, from its first connect on.
    With stream (--json-stream), every event goes out as a JSON line, each run's outcome as its `end` line, and the
    final document as the last line.
    """
    outcomes: list[Outcome] = list(already)
    for outcome in outcomes:
        _stream_end(stream, outcome)
    with RunView(quiet=as_json or detach or stream is not None) as live:
        futures: dict[Future, str] = {}
        for index, task in enumerate(tasks):
            order = hosts[index % len(hosts):] + hosts[: index % len(hosts)]
            shown = StartView(live, f"{index}/{task.name}", task.name, silent=as_json or stream is not None,
                              stream=stream)
            run = in_daemon_thread(_one_run, order, task, options, detach, shown, stream, name="kpremote-run")
            futures[run] = task.name
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                outcomes.append(_outcome_of(future, futures[future], hosts))
                _stream_end(stream, outcomes[-1])
    names = [o.task for o in already] + [task.name for task in tasks]
    outcomes.sort(key=lambda o: names.index(o.task))
    if stream is not None:  # the stream's last line: the --json document, on one line
        stream.write_line(json.dumps(document("run", {"runs": [dataclasses.asdict(o) for o in outcomes]}), default=str))
    else:
        _report(outcomes, as_json, detach)
    return outcomes


def _not_checked_here(outcome: Outcome, summary: Path) -> None:
    """A run on a host without a GPU of a task no side of which can run there: every row NOT CHECKED. Not the
    candidate's failure: status `not checked` (never passed), why, and the run's own exit code kept."""
    from .check import NOT_CHECKED_HERE, not_checked_here

    try:
        results = json.loads((summary / "results.json").read_text())
    except (OSError, ValueError):
        return
    why = not_checked_here(results) if outcome.status == "failed" else None
    if why:
        outcome.status = NOT_CHECKED_HERE
        outcome.error = f"not checked on a host without a GPU: {why}; run it on a GPU host"


def _stream_end(stream: Optional[EventStream], outcome: Outcome) -> None:
    if stream is not None:
        stream.end(outcome.host, outcome.task, outcome.run_id, ended=outcome.status not in GOES_ON,
                   **{k: v for k, v in dataclasses.asdict(outcome).items() if k not in ("host", "task", "run_id")})


def _outcome_of(future: Future, task: str, hosts: list[Host]) -> Outcome:
    try:
        return future.result()
    except KpremoteError as exc:  # this task could not start: the tasks that did must still be reported
        return Outcome(host=",".join(h.name for h in hosts), task=task, status="not started", error=str(exc))


def _one_run(hosts: list[Host], task: TaskDir, options: RunOptions, detach: bool, shown: StartView,
             stream: Optional[EventStream]) -> Outcome:
    t0 = time.monotonic()
    live, key = shown.live, shown.key
    with shown:
        session, run = _start_somewhere(hosts, task, options, shown)
        if run is not None:
            live.add(key, run.host, task.name, run.run_id, run.gpu)  # the run's live line takes its starting line's place
            if stream is not None:
                stream.emit(run.host, task.name, run.run_id, {"event": "started", "gpu": run.gpu,
                                                              "synced_files": run.synced_files, "job_id": run.job_id})
    if run is None:
        return Outcome(host=",".join(h.name for h in hosts), task=task.name, status="no idle GPU", error=session,
                       seconds=time.monotonic() - t0)
    outcome = Outcome(host=run.host, task=task.name, run_id=run.run_id, status="detached" if detach else "running",
                      synced_files=run.synced_files, job_id=run.job_id)
    try:
        if not detach:
            seen: list[float] = []
            streamed = stream.for_run(run.host, task.name, run.run_id) if stream is not None else None

            def on_event(event: dict) -> None:
                seen.append(float(event.get("t", 0.0)))
                live.event(key, event)
                if streamed is not None:
                    streamed(event)

            summary = SummaryReceiver(session.host, run.run_id)  # the tar comes after the end line: no channel
            state = follow_run(session, task.name, run.run_id, on_event, summary_sink=summary)
            # The agent's own time: its first event to its last. Everything else is kpremote's overhead.
            outcome.agent_seconds = round(max(seen) - min(seen), 3) if seen else None
            outcome.status = state.get("status", "unknown")
            outcome.exit_code = state.get("exit_code")
            outcome.headline = state.get("headline")
            if outcome.status != "passed":
                # why it ended (e.g. "disk full on ...", "agent process died"), shown with the summary
                outcome.error = state.get("message") or state.get("error")
            if outcome.status != "cancelled" and (outcome.status == "passed" or has_sealed_summary(state)):
                fetched = fetch_run(session.agent, task, state, run.host, summary.data)
                outcome.summary_dir = str(fetched.path)
                _not_checked_here(outcome, fetched.path)
            elif outcome.status != "cancelled":  # it ended before its runner sealed a summary: nothing to fetch
                outcome.error = f"{outcome.error or outcome.status}; no summary: its runner sealed none"
    except HostError as exc:
        outcome.status = "connection lost"
        outcome.error = f"{exc}; {reattach_hint(run.host, task.name, run.run_id)}"
    except KpremoteError as exc:
        outcome.status = "error"
        outcome.error = str(exc)
    finally:
        outcome.channels = session.channels
        outcome.seconds = time.monotonic() - t0
        session.close()
    return outcome


def _start_somewhere(hosts: list[Host], task: TaskDir, options: RunOptions, shown: StartView):
    """Try each host in turn; a host that cannot take the task (unreachable, failing before the run starts, no idle
    GPU, wrong arch) is skipped with a line saying why. Only when no host took it does --wait wait, on the first
    host that answered "busy"; only when no host can take it at all does the task fail."""
    reasons: list[str] = []
    busy: list[Host] = []
    for host in hosts:
        attempt = options if len(hosts) == 1 else dataclasses.replace(options, wait=None)
        try:
            return _try_host(host, task, attempt, shown.on(host.name))
        except HostBusy as exc:
            busy.append(host)
            reasons.append(str(exc))
        except (HostError, HostCannotTake) as exc:
            reasons.append(str(exc))
            if len(hosts) > 1:
                shown.say(f"{task.name}: {_one_line(str(exc))}; trying the next host" if host is not hosts[-1]
                          else f"{task.name}: {_one_line(str(exc))}")
    if options.wait and busy and len(hosts) > 1:
        return _try_host(busy[0], task, options, shown.on(busy[0].name))
    if len(hosts) == 1:
        raise KpremoteError(reasons[0])
    if busy:
        return "no idle GPU on any host: " + " | ".join(reasons), None
    raise KpremoteError(f"no host could take {task.name}: " + " | ".join(_one_line(r) for r in reasons))


def _try_host(host: Host, task: TaskDir, options: RunOptions, on_progress) -> tuple[RunSession, Any]:
    session = open_session(host)
    try:
        return session, start_run(session, task, options, on_progress=on_progress)
    except BaseException:
        session.close()
        raise


def _one_line(text: str) -> str:
    return " ".join(text.split())


def measured_already(tasks: list[TaskDir], hosts: list[Host]) -> tuple[list[TaskDir], list[Outcome]]:
    """The tasks still to run, and an outcome for each whose candidate the ledger says was measured on one of these
    hosts already (kpremote/results/ledger.py): said on stderr, no GPU spent; `inv run --again` skips this."""
    from ..results.ledger import measured_before, measured_line

    to_run, already = [], []
    for task in tasks:
        entry, note = measured_before(task.path, [h.name for h in hosts])
        if note:
            terminal.errors.print(note, markup=False, soft_wrap=True)
        if entry is None:
            to_run.append(task)
            continue
        terminal.errors.print(measured_line(task.name, entry), markup=False, soft_wrap=True)
        summary = task.path / "results" / str(entry["host"]) / str(entry["run_id"])
        already.append(Outcome(host=entry["host"], task=task.name, run_id=entry["run_id"], status=MEASURED,
                               exit_code=entry.get("exit_code"), headline=entry.get("headline"),
                               summary_dir=str(summary) if summary.is_dir() else None))
    return to_run, already


def _report(outcomes: list[Outcome], as_json: bool, detach: bool) -> None:
    if as_json:
        print_document("run", {"runs": [dataclasses.asdict(o) for o in outcomes]})
        return
    for outcome in outcomes:
        if detach and outcome.run_id:
            terminal.say(f"{outcome.host}: {outcome.task}: started run {outcome.run_id} "
                         f"(follow: inv logs --host {outcome.host} --run {outcome.run_id} --follow)")
            continue
        if outcome.summary_dir:
            results = Path(outcome.summary_dir) / "results.md"
            if results.exists():
                terminal.show(summary_markdown(results))
            terminal.say(f"{outcome.host}: {outcome.task}: run {outcome.run_id} {outcome.status}; "
                         f"summary: {outcome.summary_dir}")
        if outcome.error:
            terminal.error_line(f"{outcome.task}: {outcome.error}")


def show_logs(host: Host, run_id: str, task: Optional[str], follow: bool,
              stream: Optional[EventStream] = None) -> bool:
    """The run's events; True unless the run ended and did not pass (failed, error, cancelled).

    With stream (--json), each event is a JSON line and the last is `end`, the run's state as the host has it.
    Ctrl-C while following stops following only (the run goes on) and exits 130, as every Ctrl-C does.
    """
    session = open_session(host)
    try:
        task = task or find_task_of_run(session, run_id)
        if stream is not None:
            state = follow_run(session, task, run_id, stream.for_run(host.name, task, run_id), once=not follow)
        else:
            # Leaving the block prints what is pending, so Ctrl-C's message below comes after every event received.
            with BatchedPrinter(print_events) as printer:
                state = follow_run(session, task, run_id, printer.add, once=not follow)
    except KeyboardInterrupt:
        raise StoppedByUser(f"stopped following; the run goes on (cancel it with: inv cancel --host {host.name} "
                            f"--run {run_id})") from None
    finally:
        session.close()
    status = state.get("status", "?")
    if stream is not None:
        stream.end(host.name, task, run_id, ended=status in TERMINAL, status=status, exit_code=state.get("exit_code"),
                   headline=state.get("headline"), error=state.get("message") or state.get("error"))
    elif status in TERMINAL:
        terminal.say(f"run {run_id}: {status}")
    else:
        terminal.say(f"run {run_id}: {status}, and it goes on (follow it: inv logs --host {host.name} --task {task} "
                     f"--run {run_id} --follow)")
    return status not in TERMINAL or status == "passed"
