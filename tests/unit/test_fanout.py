"""The one fan-out (kpremote/hosts/fanout.py): every host at once, answers in host order, daemon threads only."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from kpremote.hosts import fanout
from kpremote.hosts.config import Host


def hosts_like(host: Host, names: list[str]) -> list[Host]:
    return [dataclasses.replace(host, name=name) for name in names]


def test_every_host_is_asked_at_once_and_answers_come_in_host_order(host):
    delays = {"slow": 0.4, "fast": 0.0, "middle": 0.2}
    threads: set[str] = set()

    def ask(h: Host, agent) -> str:
        threads.add(threading.current_thread().name)
        assert threading.current_thread().daemon  # a Ctrl-C never waits for a host
        time.sleep(delays[h.name])
        return h.name

    started = time.monotonic()
    assert fanout.on_every_host(hosts_like(host, list(delays)), ask) == ["slow", "fast", "middle"]
    assert time.monotonic() - started < 0.55  # together, not 0.6 s one after another
    assert threads == {"kpremote-host"}


def test_waiting_for_hears_who_has_not_answered_yet(host):
    heard: list[list[str]] = []
    fanout.on_every_host(hosts_like(host, ["a", "b"]), lambda h, agent: time.sleep(0.1 if h.name == "a" else 0),
                         heard.append)
    assert heard == [["a", "b"], ["a"], []]


def test_what_a_host_raised_comes_back_to_the_caller(host):
    def ask(h: Host, agent) -> None:
        raise RuntimeError(f"{h.name} failed")

    with pytest.raises(RuntimeError, match="^a failed$"):
        fanout.on_every_host(hosts_like(host, ["a", "b"]), ask)


def test_at_most_so_many_hosts_are_asked_at_the_same_moment(host, monkeypatch):
    monkeypatch.setattr(fanout, "AT_ONCE", 2)
    busy, most = [0], [0]
    lock = threading.Lock()

    def ask(h: Host, agent) -> None:
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.05)
        with lock:
            busy[0] -= 1

    fanout.on_every_host(hosts_like(host, [f"h{i}" for i in range(6)]), ask)
    assert most[0] == 2


def test_a_daemon_threads_future_carries_its_result_or_its_exception():
    assert fanout.in_daemon_thread(lambda x: x * 2, 21).result(5) == 42
    with pytest.raises(ZeroDivisionError):
        fanout.in_daemon_thread(lambda: 1 / 0).result(5)
