"""`inv gpu-status` over 1, 4, 8, 16 loopback SSH hosts: wall time, its ratio to one host, and where the CPU goes.

Run: python benchmarks/bench_gpu_status.py [--counts 1,4,8,16] [--repeats 5] [--clients openssh,paramiko]

Each host is a real OpenSSH server on its own loopback address (tests/rig.py) with an NVML fixture of 8 GPUs.
Figures per count (medians over the repeats):
- query: kpremote.hosts.gpustatus.gpu_status in a warm process (connect, probe, answer), the part that scales with hosts;
- command: the whole `inv gpu-status --json` process, what a user waits for (Python start-up included);
- client CPU: this process's CPU time during the query (all its threads), and over OpenSSH also the ssh client
  processes it started and the hosts' master connections (theirs are out of this process);
- server CPU: what every host's sshd and the remote pythons it started used during the query. On a real fleet
  that CPU is spread over the hosts; here all of it shares this machine's cores, which bounds the wall time
  from below at (client + server CPU) / cores.
Each SSH client (--clients: hosts.toml's `transport`) is measured in turn, with the same hosts. Over OpenSSH every
query after the first finds each host's master connection (ControlPersist) and opens one channel on it: what
`gpu-status` does all day after its first call; over paramiko each query connects to every host afresh.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import fresh_rig, inv_argv, machine_line, markdown_table, median, quiet_env, timed  # noqa: E402
from rig import SshHost, idle_gpu  # noqa: E402

from kpremote.hosts.config import load_inventory  # noqa: E402
from kpremote.hosts.connect import openssh_transport  # noqa: E402
from kpremote.hosts.gpustatus import gpu_status  # noqa: E402
from kpremote.transport.openssh import CONTROL_DIR_ENV  # noqa: E402

HEADERS = ["SSH client", "hosts", "query (median)", "ratio to 1 host", "`inv gpu-status --json` (median)", "ratio to 1 host",
           "client CPU", "server CPU (sshd + python, all hosts)", "CPU bound on this machine"]


def server_cpu_seconds(hosts: list[SshHost]) -> float:
    """CPU of each host's sshd, of its reaped sessions (sshd's children: privsep sshd, shell, python) and of the
    sessions still alive (an OpenSSH master's connection lives on between queries)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), sum(int(value) for value in fields[11:15]))
    listeners = {host.proc.pid for host in hosts}
    ticks = 0
    for pid, (parent, used) in stats.items():  # utime, stime, cutime, cstime of the listener and each descendant
        while pid not in listeners and parent in stats:
            pid, parent = parent, stats[parent][0]
        ticks += used if pid in listeners else 0
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(masters: list[int]) -> float:
    """This process's CPU, its reaped children's (the ssh clients of OpenSSH's commands), and the masters'."""
    ticks = 0
    for pid in masters:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime
            + ticks / os.sysconf("SC_CLK_TCK"))


def master_pids(selected) -> list[int]:
    """The OpenSSH master of each host (none over paramiko)."""
    pids = []
    for host in selected:
        if host.transport == "openssh":
            pid = openssh_transport(host).master_pid()
            pids += [pid] if pid else []
    return pids


def measure(counts: list[int], repeats: int, clients: list[str]) -> list[dict]:
    rig = fresh_rig("kpremote-bench-gpu-")
    os.environ[CONTROL_DIR_ENV] = tempfile.mkdtemp(prefix="kpssh-", dir="/tmp")  # this benchmark's own masters
    rows = []
    try:
        hosts = [rig.add_host(f"h{i:02d}", gpus=[idle_gpu(g) for g in range(8)]) for i in range(max(counts))]
        for ssh_client in clients:
            rig.client = ssh_client
            rows += measure_client(rig, hosts, counts, repeats, ssh_client)
    finally:
        rig.stop_all()
    return rows


def measure_client(rig, hosts: list[SshHost], counts: list[int], repeats: int, ssh_client: str) -> list[dict]:
    rows = []
    for count in counts:
        file = rig.write_hosts_toml(rig.base / f"hosts-{ssh_client}-{count}.toml", hosts[:count], local=False)
        selected = load_inventory(file).select(None)
        gpu_status(selected)  # ships the agent once; every later call finds it (and over OpenSSH, the master)
        masters = master_pids(selected)
        query, command, client, server = [], [], [], []
        for _ in range(repeats):
            time.sleep(0.3)  # the previous command's sessions are reaped: their CPU is not this query's
            server_before, client_before = server_cpu_seconds(hosts), own_cpu_seconds(masters)
            t0 = time.perf_counter()
            reports = gpu_status(selected)
            query.append(time.perf_counter() - t0)
            client.append(own_cpu_seconds(masters) - client_before)
            time.sleep(0.3)  # let every sshd reap this query's sessions, so their CPU is counted
            server.append(server_cpu_seconds(hosts) - server_before)
            assert all(r.ok for r in reports), [r.error for r in reports if not r.ok]
            seconds, _ = timed(inv_argv("gpu-status", "--hosts", str(file), "--json"), env=quiet_env())
            command.append(seconds)
        rows.append({"client": ssh_client, "hosts": count, "query_s": median(query),
                     "command_s": median(command), "client_cpu_s": median(client), "server_cpu_s": median(server)})
    cores = os.cpu_count() or 1
    for row in rows:
        row["query_ratio"] = row["query_s"] / rows[0]["query_s"]
        row["command_ratio"] = row["command_s"] / rows[0]["command_s"]
        row["cpu_bound_s"] = (row["client_cpu_s"] + row["server_cpu_s"]) / cores
    return rows


def table(rows: list[dict]) -> str:
    return markdown_table(HEADERS, (
        [row["client"], row["hosts"], f"{row['query_s']:.3f} s", f"{row['query_ratio']:.2f}", f"{row['command_s']:.3f} s",
         f"{row['command_ratio']:.2f}", f"{row['client_cpu_s']:.3f} s", f"{row['server_cpu_s']:.2f} s",
         f"≥ {row['cpu_bound_s']:.2f} s"]
        for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", default="openssh,paramiko", help="SSH clients, each measured in turn")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    rows = measure([int(c) for c in args.counts.split(",")], args.repeats, args.clients.split(","))
    print(table(rows))
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
