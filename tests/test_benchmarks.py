"""The benchmarks keep working: each runs at its smallest size and prints its table (no timing assertions).

Plus the one piece of benchmark machinery whose behaviour the figures rest on: the delay proxy really adds its
round trip, passes bytes both ways unchanged, and counts them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rig import REPO, idle_gpu

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def run_benchmark(script: str, *args: str, timeout: float = 120) -> list[str]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def table_rows(lines: list[str], header_start: str) -> list[list[str]]:
    """The data rows of the markdown table whose header starts with header_start."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    assert lines[start + 1].startswith("|---")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_delay_proxy_adds_its_round_trip_and_counts_both_ways(rig):
    from benchkit import link_host

    host = rig.add_host("bench-proxy", gpus=[idle_gpu(0)])
    payload = "x" * 100_000
    elapsed = {}
    for rtt_ms in (0, 200):
        linked = link_host(rig, host, rtt_ms)
        try:
            t0 = time.perf_counter()
            done = subprocess.run([*linked.ssh(), "cat"], input=payload, capture_output=True, text=True, timeout=60)
            elapsed[rtt_ms] = time.perf_counter() - t0
            assert done.returncode == 0, done.stderr
            assert done.stdout == payload  # in order, nothing lost, both ways
            assert linked.proxy.bytes_up > len(payload) and linked.proxy.bytes_down > len(payload)
        finally:
            linked.stop()
    # An SSH login and one command take several round trips; TCP's handshake alone is 1.5 of them.
    assert elapsed[200] - elapsed[0] > 4 * 0.2


def test_bench_gpu_status_prints_its_table():
    rows = table_rows(run_benchmark("bench_gpu_status.py", "--counts", "1,2", "--repeats", "1"), "| SSH client |")
    assert [row[:2] for row in rows] == [["openssh", "1"], ["openssh", "2"], ["paramiko", "1"], ["paramiko", "2"]]
    assert rows[0][3] == rows[2][3] == "1.00"  # each client's ratios are to its own one host


def test_bench_sync_prints_its_table():
    rows = table_rows(run_benchmark("bench_sync.py", "--sizes", "100", "--rtts", "0", "--repeats", "1"), "| files |")
    assert {row[2] for row in rows} == {"kpremote `inv sync`", "(a) tar \\| ssh", "(b) Fabric put", "(c) rsync -a"}
    kpremote = next(row for row in rows if row[2].startswith("kpremote"))
    assert kpremote[6].endswith("KB") or kpremote[6].endswith(" B")  # a re-sync of one file: no megabytes


def test_bench_run_prints_its_table():
    rows = table_rows(run_benchmark("bench_run.py", "--rtts", "0", "--repeats", "1", "--warmups", "0"), "| RTT |")
    assert [row[1] for row in rows] == ["kpremote `inv run`", "(a) tar\\|ssh + ssh run + scp", "(b) Fabric"]


def test_bench_follow_prints_its_table():
    rows = table_rows(run_benchmark("bench_follow.py", "--events", "200", "--seconds", "1", "--repeats", "1"),
                      "| events |")
    assert rows[0][0] == "200 (200 rows drawn)"


def test_bench_follow_logs_prints_its_table():
    rows = table_rows(run_benchmark("bench_follow.py", "--events", "200", "--seconds", "1", "--repeats", "1",
                                    "--command", "logs"), "| events |")
    assert rows[0][0] == "200 (200 rows drawn)"


def test_x4_host_dry_run_shows_the_gpus_and_the_arch_gate_through_ssh(tmp_path):
    """benchmarks/gpu/x4_host.sh without a GPU (its dry run: an sshd on loopback, four fixture H100s), steps 1 and 5:
    every check ran and passed, the H200 task was refused by model, and OUT holds what the device tool brings back
    (8 files at most, no folder)."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "X4_DRY": "1", "X4_DRY_GPUS": "4", "X4_DRY_MODEL": "h100",
           "X4_STEPS": "1,5", "PYTHON": sys.executable}
    done = subprocess.run(["bash", "benchmarks/gpu/x4_host.sh", "--work", str(tmp_path / "work")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    rows = table_rows((out / "summary.md").read_text().splitlines(), "| step |")
    assert [(row[0], row[2]) for row in rows] == [("1", "ok")] * 3 + [("5", "ok")] * 2
    refused = next(row for row in rows if 'arch = "h200"' in row[1])
    assert "needs an H200: GPUs 0,1,2,3 (NVIDIA H100 80GB HBM3) are not an H200" in refused[3]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "step1.log", "step5.log", "summary.md"]


def test_x4_host_step4_finds_the_work_in_any_sample_of_the_compute_processes():
    """Step 4's probe of where a run's work ran: nvidia-smi sampled while the run runs. On 2026-11-26 (4 x H200) its
    one look came before the side processes opened CUDA and read "(no compute processes)"; the run's later samples
    are what show the GPU. A process on GPU 1 in any sample fails it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("x4_host", BENCHMARKS / "gpu" / "x4_host.py")
    x4_host = sys.modules["x4_host"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
    spec.loader.exec_module(x4_host)
    gpu0, gpu1 = "GPU-90706cfe-6140-9202-6c8a-1f2cff166be4", "GPU-304aee7c-b059-bdea-13a7-c7a65ad6239c"
    early = "(no compute processes)"
    working = f"{gpu0}, 14960, 520 MiB\n{gpu0}, 14970, 516 MiB"
    seen = x4_host.where_processes_ran([early, working, working, early])
    assert seen == {gpu0: 2}
    assert x4_host.worked_on(seen, gpu0, not_on=gpu1)
    assert not x4_host.worked_on(x4_host.where_processes_ran([early, early]), gpu0, not_on=gpu1)
    stray = x4_host.where_processes_ran([working, f"{gpu0}, 14960, 520 MiB\n{gpu1}, 15001, 300 MiB"])
    assert stray == {gpu0: 2, gpu1: 1}
    assert not x4_host.worked_on(stray, gpu0, not_on=gpu1)
