"""Invoke entry point: `inv --list` shows every kpremote command, parsed with kpremote's contract (program.py)."""

from kpremote.commands import ns  # noqa: F401
from kpremote.program import use_kpremote_parsing

use_kpremote_parsing()
