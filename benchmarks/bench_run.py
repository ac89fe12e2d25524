"""`inv run` overhead for a repeat run with nothing changed, next to the by-hand routines, at several round trips.

Run: python benchmarks/bench_run.py [--rtts 0,50,150] [--repeats 5] [--high-rtt-repeats 3]
                                    [--tools kpremote,tar,fabric] [--warmups 1]

The tiny task (tests/fixtures/tasks/tiny_rmsnorm, one workload: --workloads grid_r1_c33) on one OpenSSH host on
loopback behind a delay proxy (benchmarks/delay_proxy.py), in CPU smoke mode (the host's GPUs are an NVML fixture).
Overhead = wall time − the agent's own time (its first event to its last, from the run's events.jsonl), so
what is left is connecting, syncing, starting, following, fetching — and, for the whole-process figure, Python's
start-up on the client. The first run (which ships the agent and syncs everything) is not counted. The repeats go
round by round, one run of each tool in turn, so a change in the machine's load weighs on all of them alike.

- kpremote: `inv run --json`. "in-command" is the JSON `seconds` (time inside the command); "process" is the wall
  time of the whole `inv` process. Channels: the JSON `channels` (all on one connection). Over the SSH client
  hosts.toml's default picks (kpremote), or one named: paramiko (kpremote-paramiko), OpenSSH with the master the
  previous run left (kpremote-openssh: warm), OpenSSH with no master, stopped before each run (kpremote-openssh-cold).
- (a) the shell routine: `tar -cf - . | ssh H 'tar -xf - -C WS'`, `ssh H python -m kpremote.agent run ...` (the
  same runner, in the foreground), `scp -r H:RUN/summary .` — three SSH connections of one channel each. (Users'
  routine also has an `ssh nvidia-smi` first; it is left out, which favours the anchor.)
- (b) benchmarks/anchor_fabric.py run: one Fabric connection, `put` per file, one `run` for the runner, `get` per
  summary file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import (BENCH_DIR, REPO, LinkedHost, fresh_rig, inv_argv, link_host, machine_line,  # noqa: E402
                      markdown_table, median, quiet_env, seconds_text, timed)
from rig import idle_gpu  # noqa: E402

from kpremote.transport.openssh import CONTROL_DIR_ENV  # noqa: E402

TASK = "tiny_rmsnorm"
WORKLOAD = "grid_r1_c33"
TOOLS = {"kpremote": "kpremote `inv run`", "tar": "(a) tar\\|ssh + ssh run + scp", "fabric": "(b) Fabric"}
CLIENTS = {"kpremote-paramiko": ("paramiko", "kpremote `inv run`, paramiko"),
           "kpremote-openssh": ("openssh", "kpremote `inv run`, OpenSSH, warm master"),
           "kpremote-openssh-cold": ("openssh", "kpremote `inv run`, OpenSSH, no master")}
LABELS = {**TOOLS, **{tool: label for tool, (_, label) in CLIENTS.items()}}
CHANNELS = {"tar": "3 (3 connections)", "fabric": "3 + SFTP requests"}
TARGETS = {0.0: 1.0, 50.0: 1.5, 150.0: 3.0}


@dataclass
class Sample:
    wall_s: float
    agent_s: float
    in_command_s: Optional[float] = None
    channels: Optional[int] = None
    synced_files: Optional[int] = None


@dataclass
class Cell:
    tool: str
    rtt_ms: float
    samples: list[Sample] = field(default_factory=list)

    def median(self, name: str) -> Optional[float]:
        values = [getattr(s, name) for s in self.samples if getattr(s, name) is not None]
        return median(values) if values else None


def agent_seconds(events: Path) -> float:
    """The agent's own time: its first event to its last (the same rule `inv run` uses)."""
    stamps = [json.loads(line)["t"] for line in events.read_text().splitlines() if line.strip()]
    return max(stamps) - min(stamps)


