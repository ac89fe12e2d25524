"""Errors the client shows as one line, never as a traceback: the whole tree, in one place to import from."""

from __future__ import annotations

# The root and the host errors are the transport's (it raises them and imports nothing of the client); the client's
# modules and the tests import every error from here.
from .transport.errors import HostError, HostKeyError, KpremoteError

__all__ = ["ConfigError", "HostError", "HostKeyError", "KpremoteError", "RemoteCommandError"]


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
