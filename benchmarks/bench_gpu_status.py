"""`inv gpu-status` over 1, 4, 8, 16 loopback SSH hosts: wall time, its ratio to one host, and where the CPU goes.

Run: python benchmarks/bench_gpu_status.py [--counts 1,4,8,16] [--repeats 5]

Each host is a real OpenSSH server on its own loopback address (tests/rig.py) with an NVML fixture of 8 GPUs.
Figures per count (medians over the repeats):
- query: kpremote.gpustatus.gpu_status in a warm process (connect, probe, answer), the part that scales with hosts;
- command: the whole `inv gpu-status --json` process, what a user waits for (Python start-up included);
- client CPU: this process's CPU time during the query (all its threads);
- server CPU: what every host's sshd and the remote pythons it started used during the query. On a real fleet
  that CPU is spread over the hosts; here all of it shares this machine's cores, which bounds the wall time
  from below at (client + server CPU) / cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import fresh_rig, inv_argv, machine_line, markdown_table, median, quiet_env, timed  # noqa: E402
from rig import SshHost, idle_gpu  # noqa: E402

from kpremote.config import load_inventory  # noqa: E402
from kpremote.gpustatus import gpu_status  # noqa: E402

HEADERS = ["hosts", "query (median)", "ratio to 1 host", "`inv gpu-status --json` (median)", "ratio to 1 host",
           "client CPU", "server CPU (sshd + python, all hosts)", "CPU bound on this machine"]


def server_cpu_seconds(hosts: list[SshHost]) -> float:
    """CPU of each host's sshd and of its reaped sessions (sshd's children: privsep sshd, shell, python)."""
    ticks = 0
    for host in hosts:
        fields = Path(f"/proc/{host.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(counts: list[int], repeats: int) -> list[dict]:
    rig = fresh_rig("kpremote-bench-gpu-")
    rows = []
    try:
        hosts = [rig.add_host(f"h{i:02d}", gpus=[idle_gpu(g) for g in range(8)]) for i in range(max(counts))]
        for count in counts:
            file = rig.write_hosts_toml(rig.base / f"hosts-{count}.toml", hosts[:count], local=False)
            selected = load_inventory(file).select(None)
            gpu_status(selected)  # ships the agent once; every later call finds it
            query, command, client, server = [], [], [], []
            for _ in range(repeats):
                time.sleep(0.3)  # the previous command's sessions are reaped: their CPU is not this query's
                server_before, client_before = server_cpu_seconds(hosts), own_cpu_seconds()
                t0 = time.perf_counter()
                reports = gpu_status(selected)
                query.append(time.perf_counter() - t0)
                client.append(own_cpu_seconds() - client_before)
                time.sleep(0.3)  # let every sshd reap this query's sessions, so their CPU is counted
                server.append(server_cpu_seconds(hosts) - server_before)
                assert all(r.ok for r in reports), [r.error for r in reports if not r.ok]
                seconds, _ = timed(inv_argv("gpu-status", "--hosts", str(file), "--json"), env=quiet_env())
                command.append(seconds)
            rows.append({"hosts": count, "query_s": median(query), "command_s": median(command),
                         "client_cpu_s": median(client), "server_cpu_s": median(server)})
    finally:
        rig.stop_all()
    cores = os.cpu_count() or 1
    for row in rows:
        row["query_ratio"] = row["query_s"] / rows[0]["query_s"]
        row["command_ratio"] = row["command_s"] / rows[0]["command_s"]
        row["cpu_bound_s"] = (row["client_cpu_s"] + row["server_cpu_s"]) / cores
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(HEADERS, (
        [row["hosts"], f"{row['query_s']:.3f} s", f"{row['query_ratio']:.2f}", f"{row['command_s']:.3f} s",
         f"{row['command_ratio']:.2f}", f"{row['client_cpu_s']:.3f} s", f"{row['server_cpu_s']:.2f} s",
         f"≥ {row['cpu_bound_s']:.2f} s"]
        for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    rows = measure([int(c) for c in args.counts.split(",")], args.repeats)
    print(table(rows))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
