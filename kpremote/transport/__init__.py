"""Ways to run commands on a host: on this machine, over SSH, inside a container on either.

The package knows nothing of hosts.toml: kpremote/connect.py picks the transport for an entry.
"""

from __future__ import annotations

from .base import ChannelCounter, Command, Completed, StdinSource, Transport, command_line
from .container import ContainerTransport
from .local import LocalTransport

__all__ = [
    "ChannelCounter",
    "Command",
    "Completed",
    "ContainerTransport",
    "LocalTransport",
    "StdinSource",
    "Transport",
    "command_line",
]
