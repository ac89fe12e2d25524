"""`inv run` starts without the heavy modules it does not use before its first remote command: pydantic (~85 ms of
CPU, benchmarks/README.md), paramiko on an OpenSSH host, matplotlib, numpy, torch, jsonschema. Python's own
`-X importtime` names what the start really imports, functions' imports included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What `inv run` imports before its first remote command, in its order: tasks.py's commands, then run()'s own
# (connect_early, the checks of its tasks, the ledger, placement) and the hosts file read through config.
RUN_START = """
import kpremote.commands
from kpremote.cli import options
from kpremote.results import ledger
from kpremote.runs import eventstream, placement, remote
from kpremote.hosts import connect
from kpremote.task import baseline
from kpremote.agent.task import taskspec
from kpremote.transport import openssh
from kpremote.hosts.config import load_inventory
load_inventory({hosts!r}).select(None)
"""
HEAVY = {"pydantic", "paramiko", "matplotlib", "numpy", "torch", "triton", "jsonschema",
         "kpremote.transport.ssh", "kpremote.hosts.gpustatus"}


def imported_by(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def test_inv_runs_start_imports_none_of_the_heavy_modules():
    imported = imported_by(RUN_START.format(hosts=str(REPO / "hosts.toml")))
    assert "kpremote.runs.placement" in imported and "kpremote.hosts.config" in imported
    assert imported & HEAVY == set()


@pytest.mark.parametrize("creeping", ["import pydantic", "from kpremote.hosts import gpustatus"])
def test_the_check_sees_a_heavy_import_creep_back(creeping):
    imported = imported_by(RUN_START.format(hosts=str(REPO / "hosts.toml")) + creeping + "\n")
    assert imported & HEAVY


def test_a_hosts_file_with_a_mistake_is_refused_without_pydantic_too(tmp_path):
    """hosts.toml has one reader, standard library only: a value it refuses is worded without pydantic as well."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.a]\nssh = "a"\nconnect_timeout = "10"\n')
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN_START.format(hosts=str(hosts))], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "connect_timeout = '10': expected a number" in done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "kpremote.hosts.config" in imported and imported & HEAVY == set()
