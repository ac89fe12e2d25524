"""What starting a run gives the client: the started run's record, and the one rule for a start the host did not
make (stopped before it began, or failed). runs.start_run and slurm.submit_run (a Slurm cluster) both use them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..agent.protocol import ExitCode
from ..hosts.agentclient import error_message
from ..hosts.config import Host
from ..errors import RemoteCommandError, StartStopped
from ..transport import Completed


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
