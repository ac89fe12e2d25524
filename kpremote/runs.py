"""Remote runs: start detached (with the sync in the same channel), follow events, cancel, list.

A run costs three channels on one connection when nothing changed: start (sync + lease + spawn), follow
(the event stream until the end), pack-summary (the fetch). The agent keeps running if the connection drops.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel

from .agent.protocol import TERMINAL, ExitCode
from .agentclient import Agent, error_message
from .config import Host
from .errors import HostError, KpremoteError, RemoteCommandError
from .interrupt import REGISTRY
from .slurm import agent_subcommand  # Slurm clusters: the agent's slurm-* twins (issue 15)
from .sync import build_sync_request, have_listing, plan_sync, record_synced, scan_task, sync_task
from .transport import Completed, open_transport

NO_IDLE_GPU = ExitCode.NO_IDLE_GPU
ARCH_MISMATCH = ExitCode.ARCH_MISMATCH
TASK_REFUSED = ExitCode.BAD_REQUEST
NEED_FULL_SYNC = ExitCode.NEED_FULL_SYNC
START_CANCELLED = ExitCode.CANCELLED_BEFORE_START
REFUSALS = {"task_refused", "bad_request", "usage"}  # the request itself is wrong: no other host would take it
HEARTBEAT_GRACE_S = 5.0


class RunOptions(BaseModel):
    gpu: Optional[str] = None
    wait: Optional[float] = None
    workloads: Optional[str] = None
    mode: Optional[str] = None
    profile: Optional[str] = None  # a profile run: its protocol.ProfileRequest as JSON (start --profile)
    device: str = "auto"
    audit: bool = True  # False: --no-audit, the run is labelled "unaudited: --no-audit"


class StartedRun(BaseModel):
    host: str
    task: str
    run_id: str
    gpu: Optional[dict[str, Any]] = None
    synced_files: Optional[int] = None
    job_id: Optional[str] = None  # a Slurm cluster's job


class NoIdleGpu(KpremoteError):
    """Every GPU of the host is busy or leased: another host may take the task."""


class HostCannotTake(KpremoteError):
    """The host cannot run this task at all (its GPUs are the wrong arch): another host may."""


class TaskRefusedByHost(KpremoteError):
    """The agent refused the task or the request itself: no host would take it."""


class StartStopped(KpremoteError):
    """The start was cancelled before its run began."""


@dataclass
class RunSession:
    """One host's connection, reused by every step of a run."""

    host: Host
    agent: Agent = field(init=False)

    def __post_init__(self) -> None:
        self.agent = Agent(self.host, open_transport(self.host))

    @property
    def channels(self) -> int:
        return self.agent.transport.channels.opened

    def close(self) -> None:
        self.agent.transport.close()


