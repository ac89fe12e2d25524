"""The agent's command line with the stand-in runner (kp_standin_runner.py) spawned for a timing run, for tests of
`start` in a subprocess: `python -m kp_standin_agent start ...` is `python -m kpremote.agent start ...` otherwise."""

from __future__ import annotations

import sys

from kpremote.agent import protocol
from kpremote.agent.__main__ import main

if __name__ == "__main__":
    protocol.RUNNERS[protocol.TIMING] = "kp_standin_runner"
    sys.exit(main())
