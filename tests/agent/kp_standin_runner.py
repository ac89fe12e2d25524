"""Stand-in for kpremote.agent.run.runner in tests of `start`, spawned in its place (protocol.RUNNERS patched: the
standin_runner fixtures, or `python -m kp_standin_agent`).

Its behaviour comes from <task-dir>/standin.json: {"events": N, "every_s": s, "final": status,
"hold_s": s, "grandchild": bool, "die": bool, "ignore_term": bool}. It records what it was given in
<run-dir>/raw/standin.json so a test can check the command line, environment and inherited lease fd.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kpremote.agent.run.events import EventLog
from kpremote.agent.run.records import seal_summary
from kpremote.agent.run.runstate import update_state


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--task-dir", "--run-dir", "--device", "--gpu", "--lease-fd", "--workloads", "--mode", "--profile",
                 "--host-alias"):
        parser.add_argument(flag)
    args = parser.parse_args()
    run_dir = Path(args.run_dir)
    plan = json.loads((Path(args.task_dir) / "standin.json").read_text())
    if plan.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _record_what_we_got(run_dir, args)
    update_state(run_dir, phase="running")
    log = EventLog(run_dir / "raw" / "events.jsonl")
    if plan.get("grandchild"):
        child = subprocess.Popen(["sleep", "60"])
        (run_dir / "raw" / "grandchild.pid").write_text(str(child.pid))
    for n in range(plan.get("events", 3)):
        log.emit("tick", n=n)
        time.sleep(plan.get("every_s", 0.0))
    time.sleep(plan.get("hold_s", 0.0))
    if plan.get("die"):
        os._exit(1)
    _write_summary(run_dir)
    update_state(run_dir, status=plan.get("final", "passed"), phase="done", **seal_summary(run_dir))
    return 0


def _record_what_we_got(run_dir: Path, args: argparse.Namespace) -> None:
    lease_fd_open = False
    if args.lease_fd is not None:
        try:
            os.fstat(int(args.lease_fd))
            lease_fd_open = True
        except OSError:
            pass
    record = {
        "argv": sys.argv[1:],
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "lease_fd_open": lease_fd_open,
        "stdin_is_devnull": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
        "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "KPREMOTE_ROOT", "CUDA_VISIBLE_DEVICES")},
    }
    (run_dir / "raw" / "standin.json").write_text(json.dumps(record))


def _write_summary(run_dir: Path) -> None:
    """A summary as the runner leaves it; main seals it as the runner does (records.seal_summary)."""
    summary = run_dir / "summary"
    (summary / "plots").mkdir(parents=True, exist_ok=True)
    (summary / "results.json").write_text('{"headline": 1.0}')
    (summary / "plots" / "speedup.txt").write_text("1.0x")
    os.symlink("/etc/passwd", summary / "passwd-link")
    (run_dir / "raw" / "samples.txt").write_text("raw stays on the host")


if __name__ == "__main__":
    sys.exit(main())
