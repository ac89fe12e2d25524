"""`inv run --no-audit` reaches the runner as `--audit off` (the run then reads "unaudited: --no-audit")."""

from __future__ import annotations

from pathlib import Path

from kpremote.agent.run.start import _runner_command
from kpremote.agent.run.startchecks import StartRequest
from kpremote.runs.remote import _start_args
from kpremote.runs.session import RunOptions


def test_the_client_asks_for_no_audit_only_when_told(host) -> None:
    assert "--audit" not in _start_args(host, "t", RunOptions())
    args = _start_args(host, "t", RunOptions(audit=False))
    assert args[args.index("--audit") + 1] == "off"


def test_the_agent_passes_it_to_the_runner() -> None:
    command = _runner_command(StartRequest(task="t", audit="off"), Path("/w"), Path("/r"), "cuda", None, None)
    assert command[command.index("--audit") + 1] == "off"
    assert "--audit" not in _runner_command(StartRequest(task="t"), Path("/w"), Path("/r"), "cuda", None, None)
