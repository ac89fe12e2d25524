"""How a run stops before its end: a signal (Cancelled), or a step that cannot go on (Abort, with the exit code and
the state status the run ends with). The runner's steps raise them (runner.py and the steps beside it)."""

from __future__ import annotations

from ..protocol import RunExit


class Cancelled(Exception):
    """SIGTERM or SIGINT arrived: stop the current worker, record the run as cancelled."""


class Abort(Exception):
    """The run cannot go on; carries the exit code and the state status."""

    def __init__(self, message: str, exit_code: int = RunExit.INFRA, status: str = "error") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


StopVerdict = dict  # {status, exit_code, message, ended_by}: how a run a signal stopped ended, when not cancelled
