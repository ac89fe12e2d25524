"""Errors the client shows as one line, never as a traceback."""

from __future__ import annotations


class KpremoteError(Exception):
    """Base class: its message is complete and is printed as is."""


class ConfigError(KpremoteError):
    """hosts.toml (or another input file) is wrong; the message names file, table and field."""


class BaselineError(KpremoteError):
    """The baseline could not be pinned (or re-created); nothing was written."""


class HostError(KpremoteError):
    """A host could not be reached or used; the message starts with the host's name."""

    def __init__(self, host: str, cause: str) -> None:
        super().__init__(f"{host}: {cause}")
        self.host = host
        self.cause = cause


class HostKeyError(HostError):
    """The host's key is unknown or changed: refused, never trusted silently."""


class RemoteCommandError(HostError):
    """A remote command failed; carries its exit code and the tail of its stderr."""

    def __init__(self, host: str, cause: str, exit_code: int, stderr: str = "") -> None:
        super().__init__(host, cause)
        self.exit_code = exit_code
        self.stderr = stderr
