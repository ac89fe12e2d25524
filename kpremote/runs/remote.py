"""Remote runs: start detached (with the sync in the same channel), follow events, cancel, list.

A run costs three channels on one connection when nothing changed: start (sync + lease + spawn), follow
(the event stream until the end), pack-summary (the fetch). The agent keeps running if the connection drops.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Optional

from ..agent.protocol import TERMINAL, ExitCode, new_run_id
from ..agent.run.events import RunEvent
from ..hosts.agentclient import Agent, agent_subcommand, error_message
from ..hosts.config import Host
from ..errors import HostBusy, HostCannotTake, HostError, KpremoteError, RemoteCommandError, StartStopped, TaskRefusedByHost
from .interrupt import REGISTRY
from .runids import check_run_word, is_full_id, resolve_run_id
from .slurm import submit_run  # a Slurm cluster's start: sync, then sbatch (issue 15)
from .session import RunOptions, RunSession, StartedRun, open_session, raise_unless_started
from .sync import exchange, over_sync_apply
from ..task.taskdir import TaskDir
from ..task.taskscan import scan_task
from ..transport import Completed

NO_IDLE_GPU = ExitCode.NO_IDLE_GPU
ARCH_MISMATCH = ExitCode.ARCH_MISMATCH
TASK_REFUSED = ExitCode.BAD_REQUEST
NEED_FULL_SYNC = ExitCode.NEED_FULL_SYNC
REFUSALS = {"task_refused", "bad_request", "usage"}  # the request itself is wrong: no other host would take it
HEARTBEAT_GRACE_S = 5.0


def start_run(session: RunSession, task: TaskDir, options: RunOptions, run_id: Optional[str] = None,
              on_progress: Callable[[dict[str, Any]], None] = lambda event: None) -> StartedRun:
    """Sync the task and start its run in one channel; a second only when the host's workspace was not as expected.

    run_id (default: a new one) is the id the run gets: whoever holds it can cancel the run from now on, even
    while the start is still syncing or waiting. on_progress(event) hears how far the start is, in order:
    `connecting`, `syncing` (files, bytes), then the agent's `created` and, with --wait, `waiting` (what for).
    """
    run_id = run_id or new_run_id()
    if session.host.is_cluster:  # Slurm: the same sync, then sbatch instead of a lease (kpremote/runs/slurm.py)
        return submit_run(session, task, options, run_id, on_progress)
    args = [*_start_args(session.host, task.name, options), "--run-id", run_id, "--progress"]
    on_progress({"event": "connecting"})
    session.agent.transport.connect_soon()  # the handshake's round trips pass while the task is scanned
    tree = scan_task(task)
    session.agent.transport.connect()
    # From the moment the start may reach the host, a Ctrl-C cancels this run id there (interrupt.py).
    REGISTRY.add(session.host, task.name, run_id, session.agent.transport)
    started: list[StartedRun] = []

    def start_with_sync(request: bytes) -> dict[str, Any]:
        result = _call_start(session, [*args, "--sync"], request, on_progress)
        if result.exit_code == NEED_FULL_SYNC:
            return _last_json(result)  # nothing started: the sync's retry goes over sync-apply
        started.append(_started(session.host, task.name, result))
        return _last_json(result)["sync"]

    try:
        synced = exchange(session.host, tree, start_with_sync, resend=over_sync_apply(session.agent, task.name),
                          on_plan=lambda plan: on_progress(plan.syncing_event()))
        if not started:
            started.append(_started(session.host, task.name, _call_start(session, args, None, on_progress)))
    except (HostBusy, HostCannotTake, TaskRefusedByHost, StartStopped):
        REGISTRY.discard(session.host.name, run_id)  # the host answered: no run exists
        raise
    return dataclasses.replace(started[0], synced_files=synced.files_sent)


def _call_start(session: RunSession, args: list[str], stdin, on_progress) -> Completed:
    """`start --progress`: JSON lines as they come (created and waiting go to on_progress); the last one is the
    answer."""
    received = bytearray()
    done = 0

    def feed(chunk: bytes) -> None:
        nonlocal done
        received.extend(chunk)
        while (newline := received.find(b"\n", done)) >= 0:
            line, done = bytes(received[done:newline]), newline + 1
            if line.startswith((b'{"event": "created"', b'{"event": "waiting"')):
                on_progress(json.loads(line))

    result = session.agent.call("start", *args, stdin=stdin, on_stdout=feed)
    return dataclasses.replace(result, stdout=bytes(received))


def _last_json(result: Completed) -> dict[str, Any]:
    lines = result.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise RemoteCommandError(result.argv[0] if result.argv else "?", "the agent's start answered no JSON",
                                 result.exit_code, result.stderr_tail())
    return answer


def _start_args(host: Host, task: str, options: RunOptions) -> list[str]:
    args = ["--task", task, "--idle", host.idle.to_json(), "--arch", host.arch, "--host-alias", host.name,
            "--device", options.device]
    for flag, value in (("--gpu", options.gpu), ("--workloads", options.workloads), ("--mode", options.mode),
                        ("--profile", options.profile)):
        if value:
            args += [flag, value]
    if options.wait:
        args += ["--wait", str(options.wait)]
    if not options.audit:
        args += ["--audit", "off"]
    return args


def _started(host: Host, task: str, result: Completed) -> StartedRun:
    if result.exit_code == NO_IDLE_GPU:
        raise HostBusy(f"{host.name}: {error_message(result)}")
    if result.exit_code == ARCH_MISMATCH:
        raise HostCannotTake(f"{host.name}: {error_message(result)}")
    if result.exit_code == TASK_REFUSED and _last_json(result).get("error") in REFUSALS:
        raise TaskRefusedByHost(f"{host.name} refused the task: {error_message(result)}")
    raise_unless_started(host, result, "start")
    answer = _last_json(result)
    return StartedRun(host=host.name, task=task, run_id=answer["run_id"], gpu=answer.get("gpu"))


def follow_run(session: RunSession, task: str, run_id: str, on_event: Callable[[dict[str, Any]], None],
               offset: int = 0, once: bool = False, summary_sink: Optional[Callable[[bytes], None]] = None
               ) -> dict[str, Any]:
    """Stream the run's events to on_event until it ends; returns its final state.

    With summary_sink, a finished (not cancelled) run's summary tar comes on the same channel after its end
    line, and goes to summary_sink in chunks (nothing reaches it for a cancelled run).
    A silent link is a lost link: the agent sends a heartbeat every few seconds, so no byte for longer than
    the host's connect timeout plus a grace period means the connection is gone (the run itself goes on).
    """
    final: dict[str, Any] = {}
    pending = bytearray()
    tar_follows = False

    def feed(chunk: bytes) -> None:
        nonlocal tar_follows
        if tar_follows:
            summary_sink(chunk)
            return
        pending.extend(chunk)
        while (newline := pending.find(b"\n")) >= 0:
            line = bytes(pending[:newline])
            del pending[:newline + 1]
            if not line.strip():
                continue
            event = _event(session.host.name, run_id, line)
            if event.event == "end":
                final.update(event.state or {})
                if event.summary and summary_sink is not None:
                    tar_follows = True
                    if pending:
                        summary_sink(bytes(pending))
                    return
            elif event.event != "heartbeat":
                on_event(event.to_json())

    with_summary = ["--with-summary"] if summary_sink is not None else []
    result = session.agent.call(
        agent_subcommand(session.host, "follow"), "--task", task, "--run", run_id, "--from", str(offset), *(["--once"] if once else []),
        *with_summary, on_stdout=feed, idle_timeout=session.host.connect_timeout + HEARTBEAT_GRACE_S,
    )
    if not result.ok and (not final or tar_follows):
        what = "cannot follow run" if not final else "the summary was cut short for run"
        raise RemoteCommandError(session.host.name, f"{what} {run_id}: {error_message(result)}",
                                 result.exit_code, result.stderr_tail())
    if final.get("status") in TERMINAL:
        REGISTRY.discard(session.host.name, run_id)  # over: a later Ctrl-C has nothing to cancel here
    return final


def _event(host: str, run_id: str, line: bytes) -> RunEvent:
    """One line of the follow stream as its record; KpremoteError (one line, exit 2) naming the host and run where
    the line is not JSON or a field is of another type than RunEvent declares."""
    try:
        return RunEvent.from_json(json.loads(line), "event")
    except ValueError as exc:
        raise KpremoteError(f"{host}: run {run_id}: a malformed event line from the agent: {exc}") from None


def cancel_run(session: RunSession, task: str, run_id: str, *, pending: bool = False,
               grace_s: Optional[float] = None) -> dict[str, Any]:
    """Cancel a run; with pending, also one whose start has not reached the host yet (it will refuse to begin)."""
    args = ["--task", task, "--run", run_id, *(["--pending"] if pending else [])]
    args += ["--grace", str(grace_s)] if grace_s is not None else []
    return session.agent.call_json(agent_subcommand(session.host, "cancel"), *args)  # a cluster's: scancel


def list_runs(session: RunSession, task: Optional[str] = None) -> list[dict[str, Any]]:
    return runs_on(session.host, session.agent, task)


def runs_on(host: Host, agent: Agent, task: Optional[str] = None) -> list[dict[str, Any]]:
    args = ["--task", task] if task else []
    return agent.call_json(agent_subcommand(host, "status"), *args).get("runs", [])


def runs_or_error(host: Host, agent: Agent, task: Optional[str] = None) -> dict[str, Any]:
    """One host's answer for `inv status`: its runs, or why it could not be asked."""
    try:
        return {"host": host.name, "ok": True, "runs": runs_on(host, agent, task)}
    except KpremoteError as exc:
        return {"host": host.name, "ok": False, "error": str(exc), "runs": []}


