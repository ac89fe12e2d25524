"""The agent's command line with the stand-in runner (kp_standin_runner.py) spawned for a timing run, for tests of
`start` in a subprocess: `python -m kp_standin_agent start ...` is `python -m kpremote.agent start ...` otherwise."""

from __future__ import annotations

import sys

from kpremote.agent import protocol, runs  # noqa: F401 - runs first: its TASK_RUNNERS stay the real ones, so
from kpremote.agent.__main__ import main    # start does not check the stand-in's task folder (it has no task.toml)

if __name__ == "__main__":
    protocol.RUNNERS[protocol.TIMING] = "kp_standin_runner"
    sys.exit(main())
