"""Client CPU, peak memory and view lag of `inv run` (or `inv logs --follow`) following a run that emits 10,000 events.

Run: python benchmarks/bench_follow.py [--events 10000] [--seconds 20] [--repeats 3] [--rtt-ms 0] [--command run]

The remote run is a stand-in runner (benchmarks/standin_events.py, spawned by the agent's `start` in place of
the timing runner: the host's Python is benchmarks/standin_agent.py) that writes N row events evenly over S
seconds. The client is the real `inv run` command line, in a child process on a pseudo-terminal (so rich's live
view draws as it does for a user), with one hook added from outside kpremote: the moments the first and last
events reach the view are noted. With `--command logs` the run is started first with
`inv run --detach --json` (its stand-in waits --attach-s seconds before its first event), and the client measured
is `inv logs --follow --host H --run RUN --task T`, the moments noted being when each event has been handed to
its printer. Figures, medians over the repeats:
- lag: when a row's line is read back from the terminal, minus when the runner wrote it (each row's message
  carries that moment: "written@<unix time>"); p50, p99, max over all rows; target: within 0.5 s;
- CPU while following: the client process's user+system CPU from the first event to the last, over that wall
  time (all threads: paramiko's reader, the follow thread, the view's printer, rich's refresh); target < 5 %;
- whole process: CPU and wall of the entire `inv run` (start-up, start, follow, fetch), or of `inv logs` (start-up,
  the wait for the stand-in's first event, follow), and its peak RSS (VmHWM from /proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import resource
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

TASK = "events_task"


def headers(command: str) -> list[str]:
    client = "`inv run`" if command == "run" else "`inv logs --follow`"
    return ["events", "over", "RTT", "lag p50", "lag p99", "lag max", "CPU while following (% of one core)",
            f"whole {client}: CPU / wall", "peak RSS", "runs"]


# ------------------------------------------------------------------------------------------ the client (child)


def client_main(argv: list[str]) -> None:
    """`inv ARGS...` (run or logs) in this process, with the hook; stats written to $KP_BENCH_STATS at the end."""
    started = time.monotonic()
    sys.path.insert(0, str(BENCH_DIR.parent))
    from invoke.main import program

    from kpremote.runs import placement
    from kpremote.views.run import RunView

    window: dict[str, Any] = {}

    def mark() -> None:
        moment = (time.monotonic(), _cpu_seconds())
        window.setdefault("first", moment)
        window["last"] = moment

    event = RunView.event

    def timed_event(self, key: str, payload: dict) -> None:
        event(self, key, payload)
        mark()

    follow_run = placement.follow_run

    def timed_follow_run(session, task, run_id, on_event, *args: Any, **kwargs: Any):
        # `inv logs` hands each event to a printer of its own: noted once the printer has taken it
        window["attached_at"] = time.time()

        def timed_on_event(payload: dict) -> None:
            on_event(payload)
            mark()

        return follow_run(session, task, run_id, timed_on_event, *args, **kwargs)

    if argv[0] == "logs":
        placement.follow_run = timed_follow_run
    else:
        RunView.event = timed_event
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
            "attached_at": window.get("attached_at"),
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


def run_client_on_pty(argv: list[str], cwd: Path, env: dict[str, str], timeout: float
                      ) -> tuple[int, list[float], float]:
    """Run the client with a pseudo-terminal as stdout/stderr, reading it as a terminal would; returns the exit
    code, for each row line drawn how long after its writing it reached the terminal, and the earliest writing."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    lags: list[float] = []
    first_written = [float("inf")]

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
            stamps = [float(stamp) for stamp in WRITTEN.findall(text[:cut])]
            lags.extend(now - stamp for stamp in stamps)
            first_written[0] = min([first_written[0], *stamps])
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
    return code, lags, first_written[0]


