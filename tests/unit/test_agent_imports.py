"""What a host's Python imports to answer `probe`, the one call `inv gpu-status` makes on every host at once.

The call runs as the client sends it (Agent.argv: `PYTHON -c BOOT ROOT HASH probe ...`, the agent shipped on the
first try) through the local transport, a real subprocess, with `-X importtime` to list what it imports after the
interpreter's own start (site). Every module there is CPU on every host for every query: torch, triton and the
client's libraries must never be among them, and the agent's modules are exactly the ones a probe needs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable

from unit.helpers import gpu

from kpremote.hosts.agentclient import Agent
from kpremote.hosts.config import Host
from kpremote.transport.local import LocalTransport

PROBE_NEEDS = {"kpremote", "kpremote.agent", "kpremote.agent.__main__", "kpremote.agent.protocol",
               "kpremote.agent.record", "kpremote.agent.lease", "kpremote.agent.nvml"}
"""The agent's modules a probe imports: its command line, the records (record.py checks a GPU record's types), the
lease holders, the GPU readings."""
NEVER_ON_A_PROBE = {
    "torch", "triton", "numpy",  # seconds of import: a run's, never a query's
    "pydantic", "rich", "paramiko", "invoke",  # the client's libraries: not on a host at all
    "socket", "hashlib", "secrets", "datetime", "getpass",  # stdlib a probe does not use (nvml reads uname)
}


def imports_after_start(stderr: str) -> list[str]:
    """The modules `-X importtime` lists after `site`: what the command imported, not the interpreter's start."""
    names = [line.split("|")[-1].rstrip() for line in stderr.splitlines() if line.startswith("import time:")]
    top_level_site = names.index(" site")
    return [name.strip() for name in names[top_level_site + 1:]]


def probe_with_importtime(host: Host, tmp_path: Path) -> tuple[dict, list[str]]:
    """Run `probe` as gpu-status does, through a host python that is this interpreter with -X importtime."""
    python = tmp_path / "python-importtime"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -X importtime "$@"\n')
    python.chmod(0o755)
    host = dataclasses.replace(host, python=str(python))
    agent = Agent(host, LocalTransport(host.name))
    result = agent.call("probe", "--idle", host.idle.to_json(), "--arch", host.arch)
    assert result.ok, result.stderr_tail(5)
    assert agent.shipped == 1  # the answer is from the call after the ship: a plain probe, as at every later query
    return json.loads(result.stdout), imports_after_start(result.stderr.decode())


def test_a_probe_imports_only_what_it_needs(host: Host, gpus: Callable[..., None], tmp_path: Path):
    answer, imported = probe_with_importtime(host, tmp_path)
    assert [gpu["uuid"] for gpu in answer["gpus"]] == [gpu(0)["uuid"]]  # it answered: imports are real
    assert answer["gpus"][0]["idle"] is True
    assert {name for name in imported if name.startswith("kpremote")} == PROBE_NEEDS
    assert sorted(NEVER_ON_A_PROBE & {name.split(".")[0] for name in imported} | NEVER_ON_A_PROBE & set(imported)) == []


def test_the_list_starts_after_the_interpreters_own_start():
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       100 |        100 |   certifi",
        "import time:       200 |        300 | site",
        "import time:        50 |         50 |   json.decoder",
        "import time:        60 |        110 | json",
    ])
    assert imports_after_start(stderr) == ["json.decoder", "json"]
