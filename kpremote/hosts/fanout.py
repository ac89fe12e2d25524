"""One way to do things on several hosts at once: each in a daemon thread of its own, its outcome a Future.

A daemon thread never holds the process at exit, so a Ctrl-C leaves at once whatever the hosts are doing (the
cancels of runs/interrupt.py, the runs of runs/placement.py, every host of gpu-status or status). on_every_host is
the common case: ask(host, agent) on every host, one connection each, the answers in host order.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

if TYPE_CHECKING:
    from .agentclient import Agent
    from .config import Host

T = TypeVar("T")
AT_ONCE = 32
"""How many hosts on_every_host asks at the same moment: the rest wait for a connection to end."""


def in_daemon_thread(fn: Callable[..., T], *args: Any, name: str = "kpremote-fanout") -> "Future[T]":
    """fn(*args) started now in a daemon thread; its result, or what it raised, comes through the Future."""
    future: Future = Future()

    def body() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread through the future
            future.set_exception(exc)

    threading.Thread(target=body, daemon=True, name=name).start()
    return future


def on_every_host(hosts: list["Host"], ask: Callable[["Host", "Agent"], T],
                  waiting_for: Optional[Callable[[list[str]], None]] = None) -> list[T]:
    """Run ask(host, agent) on all hosts in parallel (AT_ONCE at most), one connection each; results in host order,
    the first exception (in host order) raised. waiting_for(names) hears which hosts have not answered yet, at the
    start and after each answer."""
    # Imported here, not at the top: interrupt.py, loaded first for Ctrl-C, uses in_daemon_thread.
    from .agentclient import Agent
    from .connect import open_transport

    pending = [h.name for h in hosts]
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(AT_ONCE)

    def one(host: "Host") -> T:
        try:
            with slots:
                transport = open_transport(host)
                try:
                    return ask(host, Agent(host, transport))
                finally:
                    transport.close()
        finally:
            if waiting_for is not None:
                with lock:
                    pending.remove(host.name)
                    waiting_for(list(pending))

    if not hosts:
        return []
    if waiting_for is not None:
        waiting_for(list(pending))
    futures = [in_daemon_thread(one, host, name="kpremote-host") for host in hosts]
    return [future.result() for future in futures]
