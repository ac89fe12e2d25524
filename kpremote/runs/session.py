"""A run's session with its host, and what a start asks and gives: the connection every step of a run goes over
(RunSession, open_session), the options of a start (RunOptions), the started run's record (StartedRun), and the one
rule for a start the host did not make (stopped before it began, or failed). remote.start_run and slurm.submit_run
(a Slurm cluster) both start through them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..agent.protocol import ExitCode
from ..hosts.agentclient import Agent, error_message
from ..hosts.config import Host
from ..hosts.connect import open_transport
from ..errors import RemoteCommandError, StartStopped
from ..transport import Completed


@dataclass
class RunOptions:
    gpu: Optional[str] = None
    wait: Optional[float] = None
    workloads: Optional[str] = None
    mode: Optional[str] = None
    profile: Optional[str] = None  # a profile run: its protocol.ProfileRequest as JSON (start --profile)
    device: str = "auto"
    audit: bool = True  # False: --no-audit, the run is labelled "unaudited: --no-audit"


@dataclass
class RunSession:
    """One host's connection, reused by every step of a run: the agent it talks through, given when it is made
    (open_session makes the host's real one; tests give theirs)."""

    agent: Agent

    @property
    def host(self) -> Host:
        return self.agent.host

    @property
    def channels(self) -> int:
        return self.agent.transport.channels.opened

    def close(self) -> None:
        self.agent.transport.close()


def open_session(host: Host) -> RunSession:
    """A session over the host's own transport (SSH, local or a container; connect.open_transport)."""
    return RunSession(Agent(host, open_transport(host)))


@dataclass
class StartedRun:
    host: str
    task: str
    run_id: str
    gpu: Optional[dict[str, Any]] = None
    synced_files: Optional[int] = None
    job_id: Optional[str] = None  # a Slurm cluster's job


def raise_unless_started(host: Host, result: Completed, verb: str) -> None:
    """What every way of starting a run (start, slurm-submit) says when the host did not: stopped before it
    began, or failed."""
    if result.exit_code == ExitCode.CANCELLED_BEFORE_START:
        raise StartStopped(f"{host.name}: {error_message(result)}")
    if not result.ok:
        raise RemoteCommandError(host.name, f"could not {verb} the run: {error_message(result)}", result.exit_code,
                                 result.stderr_tail())