def start_detached(work: Path, env: dict[str, str], hosts_toml: Path, host: str) -> str:
    """`inv run --detach --json` (with the stand-in hook): the run id of the run just started."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--client", "run", "--hosts", str(hosts_toml),
            "--host", host, "--task", TASK, "--detach", "--json", "--wait", "60"]
    done = subprocess.run(argv, cwd=work, env={**env, "KP_BENCH_STATS": str(work / "detach-stats.json")},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"inv run --detach exited {done.returncode}: {done.stderr[-2000:]}")
    [outcome] = json.loads(done.stdout)["runs"]
    return outcome["run_id"]


def standin_python(folder: Path) -> str:
    """The host's Python: this interpreter running standin_agent.py (start spawns the stand-in runner)."""
    wrapper = folder / "standin-python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(BENCH_DIR / "standin_agent.py"))} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def write_standin_task(task_dir: Path) -> None:
    """A task the client's checks accept (it validates task.toml before connecting); the stand-in runner never
    imports it."""
    files = {
        "task.toml": (f'[task]\nname = "{TASK}"\narch = "any"\nfamily = "bench"\n[baseline]\nrepo = '
                      '"https://example.invalid/bench"\nref = "main"\ncommit = "unresolved"\n[build]\nkind = "python"\n'),
        "bench/workloads.toml": '[[workload]]\nid = "w1"\n',
        "bench/adapter.py": ("def make_case(workload, *, device, seed): ...\n"
                             "def call_baseline(workload, inputs, outputs): ...\n"
                             "def call_candidate(workload, inputs, outputs): ...\n"),
        "baseline/kernel.py": "", "solution/kernel.py": "",
    }
    for name, text in files.items():
        (task_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (task_dir / name).write_text(text)


def measure(events: int, seconds: float, repeats: int, rtt_ms: float, profile: str | None = None,
            command: str = "run", attach_s: float = 3.0) -> list[dict[str, Any]]:
    from benchkit import fresh_rig, link_host, median, quiet_env
    from rig import idle_gpu

    rig = fresh_rig("kpremote-bench-follow-")
    runs = []
    try:
        host = rig.add_host("follow-host", gpus=[idle_gpu(0)], extra_env={"PYTHONPATH": str(BENCH_DIR)})
        host.python = standin_python(rig.base)
        linked = link_host(rig, host, rtt_ms)
        work = rig.base / "work"
        task_dir = work / "kernels" / TASK
        task_dir.mkdir(parents=True)
        write_standin_task(task_dir)
        delay_s = attach_s if command == "logs" else 0.0
        (task_dir / "standin.json").write_text(json.dumps({"events": events, "seconds": seconds, "delay_s": delay_s}))
        hosts_toml = linked.hosts_toml(work / "hosts.toml")
        env = {**quiet_env(KPREMOTE_CACHE=str(work / ".cache"), KP_BENCH_STATS=str(work / "stats.json")),
               "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        for _ in range(repeats):
            client = [sys.executable, str(Path(__file__).resolve()), "--client", command, "--hosts", str(hosts_toml),
                      "--host", linked.name]
            if command == "logs":
                client += ["--run", start_detached(work, env, hosts_toml, linked.name), "--task", TASK, "--follow"]
            else:
                client += ["--task", TASK]
            if profile:  # py-spy's collapsed stacks of the client, every thread (pip install py-spy)
                client = ["py-spy", "record", "--format", "raw", "--threads", "--output", profile, "--", *client]
            code, lags, first_written = run_client_on_pty(client, work, env, timeout=seconds * 4 + delay_s + 120)
            if code != 0 or not lags:
                raise RuntimeError(f"inv {command} exited {code} after drawing {len(lags)} rows")
            stats = json.loads((work / "stats.json").read_text())
            if stats["attached_at"] and stats["attached_at"] > first_written:
                # rows written before the client followed come in one catch-up burst: not the lag being measured
                raise RuntimeError(f"inv logs attached {stats['attached_at'] - first_written:.2f} s after the first "
                                   "row was written: raise --attach-s")
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


def table(rows: list[dict[str, Any]], command: str = "run") -> str:
    from benchkit import markdown_table

    return markdown_table(headers(command), ([
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
    parser.add_argument("--command", choices=("run", "logs"), default="run",
                        help="the client measured: `inv run`, or `inv logs --follow` on a run started with --detach")
    parser.add_argument("--attach-s", type=float, default=3.0,
                        help="with --command logs: the stand-in's wait before its first event (for `inv logs` to "
                             "attach first)")
    args = parser.parse_args()
    from benchkit import machine_line

    print(f"machine: {machine_line()}")
    print(f"command: inv {args.command}" + (" --follow" if args.command == "logs" else ""))
    rows = measure(args.events, args.seconds, args.repeats, args.rtt_ms, args.profile, args.command, args.attach_s)
    print(table(rows, args.command))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
