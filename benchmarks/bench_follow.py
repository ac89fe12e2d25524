"""Client CPU, peak memory and view lag of `inv run` following a run that emits 10,000 events.

Run: python benchmarks/bench_follow.py [--events 10000] [--seconds 20] [--repeats 3] [--rtt-ms 0]

The remote run is a stand-in runner (benchmarks/standin_events.py, spawned by the agent's
`start --runner-module`) that writes N row events evenly over S seconds. The client is the real `inv run`
command line, in a child process on a pseudo-terminal (so rich's live view draws as it does for a user),
with two hooks added from outside kpremote: `start` asks for the stand-in runner, and the moments the first
and last events reach the view are noted. Figures, medians over the repeats:
- lag: when a row's line is read back from the terminal, minus when the runner wrote it (each row's message
  carries that moment: "written@<unix time>"); p50, p99, max over all rows; target: within 0.5 s;
- CPU while following: the client process's user+system CPU from the first event to the last, over that wall
  time (all threads: paramiko's reader, the follow thread, the view's printer, rich's refresh); target < 5 %;
- whole process: CPU and wall of the entire `inv run` (start-up, start, follow, fetch), and its peak RSS
  (VmHWM from /proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

TASK = "events_task"
RUNNER_MODULE = "standin_events"
HEADERS = ["events", "over", "RTT", "lag p50", "lag p99", "lag max", "CPU while following (% of one core)",
           "whole `inv run`: CPU / wall", "peak RSS", "runs"]


# ------------------------------------------------------------------------------------------ the client (child)


def client_main(argv: list[str]) -> None:
    """`inv run ARGS...` in this process, with the two hooks; stats written to $KP_BENCH_STATS at the end."""
    started = time.monotonic()
    sys.path.insert(0, str(BENCH_DIR.parent))
    from invoke.main import program

    from kpremote import agentcall, view

    window: dict[str, Any] = {}
    call = agentcall.Agent.call

    def call_with_standin(self, subcommand: str, *args: str, **kwargs: Any):
        if subcommand == "start":
            args = (*args, "--runner-module", RUNNER_MODULE)
        return call(self, subcommand, *args, **kwargs)

    event = view.RunView.event

    def timed_event(self, key: str, payload: dict) -> None:
        event(self, key, payload)
        mark = (time.monotonic(), _cpu_seconds())
        window.setdefault("first", mark)
        window["last"] = mark

    agentcall.Agent.call = call_with_standin
    view.RunView.event = timed_event
    try:
        program.run(["inv", "--search-root", str(BENCH_DIR.parent), *argv], exit=False)
    finally:
        first, last = window.get("first", (0.0, 0.0)), window.get("last", (0.0, 0.0))
        stats = {
            "follow_wall_s": last[0] - first[0],
            "follow_cpu_s": last[1] - first[1],
            "process_cpu_s": _cpu_seconds(),
            "process_wall_s": time.monotonic() - started,
            "peak_rss_kb": _peak_rss_kb(),
        }
        Path(os.environ["KP_BENCH_STATS"]).write_text(json.dumps(stats))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


# ------------------------------------------------------------------------------------------ the benchmark


WRITTEN = re.compile(rb"written@(\d+\.\d+)")


def run_client_on_pty(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, list[float]]:
    """Run the client with a pseudo-terminal as stdout/stderr, reading it as a terminal would; returns the exit
    code and, for each row line drawn, how long after its writing it reached the terminal."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    lags: list[float] = []

    def read_terminal() -> None:
        tail = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            now = time.time()
            text = tail + chunk
            cut = text.rfind(b"\n") + 1  # only whole lines: a stamp split across reads is read once, whole
            lags.extend(now - float(stamp) for stamp in WRITTEN.findall(text[:cut]))
            tail = text[cut:]

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(timeout=5)
        os.close(master)
    return code, lags


def measure(events: int, seconds: float, repeats: int, rtt_ms: float, profile: str | None = None
            ) -> list[dict[str, Any]]:
    from benchkit import fresh_rig, link_host, median, quiet_env
    from rig import idle_gpu

    rig = fresh_rig("kpremote-bench-follow-")
    runs = []
    try:
        host = rig.add_host("follow-host", gpus=[idle_gpu(0)], extra_env={"PYTHONPATH": str(BENCH_DIR)})
        linked = link_host(rig, host, rtt_ms)
        work = rig.base / "work"
        task_dir = work / "kernels" / TASK
        task_dir.mkdir(parents=True)
        (task_dir / "task.toml").write_text(f'[task]\nname = "{TASK}"\n')
        (task_dir / "standin.json").write_text(json.dumps({"events": events, "seconds": seconds}))
        hosts_toml = linked.hosts_toml(work / "hosts.toml")
        env = {**quiet_env(KPREMOTE_CACHE=str(work / ".cache"), KP_BENCH_STATS=str(work / "stats.json")),
               "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", "run", "--hosts", str(hosts_toml),
                "--host", linked.name, "--task", TASK]
        if profile:  # py-spy's collapsed stacks of the client, every thread (pip install py-spy)
            argv = ["py-spy", "record", "--format", "raw", "--threads", "--output", profile, "--", *argv]
        for _ in range(repeats):
            code, lags = run_client_on_pty(argv, work, env, timeout=seconds * 4 + 120)
            if code != 0 or not lags:
                raise RuntimeError(f"inv run exited {code} after drawing {len(lags)} rows")
            stats = json.loads((work / "stats.json").read_text())
            lags.sort()
            runs.append({
                "events_seen": len(lags),
                "lag_p50": lags[len(lags) // 2],
                "lag_p99": lags[min(len(lags) - 1, int(len(lags) * 0.99))],
                "lag_max": lags[-1],
                "follow_cpu_pct": 100 * stats["follow_cpu_s"] / max(stats["follow_wall_s"], 1e-9),
                "process_cpu_s": stats["process_cpu_s"],
                "process_wall_s": stats["process_wall_s"],
                "peak_rss_mb": stats["peak_rss_kb"] / 1024,
            })
            print(f"# {runs[-1]}", file=sys.stderr, flush=True)
        linked.stop()
    finally:
        rig.stop_all()
    summary = {key: median(r[key] for r in runs) for key in runs[0]}
    summary.update(events=events, seconds=seconds, rtt_ms=rtt_ms, runs=len(runs))
    return [summary]


def table(rows: list[dict[str, Any]]) -> str:
    from benchkit import markdown_table

    return markdown_table(HEADERS, ([
        f"{r['events']} ({r['events_seen']:.0f} rows drawn)", f"{r['seconds']:g} s", f"{r['rtt_ms']:g} ms",
        f"{r['lag_p50'] * 1000:.0f} ms", f"{r['lag_p99'] * 1000:.0f} ms", f"{r['lag_max'] * 1000:.0f} ms",
        f"{r['follow_cpu_pct']:.1f} %", f"{r['process_cpu_s']:.2f} s / {r['process_wall_s']:.1f} s",
        f"{r['peak_rss_mb']:.0f} MB", r["runs"]] for r in rows))


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        client_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--seconds", type=float, default=20.0, help="the stand-in spreads its events over this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--profile", metavar="FILE", help="record the client with py-spy into FILE (collapsed)")
    args = parser.parse_args()
    from benchkit import machine_line

    print(f"machine: {machine_line()}")
    print(table(measure(args.events, args.seconds, args.repeats, args.rtt_ms, args.profile)))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