def find_task_of_run(session: RunSession, run_id: str) -> str:
    for run in list_runs(session):
        if run.get("run_id") == run_id:
            return run["task"]
    raise KpremoteError(f"{session.host.name}: no run {run_id!r} (see: inv status --host {session.host.name})")


def named_run(host: Host, word: str, task: Optional[str]) -> tuple[str, Optional[str]]:
    """The whole run id that `word` names on host (an id, a unique part of one, latest), and its task; a whole id is
    taken as it is, without asking the host."""
    check_run_word(word)
    if is_full_id(word):
        return word, task
    session = open_session(host)
    try:
        runs = sorted(list_runs(session, task), key=lambda r: str(r.get("run_id")))
    finally:
        session.close()
    where = f"on {host.name}" + (f" of {task}" if task else "")
    run_id = resolve_run_id(word, [str(r.get("run_id")) for r in runs], where)
    return run_id, task or next(r.get("task") for r in runs if r.get("run_id") == run_id)


def reattach_hint(host: str, task: str, run_id: str) -> str:
    return (f"the run goes on on {host}. Re-attach: inv logs --host {host} --run {run_id} --follow; "
            f"results: inv fetch-results --host {host} --task {task} --run {run_id}")


def is_connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, HostError) and not isinstance(exc, RemoteCommandError)
