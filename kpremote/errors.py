"""Errors the client shows as one line, never as a traceback: the whole tree, in one place to import from."""

from __future__ import annotations

# The root and the host errors are the transport's (it raises them and imports nothing of the client); the client's
# modules and the tests import every error from here.
from .transport.errors import HostError, HostKeyError, KpremoteError

__all__ = ["BadOption", "BaselineError", "ConfigError", "FetchRefused", "HostBusy", "HostCannotTake", "HostError",
           "HostKeyError", "KpremoteError", "RemoteCommandError", "ScaffoldError", "StartStopped", "Stopping",
           "StoppedByUser", "TaskRefusedByHost", "UnsafeArchive", "WheelError"]


class ConfigError(KpremoteError):
    """hosts.toml (or another input file) is wrong; the message names file, table and field."""


class BaselineError(KpremoteError):
    """The baseline could not be pinned (or re-created); nothing was written."""


class RemoteCommandError(HostError):
    """A remote command failed; carries its exit code and the tail of its stderr."""

    def __init__(self, host: str, cause: str, exit_code: int, stderr: str = "") -> None:
        super().__init__(host, cause)
        self.exit_code = exit_code
        self.stderr = stderr


class BadOption(KpremoteError):
    """An option's value is not one the command accepts."""


class FetchRefused(KpremoteError):
    """A fetch that would lose or overwrite something, or that has nothing to fetch."""


class UnsafeArchive(KpremoteError):
    """The archive holds something that could write outside its destination, or is not a readable tar."""


class ScaffoldError(KpremoteError):
    """The task cannot be created; the message says why."""


class WheelError(KpremoteError):
    """A wheel could not be had, or does not hold what was asked; the message is one complete line."""


class HostBusy(KpremoteError):
    """Every GPU of the host is busy or leased: another host may take the task."""


class HostCannotTake(KpremoteError):
    """The host cannot run this task at all (its GPUs are the wrong arch): another host may."""


class TaskRefusedByHost(KpremoteError):
    """The agent refused the task or the request itself: no host would take it."""


class StartStopped(KpremoteError):
    """The start was cancelled before its run began."""


class Stopping(KpremoteError):
    """Ctrl-C was pressed: nothing new may be started."""

    def __init__(self) -> None:
        super().__init__("interrupted before it started")


class StoppedByUser(KeyboardInterrupt):
    """Ctrl-C ended a command that runs until it is pressed (gpu-status --watch, logs --follow): the documented way
    to stop it, so a calm line, not an error; it exits 130 all the same."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line