class Bench:
    def __init__(self, linked: LinkedHost, work: Path) -> None:
        self.linked = linked
        self.work = work
        self.hosts_toml = linked.hosts_toml(work / "hosts.toml")
        self.anchor_source = work / "anchor-source" / TASK
        self.rounds = 0

    def sample(self, tool: str) -> Sample:
        if tool in CLIENTS:
            client = CLIENTS[tool][0]
            hosts_toml = self.linked.hosts_toml(self.work / f"hosts-{client}.toml", transport=client)
            if tool == "kpremote-openssh-cold":
                stop_master(hosts_toml, self.linked.name)
            return self.kpremote(hosts_toml)
        return getattr(self, tool)()

    def kpremote(self, hosts_toml: Optional[Path] = None) -> Sample:
        hosts_toml = hosts_toml or self.hosts_toml
        seconds, done = timed(inv_argv("run", "--hosts", str(hosts_toml), "--host", self.linked.name,
                                       "--task", TASK, "--workloads", WORKLOAD, "--json"),
                              cwd=self.work, env=quiet_env(KPREMOTE_CACHE=str(self.work / ".cache")))
        [outcome] = json.loads(done.stdout)["runs"]
        if outcome["status"] != "passed":
            raise RuntimeError(f"inv run did not pass: {outcome}")
        return Sample(seconds, outcome["agent_seconds"], outcome["seconds"], outcome["channels"],
                      outcome["synced_files"])

    def tar(self) -> Sample:
        workspace, run_dir, fetched = self._places("tar")
        ssh = self.linked.ssh_shell()
        into = shlex.quote(str(workspace))
        runner = [self.linked.host.python, "-m", "kpremote.agent", "run", "--task-dir", str(workspace),
                  "--run-dir", str(run_dir), "--device", "cpu", "--workloads", WORKLOAD]
        steps = [
            f"tar -cf - -C {shlex.quote(str(self.anchor_source))} . | "
            f"{ssh} {shlex.quote(f'mkdir -p {into} && tar -xf - -C {into}')}",
            f"{ssh} {shlex.quote(f'PYTHONPATH={shlex.quote(str(REPO))} {shlex.join(runner)}')}",
            f"{shlex.join(self.linked.scp())} -r root@127.0.0.1:{shlex.quote(str(run_dir / 'summary'))} "
            f"{shlex.quote(str(fetched))}",
        ]
        seconds, _ = timed("set -e -o pipefail\n" + "\n".join(steps), shell=True)
        return Sample(seconds, agent_seconds(run_dir / "raw" / "events.jsonl"))

    def fabric(self) -> Sample:
        workspace, run_dir, fetched = self._places("fabric")
        argv = [sys.executable, str(BENCH_DIR / "anchor_fabric.py"), "--port", str(self.linked.port),
                "--key", str(self.linked.rig.client_key), "--known-hosts", str(self.linked.rig.known_hosts),
                "run", str(self.anchor_source), str(workspace), str(run_dir), self.linked.host.python,
                str(REPO), str(fetched), "--device", "cpu", "--workloads", WORKLOAD]
        seconds, _ = timed(argv)
        return Sample(seconds, agent_seconds(run_dir / "raw" / "events.jsonl"))

    def _places(self, tool: str) -> tuple[Path, Path, Path]:
        """A workspace kept between rounds (as a user's is), a fresh run folder and a fresh local folder."""
        self.rounds += 1
        base = self.linked.root / f"anchor-{tool}"
        round_name = f"{self.linked.rtt_ms:g}ms-{self.rounds}"
        fetched = self.work / f"fetched-{tool}" / round_name
        fetched.mkdir(parents=True)
        return base / TASK, base / "runs" / round_name, fetched


def stop_master(hosts_toml: Path, name: str) -> None:
    """No OpenSSH master for the host: the next command connects from nothing, as the day's first one does."""
    from kpremote.hosts.config import load_inventory
    from kpremote.hosts.connect import openssh_transport

    transport = openssh_transport(load_inventory(hosts_toml).hosts[name])
    subprocess.run(transport.ssh_argv("-O", "exit"), capture_output=True)
    if transport.master_pid() is not None:
        raise RuntimeError(f"the OpenSSH master for {name} did not stop")


def measure(rtts: list[float], repeats: int, high_rtt_repeats: int, tools: list[str], warmups: int = 1
            ) -> list[Cell]:
    rig = fresh_rig("kpremote-bench-run-")
    # OpenSSH masters of this benchmark's own (short: a socket path has ~104 bytes), inherited by every `inv`
    os.environ[CONTROL_DIR_ENV] = tempfile.mkdtemp(prefix="kpssh-", dir="/tmp")
    cells: list[Cell] = []
    try:
        host = rig.add_host("run-host", gpus=[idle_gpu(0)])
        work = rig.base / "work"
        # The anchors send their own pristine copy: kpremote's runs fetch summaries into kernels/<task>/results/,
        # which the anchors would otherwise carry along file by file.
        for copy in (work / "kernels" / TASK, work / "anchor-source" / TASK):
            shutil.copytree(REPO / "tests" / "fixtures" / "tasks" / TASK, copy)
        for rtt in rtts:
            linked = link_host(rig, host, rtt)
            try:
                bench = Bench(linked, work)
                for tool in tools:
                    for _ in range(warmups):  # the first run ships the agent and syncs everything: not counted
                        bench.sample(tool)
                # Round by round, each tool in turn: a machine whose load changes (other people's test suites)
                # weighs on every tool alike, where tool after tool would hand one of them the busy minutes.
                row = [Cell(tool, rtt) for tool in tools]
                for _ in range(repeats if rtt == 0 else high_rtt_repeats):
                    for cell in row:
                        cell.samples.append(bench.sample(cell.tool))
                for cell in row:
                    print(f"# {cell.tool} {rtt:g} ms: {cell.samples}", file=sys.stderr, flush=True)
                cells += row
            finally:
                linked.stop()
    finally:
        rig.stop_all()
    return cells


HEADERS = ["RTT", "routine", "channels", "wall (process)", "agent's own time", "overhead (process)",
           "overhead (in-command)", "target (overhead)", "runs"]


def table(cells: list[Cell]) -> str:
    rows = []
    for c in cells:
        agent = c.median("agent_s")
        overhead = median(s.wall_s - s.agent_s for s in c.samples)
        ours = c.tool.startswith("kpremote")
        in_command = median(s.in_command_s - s.agent_s for s in c.samples) if ours else None
        channels = f"{c.median('channels'):g}" if ours else CHANNELS[c.tool]
        target = f"≤ {TARGETS[c.rtt_ms]:g} s" if ours and c.rtt_ms in TARGETS else ""
        rows.append([f"{c.rtt_ms:g} ms", LABELS[c.tool], channels, seconds_text(c.median("wall_s")),
                     seconds_text(agent), seconds_text(overhead), seconds_text(in_command), target, len(c.samples)])
    return markdown_table(HEADERS, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtts", default="0,50,150")
    parser.add_argument("--repeats", type=int, default=5, help="repeats at loopback")
    parser.add_argument("--high-rtt-repeats", type=int, default=3, help="repeats with a delay")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"of {', '.join(LABELS)}")
    parser.add_argument("--warmups", type=int, default=1, help="uncounted runs first (0: the smoke test's choice)")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    cells = measure([float(r) for r in args.rtts.split(",")], args.repeats, args.high_rtt_repeats,
                    args.tools.split(","), args.warmups)
    print(table(cells))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
