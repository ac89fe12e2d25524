"""Invoke entry point: `inv --list` shows every kpremote command."""

from kpremote.commands import ns  # noqa: F401
