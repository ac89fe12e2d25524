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


def unknown_host_key(host: str, what: str, known_hosts: str, key_type: str, fingerprint: str) -> HostKeyError:
    """The refusal of a key known_hosts does not hold; `what` is the entry, prefixed by "jump host (...)" for a hop."""
    return HostKeyError(
        host,
        f"host key of {what} is not in {known_hosts} ({key_type} {fingerprint}); nothing was sent. If that "
        f"fingerprint is right, accept it with: inv trust-host --host {host} --fingerprint {fingerprint}",
    )


def changed_host_key(host: str, what: str, entry: str, known_hosts: str, expected: tuple[str, str],
                     offered: tuple[str, str]) -> HostKeyError:
    """The refusal of a key that differs from the one known_hosts holds for `entry`; keys as (type, fingerprint)."""
    fingerprint = offered[1]
    return HostKeyError(
        host,
        f"HOST KEY CHANGED for {what}: known_hosts has {expected[0]} {expected[1]}, the server offers "
        f"{offered[0]} {fingerprint}. Refusing to connect: someone may be intercepting, or the host was reinstalled. "
        f"If you verified that {fingerprint} is its new key: inv trust-host --host {host} --fingerprint "
        f"{fingerprint} (replaces the old key; or ssh-keygen -R '{entry}' -f {known_hosts})",
    )


def not_ssh(where: str) -> str:
    """Why a port that answered with something other than an SSH greeting was refused."""
    return f"{where} answered, but not as an SSH server (is that the right port?)"


def no_greeting(where: str, seconds: float) -> str:
    """Why a port that accepted the connection and then said nothing was given up on."""
    return (f"unreachable: {where} accepted the connection but sent no SSH greeting within {seconds:g} s "
            "(not an SSH port, or its sshd is stuck)")
