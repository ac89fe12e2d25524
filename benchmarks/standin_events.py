"""A stand-in for kpremote.agent.run.runner that emits many row events at a steady pace (benchmarks/bench_follow.py).

Spawned by the agent's `start` in place of the timing runner (benchmarks/standin_agent.py), with the runner's own
arguments. Its plan comes from <task-dir>/standin.json: {"events": N, "seconds": S, "delay_s": D}. After D seconds
(0 if absent: time for an `inv logs --follow` to attach to a detached run first), it writes N `row` events evenly
over S seconds into raw/events.jsonl (in batches every 10 ms), then a small summary and the terminal state, as the
real runner does. Each row's message says when it was written ("written@<unix time>"): the view prints it, so
whoever reads the terminal knows how late each row was drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kpremote.agent.run.events import EventLog
from kpremote.agent.run.records import seal_summary
from kpremote.agent.run.runstate import update_state

BATCH_S = 0.01


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--task-dir", "--run-dir", "--device", "--gpu", "--lease-fd", "--workloads", "--mode", "--host-alias"):
        parser.add_argument(flag)
    args = parser.parse_args()
    run_dir = Path(args.run_dir)
    plan = json.loads((Path(args.task_dir) / "standin.json").read_text())
    total, seconds = int(plan["events"]), float(plan["seconds"])
    time.sleep(float(plan.get("delay_s", 0)))
    log = EventLog(run_dir / "raw" / "events.jsonl")
    update_state(run_dir, phase="workloads")
    log.emit("phase", phase="workloads", n=total)
    started = time.monotonic()
    for number in range(1, total + 1):
        due = started + seconds * number / total
        if due - time.monotonic() > BATCH_S:
            time.sleep(due - time.monotonic())
        # the message carries the moment of writing to the terminal, where the benchmark reads it back
        log.emit("row", i=number, n=total, workload=f"w{number:05d}", status="PASSED", speedup=1.0 + number % 7 / 10,
                 message=f"written@{time.time():.6f}")
    summary = run_dir / "summary"
    summary.mkdir(parents=True, exist_ok=True)
    (summary / "results.json").write_text(json.dumps({"smoke": True, "rows": total}))
    (summary / "results.md").write_text(f"# stand-in run\n\n{total} rows, all PASSED\n")
    sealed = seal_summary(run_dir)  # as the runner seals it: only a sealed summary leaves the host
    log.emit("done", status="passed", exit_code=0, **sealed)
    update_state(run_dir, status="passed", phase="done", exit_code=0, **sealed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
