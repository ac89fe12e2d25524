"""The host's Python for bench_follow.py: `standin_agent.py -c BOOT ROOT HASH SUBCOMMAND ...` runs BOOT as
`python -c` would, except that the agent it loads spawns the stand-in runner (standin_events.py) for a timing run.

The agent has no flag to name another runner: this patches protocol.RUNNERS as the shipped agent's protocol module
is loaded (tests/agent/kp_standin_agent.py does the same for the test suite).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

RUNNER_MODULE = "standin_events"


class StandinRunner(importlib.abc.MetaPathFinder):
    """Finds kpremote.agent.protocol where Python would, and patches its RUNNERS once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "kpremote.agent.protocol":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def load_patched(module: Any) -> None:
            load(module)
            module.RUNNERS[module.TIMING] = RUNNER_MODULE

        spec.loader.exec_module = load_patched
        return spec


if __name__ == "__main__":
    if sys.argv[1:2] != ["-c"]:
        sys.exit("usage: standin_agent.py -c BOOT ROOT HASH SUBCOMMAND [ARGS...]")
    boot, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    sys.meta_path.insert(0, StandinRunner())
    exec(compile(boot, "<BOOT>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the client's own BOOT
