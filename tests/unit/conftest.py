"""The fast suite's fixtures: an agent answered in this process (InProcessTransport), a task folder, fixture GPUs.

Everything the agent writes lands under tmp_path/remote, as it would under a host's remote_root; the only stand-ins
are the NVML fixture file and, for `start`, the stand-in runner of tests/agent (a real detached process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from unit.helpers import FILES, STANDIN_HOME, TASK, gpu, write

from kpremote.agent import protocol
from kpremote.hosts.agentclient import Agent
from kpremote.hosts.config import Host, parse_inventory
from kpremote.hosts.inprocessagent import InProcessTransport


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPREMOTE_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """gpus(*records): what NVML reports on the in-process host from now on."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("KPREMOTE_NVML_FIXTURE", str(path))

    def set_gpus(*records: dict[str, Any]) -> None:
        write(path.with_suffix(".tmp"), json.dumps({"driver": "570.00", "gpus": list(records)}))
        os.replace(path.with_suffix(".tmp"), path)

    set_gpus(gpu(0))
    return set_gpus


@pytest.fixture
def host(tmp_path: Path) -> Host:
    inventory = parse_inventory({"hosts": {"unit": {"transport": "local", "remote_root": str(tmp_path / "remote"),
                                                    "arch": "any"}}}, tmp_path / "hosts.toml")
    return inventory.hosts["unit"]


@pytest.fixture
def agent(host: Host) -> Agent:
    return Agent(host, InProcessTransport(host.name))


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        write(tmp_path / "kernels" / TASK / rel, text)
    return tmp_path / "kernels"


@pytest.fixture
def standin_runs(monkeypatch: pytest.MonkeyPatch, kernels: Path) -> Callable[..., None]:
    """`start` spawns the stand-in runner (tests/agent/kp_standin_runner.py) instead of the timing runner;
    plan(**behaviour) sets what it does (see its docstring)."""
    monkeypatch.setitem(protocol.RUNNERS, protocol.TIMING, "kp_standin_runner")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_HOME))

    def plan(**behaviour: Any) -> None:
        write(kernels / TASK / "standin.json", json.dumps(behaviour))

    plan(events=1)
    return plan
