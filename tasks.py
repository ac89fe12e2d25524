"""Invoke entry point: `inv --list` shows every kpremote command."""

from kpremote.tasks import ns  # noqa: F401
