"""Sync of a task workspace of 100, 1,000 and 10,000 files: kpremote against tar|ssh, Fabric put and rsync.

Run: python benchmarks/bench_sync.py [--sizes 100,1000,10000] [--rtts 0,50,150] [--repeats 3]
                                     [--tools kpremote,tar,fabric,rsync] [--skip-over 300]

One OpenSSH server on loopback behind a delay proxy (benchmarks/delay_proxy.py) that adds the round trip and
counts the bytes crossing it both ways. The workspace averages 5 KB a file (50 MB at 10,000 files) in folders of
100, with old mtimes, as a checked-out tree has. For each tool, size and round trip: a first sync into an empty
remote folder, then a re-sync after one file changed; wall time of the whole command (process start included)
and bytes on the wire, medians of the repeats (fewer when one run takes long: the `runs` column).

- kpremote: `inv sync --json` with an empty client cache for the first sync (the agent is shipped beforehand,
  once per host and version, as after any earlier command). The `client` column is sync_task's own time.
- (a) tar | ssh: `tar -cf - . | ssh HOST 'mkdir -p WS && tar -xf - -C WS'` (a re-sync sends everything again).
- (b) Fabric: benchmarks/anchor_fabric.py, `put` per file over SFTP (a re-sync sends everything again). Over a
  slow link it costs several round trips per file; cells whose estimate (its per-file time at the largest size
  measured so far at the same round trip) exceeds --skip-over seconds are skipped and say so.
- (c) rsync -a over the same SSH options (ssh -e), the practical limit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import (BENCH_DIR, LinkedHost, fresh_rig, inv_argv, link_host, machine_line,  # noqa: E402
                      markdown_table, median, quiet_env, seconds_text, size_text, timed)
from rig import idle_gpu  # noqa: E402

MEAN_FILE_BYTES = 5000
FILES_PER_FOLDER = 100
TOOLS = {"kpremote": "kpremote `inv sync`", "tar": "(a) tar \\| ssh", "fabric": "(b) Fabric put",
         "rsync": "(c) rsync -a"}
LONG_RUN_S = 20.0
"""A cell whose single run takes longer than this is not repeated (its `runs` column says 1)."""


def make_workspace(task_dir: Path, files: int) -> None:
    """files files of 1-9 KB (5 KB on average) of incompressible-ish text, with an hour-old mtime."""
    rng = random.Random(files)
    old = time.time() - 3600
    for n in range(files):
        path = task_dir / "src" / f"d{n // FILES_PER_FOLDER:03d}" / f"f{n:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = rng.randint(MEAN_FILE_BYTES - 4000, MEAN_FILE_BYTES + 4000)
        path.write_text(rng.randbytes(size // 2).hex())
        os.utime(path, (old, old))


def change_one_file(task_dir: Path, round_: int) -> None:
    path = task_dir / "src" / "d000" / "f00000.py"
    path.write_text(path.read_text()[:-64] + f"{round_:064d}")


@dataclass
class Cell:
    tool: str
    files: int
    rtt_ms: float
    first_s: list[float] = field(default_factory=list)
    first_bytes: list[int] = field(default_factory=list)
    resync_s: list[float] = field(default_factory=list)
    resync_bytes: list[int] = field(default_factory=list)
    client_s: list[float] = field(default_factory=list)  # kpremote: sync_task's own time in the re-sync
    skipped: Optional[str] = None


class Bench:
    def __init__(self, linked: LinkedHost, work: Path) -> None:
        self.linked = linked
        self.work = work
        self.hosts_toml = linked.hosts_toml(work / "hosts.toml")
        self.cache = work / ".cache"

    # -------------------------------------------------------------------- one command per tool

    def kpremote(self, task: str) -> float:
        seconds, done = timed(inv_argv("sync", "--hosts", str(self.hosts_toml), "--host", self.linked.name,
                                       "--task", task, "--json"),
                              cwd=self.work, env=quiet_env(KPREMOTE_CACHE=str(self.cache)))
        self.last_client_s = json.loads(done.stdout)["seconds"]
        return seconds

    def tar(self, task: str) -> float:
        dest = shlex.quote(str(self.dest("tar", task)))
        remote = shlex.quote(f"mkdir -p {dest} && tar -xf - -C {dest}")
        source = shlex.quote(str(self.src(task)))
        command = f"set -o pipefail; tar -cf - -C {source} . | {self.linked.ssh_shell()} {remote}"
        return timed(command, shell=True)[0]

    def fabric(self, task: str) -> float:
        argv = [sys.executable, str(BENCH_DIR / "anchor_fabric.py"), "--port", str(self.linked.port),
                "--key", str(self.linked.rig.client_key), "--known-hosts", str(self.linked.rig.known_hosts),
                "sync", str(self.src(task)), str(self.dest("fabric", task))]
        return timed(argv)[0]

    def rsync(self, task: str) -> float:
        dest = str(self.dest("rsync", task))
        argv = ["rsync", "-a", "-e", shlex.join(["ssh", *self.linked.ssh_options(), "-p", str(self.linked.port)]),
                f"--rsync-path=mkdir -p {shlex.quote(dest)} && rsync", f"{self.src(task)}/", f"root@127.0.0.1:{dest}/"]
        return timed(argv)[0]

    # -------------------------------------------------------------------- places

    def src(self, task: str) -> Path:
        return self.work / "kernels" / task

    def dest(self, tool: str, task: str) -> Path:
        if tool == "kpremote":
            return self.linked.root / "tasks" / task
        return self.linked.root / f"anchor-{tool}" / task

    def forget(self, tool: str, task: str) -> None:
        """Back to a first sync: the remote copy gone (and, for kpremote, the client's memory of it)."""
        shutil.rmtree(self.dest(tool, task), ignore_errors=True)
        if tool == "kpremote":
            shutil.rmtree(self.cache, ignore_errors=True)

    def on_wire(self, command: Callable[[], float]) -> tuple[float, int]:
        before = self.linked.bytes_on_wire()
        seconds = command()
        return seconds, self.linked.bytes_on_wire() - before


def measure_cell(bench: Bench, tool: str, files: int, repeats: int) -> Cell:
    task = f"bench_{files}"
    cell = Cell(tool, files, bench.linked.rtt_ms)
    command = getattr(bench, tool)
    for round_ in range(repeats):
        bench.forget(tool, task)
        seconds, sent = bench.on_wire(lambda: command(task))
        cell.first_s.append(seconds)
        cell.first_bytes.append(sent)
        change_one_file(bench.src(task), round_)
        seconds, sent = bench.on_wire(lambda: command(task))
        cell.resync_s.append(seconds)
        cell.resync_bytes.append(sent)
        if tool == "kpremote":
            cell.client_s.append(bench.last_client_s)
        if cell.first_s[-1] + cell.resync_s[-1] > 2 * LONG_RUN_S:
            break
    return cell


def measure(sizes: list[int], rtts: list[float], repeats: int, tools: list[str], skip_over: float,
            high_rtt_repeats: int) -> list[Cell]:
    rig = fresh_rig("kpremote-bench-sync-")
    cells: list[Cell] = []
    try:
        host = rig.add_host("sync-host", gpus=[idle_gpu(0)])
        work = rig.base / "work"
        for files in sizes:
            make_workspace(work / "kernels" / f"bench_{files}", files)
        (work / "kernels" / "warmup").mkdir(parents=True)
        (work / "kernels" / "warmup" / "a.txt").write_text("ship the agent once\n")
        for rtt in rtts:
            linked = link_host(rig, host, rtt)
            try:
                bench = Bench(linked, work)
                bench.kpremote("warmup")
                per_file: dict[str, float] = {}
                for files in sizes:
                    for tool in tools:
                        estimate = per_file.get(tool, 0.0) * files * 2
                        if tool == "fabric" and estimate > skip_over:
                            cell = Cell(tool, files, rtt, skipped=f"skipped: ≈ {estimate:.0f} s for a first sync "
                                                                  f"+ re-sync, from its per-file time at fewer files")
                        else:
                            cell = measure_cell(bench, tool, files, repeats if rtt == 0 else high_rtt_repeats)
                            per_file[tool] = median(cell.first_s) / files
                        cells.append(cell)
                        print(f"# {tool} {files} files {rtt:g} ms: {summary_of(cell)}", file=sys.stderr, flush=True)
            finally:
                linked.stop()
    finally:
        rig.stop_all()
    return cells


def summary_of(cell: Cell) -> str:
    if cell.skipped:
        return cell.skipped
    return (f"first {median(cell.first_s):.2f} s {size_text(median(cell.first_bytes))}, "
            f"re-sync {median(cell.resync_s):.2f} s {size_text(median(cell.resync_bytes))}")


HEADERS = ["files", "RTT", "tool", "first sync", "bytes on the wire", "re-sync (1 file changed)", "bytes on the wire",
           "re-sync / rsync", "runs"]


def table(cells: list[Cell]) -> str:
    rsync = {(c.files, c.rtt_ms): median(c.resync_s) for c in cells if c.tool == "rsync" and not c.skipped}
    rows = []
    for c in cells:
        if c.skipped:
            rows.append([c.files, f"{c.rtt_ms:g} ms", TOOLS[c.tool], c.skipped, "", "", "", "", 0])
            continue
        resync = median(c.resync_s)
        client = f" (client {median(c.client_s):.2f} s)" if c.client_s else ""
        ratio = resync / rsync[(c.files, c.rtt_ms)] if (c.files, c.rtt_ms) in rsync else None
        rows.append([c.files, f"{c.rtt_ms:g} ms", TOOLS[c.tool], seconds_text(median(c.first_s)),
                     size_text(median(c.first_bytes)), seconds_text(resync) + client,
                     size_text(median(c.resync_bytes)), "-" if ratio is None else f"{ratio:.2f}",
                     len(c.first_s)])
    return markdown_table(HEADERS, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--rtts", default="0,50,150", help="round trips in ms (0: loopback, still through the "
                                                           "proxy, which counts the bytes)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats at loopback")
    parser.add_argument("--high-rtt-repeats", type=int, default=2, help="repeats with a delay")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--skip-over", type=float, default=300.0,
                        help="skip a Fabric cell estimated to take longer than this (seconds)")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    cells = measure([int(s) for s in args.sizes.split(",")], [float(r) for r in args.rtts.split(",")],
                    args.repeats, args.tools.split(","), args.skip_over, args.high_rtt_repeats)
    print(table(cells))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
