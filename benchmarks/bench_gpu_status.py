"""`inv gpu-status` over 1, 4, 8, 16 loopback SSH hosts: wall time and its ratio to one host.

Run: .venv/bin/python benchmarks/bench_gpu_status.py [--counts 1,4,8,16] [--repeats 5]
Each host is a real OpenSSH server on its own loopback address (tests/rig.py) with an NVML fixture.
Two figures per count: the whole command line (`inv gpu-status --json`, what a user waits for) and the query
alone (kpremote.gpustatus.gpu_status in a warm process: connect, probe, answer).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from rig import Rig, idle_gpu, run_inv  # noqa: E402

from kpremote.config import load_inventory  # noqa: E402
from kpremote.gpustatus import gpu_status  # noqa: E402


def measure(counts: list[int], repeats: int) -> list[dict]:
    base = Path(tempfile.mkdtemp(prefix="kpremote-bench-"))
    rig = Rig(base)
    rows = []
    try:
        hosts = [rig.add_host(f"h{i:02d}", gpus=[idle_gpu(g) for g in range(8)]) for i in range(max(counts))]
        for count in counts:
            file = rig.write_hosts_toml(base / f"hosts-{count}.toml", hosts[:count], local=False)
            selected = load_inventory(file).select(None)
            gpu_status(selected)  # ships the agent once; every later call finds it
            query, command = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                reports = gpu_status(selected)
                query.append(time.perf_counter() - t0)
                assert all(r.ok for r in reports), [r.error for r in reports if not r.ok]
                t0 = time.perf_counter()
                result = run_inv("gpu-status", "--hosts", str(file), "--json")
                command.append(time.perf_counter() - t0)
                assert result.returncode == 0, result.stderr
            rows.append({"hosts": count, "query_s": statistics.median(query), "command_s": statistics.median(command)})
    finally:
        rig.stop_all()
    for row in rows:
        row["query_ratio"] = row["query_s"] / rows[0]["query_s"]
        row["command_ratio"] = row["command_s"] / rows[0]["command_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = measure([int(c) for c in args.counts.split(",")], args.repeats)
    print("| hosts | query (median) | ratio to 1 host | `inv gpu-status --json` (median) | ratio to 1 host |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['hosts']} | {row['query_s']:.3f} s | {row['query_ratio']:.2f} | {row['command_s']:.3f} s | "
              f"{row['command_ratio']:.2f} |")


if __name__ == "__main__":
    main()