def new_run_id() -> str:
    """A run id in the agent's form, chosen here: the client can cancel a run before it hears back from the host."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def start_run(session: RunSession, task: str, kernels_dir: Path, options: RunOptions, run_id: Optional[str] = None,
              on_waiting: Optional[Callable[[str, dict[str, Any]], None]] = None) -> StartedRun:
    """Sync the task and start its run in one channel; a second only when the host's workspace was not as expected.

    run_id (default: a new one) is the id the run gets: whoever holds it can cancel the run from now on, even
    while the start is still syncing or waiting. on_waiting(host, event) hears what a --wait start waits for.
    """
    run_id = run_id or new_run_id()
    if session.host.is_cluster:  # Slurm: the same sync, then sbatch instead of a lease (kpremote/slurm.py)
        from .slurm import submit_run

        return submit_run(session, task, kernels_dir, options, run_id)
    args = [*_start_args(session.host, task, options), "--run-id", run_id, "--progress"]
    session.agent.transport.connect_soon()  # the handshake's round trips pass while the task is scanned
    plan = plan_sync(session.host, scan_task(kernels_dir, task))
    session.agent.transport.connect()
    # From the moment the start may reach the host, a Ctrl-C cancels this run id there (interrupt.py).
    REGISTRY.add(session.host, task, run_id, session.agent.transport)
    try:
        result = _call_start(session, [*args, "--sync"], build_sync_request(plan), on_waiting)
        if result.exit_code == NEED_FULL_SYNC:
            listing = have_listing(session.host, json.loads(result.stdout))
            report = sync_task(session.agent, task, kernels_dir, have=listing)
            result = _call_start(session, args, None, on_waiting)
            return _started(session.host, task, result).model_copy(update={"synced_files": report.files_sent})
        started = _started(session.host, task, result)
    except (NoIdleGpu, HostCannotTake, TaskRefusedByHost, StartStopped):
        REGISTRY.discard(session.host.name, run_id)  # the host answered: no run exists
        raise
    synced = _last_json(result)["sync"]
    record_synced(session.host, plan, synced)
    return started.model_copy(update={"synced_files": synced.get("received_files")})


def _call_start(session: RunSession, args: list[str], stdin, on_waiting) -> Completed:
    """`start --progress`: JSON lines as they come (waiting lines go to on_waiting); the last one is the answer."""
    received = bytearray()
    done = 0

    def feed(chunk: bytes) -> None:
        nonlocal done
        received.extend(chunk)
        while (newline := received.find(b"\n", done)) >= 0:
            line, done = bytes(received[done:newline]), newline + 1
            if on_waiting is not None and line.startswith(b'{"event": "waiting"'):
                on_waiting(session.host.name, json.loads(line))

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
    args = ["--task", task, "--idle", host.idle.model_dump_json(), "--arch", host.arch, "--host-alias", host.name,
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
        raise NoIdleGpu(f"{host.name}: {error_message(result)}")
    if result.exit_code == ARCH_MISMATCH:
        raise HostCannotTake(f"{host.name}: {error_message(result)}")
    if result.exit_code == TASK_REFUSED and _last_json(result).get("error") in REFUSALS:
        raise TaskRefusedByHost(f"{host.name} refused the task: {error_message(result)}")
    if result.exit_code == START_CANCELLED:
        raise StartStopped(f"{host.name}: {error_message(result)}")
    if not result.ok:
        raise RemoteCommandError(host.name, f"could not start the run: {error_message(result)}", result.exit_code,
                                 result.stderr_tail())
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
            event = json.loads(line)
            if event.get("event") == "end":
                final.update(event.get("state", {}))
                if event.get("summary") and summary_sink is not None:
                    tar_follows = True
                    if pending:
                        summary_sink(bytes(pending))
                    return
            elif event.get("event") != "heartbeat":
                on_event(event)

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


def cancel_run(session: RunSession, task: str, run_id: str, *, pending: bool = False,
               grace_s: Optional[float] = None) -> dict[str, Any]:
    """Cancel a run; with pending, also one whose start has not reached the host yet (it will refuse to begin)."""
    args = ["--task", task, "--run", run_id, *(["--pending"] if pending else [])]
    args += ["--grace", str(grace_s)] if grace_s is not None else []
    return session.agent.call_json(agent_subcommand(session.host, "cancel"), *args)  # a cluster's: scancel


def list_runs(session: RunSession, task: Optional[str] = None) -> list[dict[str, Any]]:
    args = ["--task", task] if task else []
    return session.agent.call_json(agent_subcommand(session.host, "status"), *args).get("runs", [])


def find_task_of_run(session: RunSession, run_id: str) -> str:
    for run in list_runs(session):
        if run.get("run_id") == run_id:
            return run["task"]
    raise KpremoteError(f"{session.host.name}: no run {run_id!r} (see: inv status --host {session.host.name})")


def reattach_hint(host: str, task: str, run_id: str) -> str:
    return (f"the run goes on on {host}. Re-attach: inv logs --host {host} --run {run_id} --follow; "
            f"results: inv fetch-results --host {host} --task {task} --run {run_id}")


def is_connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, HostError) and not isinstance(exc, RemoteCommandError)
