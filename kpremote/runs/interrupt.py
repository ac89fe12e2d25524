"""Ctrl-C at the terminal: one press cancels on its host everything this client started, and exits 130 in 2 s.

The model (docs/architecture.md, "Interruptions"):
- every run id is chosen by the client and registered here *before* its start is sent, so a Ctrl-C at any moment
  (connecting, syncing, starting, waiting for a GPU, following) knows what may exist on which host;
- the first SIGINT raises KeyboardInterrupt in the main thread; the command wrapper (cli.py) then closes the
  registry (no new start goes out), cancels every registered run in parallel, each on a fresh connection, with
  `cancel --pending` (a start still on its way refuses to begin) and a short SIGTERM grace, within
  CANCEL_BUDGET_S, prints what happened to each run id, and exits 130;
- later presses are noted and ignored, so a second Ctrl-C cannot cut the cancels short;
- the exit is os._exit(130) after a flush (leave_now), never Python's shutdown: it never waits on a thread.
The host side backs this up: a start whose client vanished stops by itself before its runner begins.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..errors import KpremoteError, Stopping
from ..hosts.fanout import in_daemon_thread

if TYPE_CHECKING:
    from ..hosts.config import Host

CANCEL_BUDGET_S = 1.4
"""How long the cancels may take, all together: connect, cancel on the host, answer."""
HOST_GRACE_S = 0.5
"""SIGTERM to SIGKILL on the host, for a cancel made by Ctrl-C (`inv cancel` gives a run longer)."""


@dataclass(frozen=True, eq=False)
class Registered:
    host: "Host"
    task: str
    run_id: str
    transport: Any = None  # the run's own connection: a cancel on a new channel of it skips a handshake


class Registry:
    """The run ids this client may have brought into being on hosts and not yet seen end."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the SIGINT handler may close it while the main thread is inside add()
        self._runs: dict[tuple[str, str], Registered] = {}
        self.closed = False

    def add(self, host: "Host", task: str, run_id: str, transport: Any = None) -> Registered:
        with self._lock:
            if self.closed:
                raise Stopping()
            entry = Registered(host, task, run_id, transport)
            self._runs[(host.name, run_id)] = entry
            return entry

    def discard(self, host_name: str, run_id: str) -> None:
        with self._lock:
            self._runs.pop((host_name, run_id), None)

    def close(self) -> list[Registered]:
        """No more starts; what is registered now is what a Ctrl-C must cancel."""
        with self._lock:
            self.closed = True
            return list(self._runs.values())

    def reopen(self) -> None:
        with self._lock:
            self.closed = False
            self._runs.clear()


REGISTRY = Registry()


