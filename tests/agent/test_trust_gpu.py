"""The judge's GPU paths, on a real GPU: CUDA IPC from a pool per side, the judge's L2 flush and persisting-L2
reset, graph mode with checked replays, the floors. Skipped where torch has no GPU (the CPU runs of the same
judge are test_runner.py and test_adversarial.py); run on the lent GPU host with

    PYTHONPATH=$PWD python -m pytest -x -q tests/agent/test_trust_gpu.py

(test_runner.py, imported here, validates results against docs/schemas/results.json with jsonschema: on a host
without it, `pip download jsonschema` here for that host's Python, carry the wheels and `pip install --no-index
--target /tmp/js` them there, then add /tmp/js to PYTHONPATH; 8 of 8 on the H200 under harness 2.13, 200 s.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.test_runner import FIXTURES, agent_env, copy_fixture, results_of, rows_by_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the lent GPU host)")

LAZY_CANDIDATE = '''
import torch
from .honest import rmsnorm as honest_rmsnorm

_seen = set()


def rmsnorm(x, weight, out, eps):
    """Correct the first time it sees an output address, then does nothing (issue 11's first attack)."""
    if out.data_ptr() not in _seen:
        _seen.add(out.data_ptr())
        honest_rmsnorm(x, weight, out, eps)
'''


HOST_DELAYED_CANDIDATE = '''
import sys
import time

from .honest import rmsnorm as honest_rmsnorm


def rmsnorm(x, weight, out, eps):
    """The baseline's kernel, queued 1 ms late by the host whenever the call is a timed sample."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "sample" and frame.f_code.co_filename.endswith("side.py")):
        frame = frame.f_back
    if frame is not None:
        until = time.perf_counter() + 1e-3
        while time.perf_counter() < until:
            pass
    honest_rmsnorm(x, weight, out, eps)
'''


def gpu_run(task: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kpremote.agent.run.runner", "--task-dir", str(task), "--run-dir", str(run_dir),
               "--device", "cuda", "--root", str(run_dir.parent / "root"), "--audit", "off", *args]
    return subprocess.run(command, env=agent_env(), capture_output=True, text=True, timeout=900)


def test_flush_probe_and_persisting_reset() -> None:
    # In a process of its own: a CUDA context held by pytest would make the GPU look busy to the runs below.
    script = ("import json\nfrom kpremote.agent.harness import deviceprobe, timing\n"
              "assert timing.reset_persisting_l2() is None\nprint(json.dumps(deviceprobe.flush_probe()))")
    done = subprocess.run([sys.executable, "-c", script], env=agent_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["evicts"] and probe["method"] == "copy", probe


@pytest.mark.parametrize("mode", ["cold", "graph"])
def test_an_honest_candidate_passes_with_checked_samples(tmp_path: Path, mode: str) -> None:
    task = copy_fixture(tmp_path)
    done = gpu_run(task, tmp_path / "run", "--mode", mode)
    assert done.returncode == 0, done.stderr
    results = results_of(tmp_path / "run")
    prov = results["provenance"]
    assert prov["audit"] == "unaudited: --no-audit" and prov["gpu_readings"] == "nvml"
    # (the L2-resident copy bandwidth is used only where it exceeds DRAM's: on the H200 it read 2,615 GB/s
    # against DRAM's 4,182, so the floor stays DRAM's; both must have been measured)
    assert prov["l2_flush_probe"]["evicts"] and prov["l2_copy_bandwidth"]["gbps"] > 0 and prov["copy_bandwidth"]["gbps"] > 0
    for row in results["rows"]:
        assert row["status"] == "PASSED" and not row.get("invalid"), row
        assert row["checks"]["memory_isolation"] == "a CUDA memory pool per side"
        assert row["checks"]["checked_samples"]["candidate"] >= 1
        assert row["timing"]["mode"] == mode and (row["timing"]["calls_per_sample"] > 1) == (mode == "graph")
    assert results["headline"]["geomean"] is not None


def test_a_copy_of_the_baseline_is_same(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path)
    shutil.copy(task / "baseline" / "kernel.py", task / "solution" / "kernel.py")
    done = gpu_run(task, tmp_path / "run")
    assert done.returncode == 0, done.stdout[-2000:]
    rows = results_of(tmp_path / "run")["rows"]
    assert {r["verdict"]["verdict"] for r in rows} == {"SAME"}, [(r["workload"], r["verdict"]) for r in rows]


def test_host_time_before_the_launch_stays_out_of_the_window(tmp_path: Path) -> None:
    # The baseline's own kernel, queued 1 ms late in timed samples only (the warm-up that sets the head start sees no
    # delay, and on the H200 a row's head start stayed at 0.4-0.7 ms after its first sample): such a sample opens its
    # window before the call is queued; it is dropped and the head start grows to cover the delay. Were it kept,
    # the copy would read ~1 ms slower.
    task = copy_fixture(tmp_path)
    shutil.copy(task / "baseline" / "kernel.py", task / "solution" / "honest.py")
    (task / "solution" / "kernel.py").write_text(HOST_DELAYED_CANDIDATE)
    done = gpu_run(task, tmp_path / "run")
    assert done.returncode == 0, done.stdout[-2000:]
    for row in results_of(tmp_path / "run")["rows"]:
        timing = row["timing"]
        summary = (row["workload"], timing["head_start_us"], timing["baseline"], timing["candidate"])
        assert row["verdict"]["verdict"] == "SAME", (row["verdict"], summary)
        assert timing["candidate"]["dropped_late"] >= 1 and timing["head_start_us"] >= 1000, summary
        assert timing["candidate"]["p90"] < 2 * timing["baseline"]["p90"], summary


@pytest.mark.parametrize("mode", ["cold", "graph"])
def test_correct_once_per_address_then_idle_is_incorrect(tmp_path: Path, mode: str) -> None:
    task = copy_fixture(tmp_path)
    (task / "solution" / "kernel.py").rename(task / "solution" / "honest.py")
    (task / "solution" / "kernel.py").write_text(LAZY_CANDIDATE)
    done = gpu_run(task, tmp_path / "run", "--mode", mode)
    assert done.returncode == 1
    for row in results_of(tmp_path / "run")["rows"]:
        # Caught during timing, or already at the gate: a later correctness case reuses a freed output's address
        assert row["status"] == "INCORRECT" and ("changed behaviour during timing" in row["message"]
                                                 or "output 'out' is wrong" in row["message"]), row["message"]
    assert results_of(tmp_path / "run")["headline"]["geomean"] is None


def test_work_on_a_side_stream_is_implausible(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path)
    (task / "solution" / "kernel.py").rename(task / "solution" / "honest.py")
    shutil.copy(FIXTURES / "adversarial" / "side_stream.py", task / "solution" / "kernel.py")
    shutil.copy(FIXTURES / "adversarial" / "side_stream.toml", task / "bench" / "workloads.toml")
    for mode in ("cold", "graph"):
        run_dir = tmp_path / f"run-{mode}"
        assert gpu_run(task, run_dir, "--mode", mode).returncode == 1
        for row in rows_by_id(run_dir).values():
            assert row["status"] == "INCORRECT" and row.get("implausible"), (mode, row["workload"], row["message"])


def test_rows_in_their_context_on_the_gpu(tmp_path: Path) -> None:
    """Issue 45: tests/fixtures/tasks/tiny_context on a GPU: the honest row timed cold, warm (after the flush, the
    context's before() then the call alone) and in its context (before -> call -> after captured as one CUDA graph per
    side, its replays timed); the candidate that computes half its rows only inside the context's graph and the one
    that empties the context's next op are INCORRECT there, as on the CPU (tests/agent/test_context.py)."""
    task = copy_fixture(tmp_path, "tiny_context")
    done = gpu_run(task, tmp_path / "run")
    assert done.returncode == 1, done.stderr[-3000:]  # three rows are meant to fail
    rows = rows_by_id(tmp_path / "run")
    honest = rows["honest"]
    assert honest["status"] == "PASSED" and not honest.get("invalid"), honest
    assert honest["timing"]["mode"] == "cold" and honest["verdict"]["process_floor_us"] == 0.15
    for regime in ("warm", "context"):
        part = honest["regimes"][regime]
        assert part["timing"]["mode"] == regime and part["verdict"]["verdict"] in ("FASTER", "SAME", "SLOWER"), part
        assert len(part["timing"]["process_pairs"]) == 4 and part["timing"]["baseline"]["n"] >= 10
        assert all(n >= 1 for n in part["checks"]["checked_samples"].values()), part["checks"]
    # the whole graph (a LayerNorm, the kernel, a matmul) takes longer than the kernel alone
    assert honest["regimes"]["context"]["timing"]["baseline"]["median"] > honest["timing"]["baseline"]["median"]
    assert "regimes" not in rows["alone"] and rows["alone"]["status"] == "PASSED"
    assert rows["lazy_in_context"]["status"] == "INCORRECT" and "context regime" in rows["lazy_in_context"]["message"]
    assert rows["skips_the_next_op"]["status"] == "INCORRECT", rows["skips_the_next_op"]
    assert "after() wrote into 'next'" in rows["skips_the_next_op"]["message"], rows["skips_the_next_op"]["message"]
    # an in-place call whose context writes the input it rewrites (qknorm_rope's q and k): in one graph on the GPU
    assert rows["inplace"]["status"] == "PASSED" and set(rows["inplace"]["regimes"]) >= {"warm", "context"}, rows[
        "inplace"]
    assert rows["inplace_lazy_in_context"]["status"] == "INCORRECT", rows["inplace_lazy_in_context"]
