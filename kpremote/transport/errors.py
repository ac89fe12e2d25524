"""What a transport raises: a host that cannot be reached or used, a host key refused; and the root they share.

The root of every error kpremote shows as one line lives here, at the bottom of the import graph, so that the
transport needs nothing of the client and an unreachable host is still one line and exit 2 like any other error
(kpremote/errors.py adds the client's own kinds).
"""

from __future__ import annotations


class KpremoteError(Exception):
    """Base class: its message is complete and is printed as is."""


class HostError(KpremoteError):
    """A host could not be reached or used; the message starts with the host's name."""

    def __init__(self, host: str, cause: str) -> None:
        super().__init__(f"{host}: {cause}")
        self.host = host
        self.cause = cause


class HostKeyError(HostError):
    """The host's key is unknown or changed: refused, never trusted silently."""