class SigintHandler:
    """The first Ctrl-C raises KeyboardInterrupt; every later one only says that the cancels are under way."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.pressed = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.pressed += 1
        if self.pressed == 1:
            begin_cancels()  # at once, while the main thread unwinds: the 2 s start now, not after the unwinding
            raise KeyboardInterrupt
        self.say("still cancelling what was started (a few seconds at most) ...")


def install_early() -> None:
    """Until a command runs, nothing has been started: a Ctrl-C then just leaves, with 130 (not Invoke's 1)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _leave_at_once)


def _leave_at_once(signum: int, frame: Any) -> None:
    sys.stderr.write("error: interrupted (nothing was started)\n")
    sys.stderr.flush()
    os._exit(130)


def install(say: Callable[[str], None]) -> Optional[SigintHandler]:
    """Take over SIGINT for this command (main thread only; elsewhere Python's default stays)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = SigintHandler(say)
    signal.signal(signal.SIGINT, handler)
    return handler


class Cancels:
    """The cancels of everything registered, running in daemon threads from the moment they are begun."""

    def __init__(self, registry: Registry, budget_s: float) -> None:
        self.entries = registry.close()
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.results: dict[Registered, str] = {}
        self.sent: set[Registered] = set()  # the runs whose cancel request went out
        self.cancels = [in_daemon_thread(_cancel_one, entry, self.results, budget_s, self.sent, name="kpremote-cancel")
                        for entry in self.entries]

    def finish(self, say: Callable[[str], None]) -> list[str]:
        wait(self.cancels, timeout=max(0.0, self.deadline - time.monotonic()))
        lines = []
        for entry in self.entries:
            line = self.results.get(entry) or self._unanswered(entry)
            lines.append(line)
            say(line)
        return lines


    def _unanswered(self, entry: Registered) -> str:
        """A cancel without an answer in time: sent on the run's own connection (a loaded link answers late, after
        the cancel is done), or waiting for a connection of its own; and how to see which."""
        where = f"run {entry.run_id} on {entry.host.name}"
        if entry in self.sent:
            return (f"{where}: cancel sent, its answer did not come within {self.budget_s:g} s; see whether it still "
                    f"runs with: inv status --host {entry.host.name}")
        return (f"{where}: no answer to its cancel within {self.budget_s:g} s (it needed a connection of its own); "
                f"check with: inv cancel --host {entry.host.name} --run {entry.run_id}")


_begun: Optional[Cancels] = None


def begin_cancels(registry: Registry = REGISTRY, budget_s: float = CANCEL_BUDGET_S) -> Cancels:
    global _begun
    if _begun is None:
        _begun = Cancels(registry, budget_s)
    return _begun


def cancel_registered(say: Callable[[str], None], registry: Registry = REGISTRY,
                      budget_s: float = CANCEL_BUDGET_S) -> list[str]:
    """Cancel every registered run on its host, in parallel, within budget_s (counted from the Ctrl-C when the
    handler began them); one line said per run id."""
    return begin_cancels(registry, budget_s).finish(say)


def _cancel_one(entry: Registered, results: dict, budget_s: float, sent: Optional[set] = None) -> None:
    """On a new channel of the run's own connection if it still stands (no handshake: the 2 s hold under load),
    else on a fresh connection."""
    # Imported here, not at the top: interrupt.py loads first, so that Ctrl-C is handled before the heavier modules.
    from ..hosts.agentclient import Agent, agent_subcommand
    from ..hosts.connect import open_transport

    cancel = agent_subcommand(entry.host, "cancel")  # a Slurm cluster's run: slurm-cancel, i.e. scancel
    args = ["--task", entry.task, "--run", entry.run_id, "--pending", "--grace", str(HOST_GRACE_S)]
    fresh = None
    first_try = False
    try:
        try:
            if entry.transport is None:
                raise KpremoteError("no connection to reuse")
            first_try = True
            _note_sent(sent, entry)
            answer = Agent(entry.host, entry.transport).call_json(cancel, *args, timeout=budget_s)
        except KpremoteError:
            # The run's own thread may close that connection once it sees the run end (our cancel did it): ask
            # again on a fresh one; "already ended (cancelled)" then is this cancel's doing.
            fresh = Agent(entry.host, open_transport(entry.host))
            answer = fresh.call_json(cancel, *args, timeout=budget_s)
            if first_try and (answer.get("state") or {}).get("status") == "cancelled":
                answer = {**answer, "cancelled": True}
        results[entry] = _describe(entry, answer)
    except Exception as exc:  # noqa: BLE001 - whatever went wrong is said in the run's one line
        results[entry] = (f"could not cancel run {entry.run_id} on {entry.host.name}: {exc}; check with: "
                          f"inv cancel --host {entry.host.name} --run {entry.run_id}")
    finally:
        if fresh is not None:
            fresh.transport.close()


def _note_sent(sent: Optional[set], entry: Registered) -> None:
    if sent is not None:
        sent.add(entry)


def _describe(entry: Registered, answer: dict) -> str:
    state = answer.get("state") or {}
    where = f"run {entry.run_id} on {entry.host.name}"
    if not answer.get("cancelled"):
        return f"{where} had already ended ({state.get('status', '?')})"
    if state.get("phase") == "never started":
        return f"cancelled {where} before it began: its start will not run"
    if state.get("scheduler") == "slurm":
        return f"cancelled {where}: Slurm job {state.get('job_id') or '(not submitted)'} is scancelled"
    if not state.get("pgid"):
        return f"cancelled {where} before its runner began: nothing runs, no GPU is leased"
    return f"cancelled {where}: its processes are gone and its GPU lease is released"


def leave_now(code: int) -> None:
    """Exit at once with code, output flushed, without Python's shutdown: a start thread may be inside native code
    (paramiko's key exchange in cryptography's Rust), and a daemon thread stopped there at shutdown aborts the whole
    process ("FATAL: exception not rethrown", exit -6) instead of exiting 130. Nothing is left to tidy by then: the
    cancels are done and every `with` block the KeyboardInterrupt crossed has closed.
    Python's own exit would also lose the code: under `python -m` (how `inv` is often run) CPython kills itself with
    SIGINT at the end when a KeyboardInterrupt once passed out of an exec() of a string, caught or not (dataclasses
    and namedtuple make their methods that way, at import), so a press landing in a lazy import ended -2, not 130."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
