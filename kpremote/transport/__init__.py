"""Ways to run commands on a host: on this machine, over SSH, inside a container on either.

The package imports nothing of kpremote outside itself but the lock helper both halves share (agent/filelock.py;
tests/unit/test_transport_seam.py): kpremote/hosts/connect.py picks the transport for a hosts.toml entry, and
kpremote/hosts/inprocessagent.py is the agent answered in the test process.
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
