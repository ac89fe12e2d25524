"""`inv check` (the CPU smoke run) passes for every shipped task, and an H200 host refuses the b200 copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rig import REPO, idle_gpu, run_inv

H200_TASKS = [
    "h200_diffusion_fuse_scale_shift__multi_shape",
    "h200_diffusion_norm_infer__multi_shape",
    "h200_diffusion_rotary_embedding__multi_shape",
]


@pytest.mark.timeout(900)  # a CUDA task's compile-only check really compiles: two `nvcc -c` over torch's headers
@pytest.mark.parametrize("task", H200_TASKS)
def test_inv_check_passes_on_the_cpu(task: str, tmp_path: Path) -> None:
    """The copy has no baseline/upstream/ (it is never committed): `inv check` materializes it from the pinned
    sglang wheel first (downloaded once into the kpremote cache), then runs the smoke rows."""
    kernels = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results", "upstream"))
    result = run_inv("check", "--task", task, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "baseline/upstream/ materialized from sglang-0.5.23-" in result.stderr.replace("\n", "")
    assert "smoke: timings are not meaningful" in result.stdout
    [summary] = (kernels / task / "results" / "check").glob("*/summary/results.json")
    document = json.loads(summary.read_text())
    rows = document["rows"]
    assert rows and all(r["smoke"] for r in rows)
    assert document["provenance"]["baseline_upstream"]["release"] == "sglang 0.5.23"
    if "norm_infer" in task:  # a CUDA candidate cannot run on the CPU: its rows say so, never PASSED
        assert {r["status"] for r in rows} <= {"SKIPPED", "NOT CHECKED"}
    else:
        assert {r["status"] for r in rows} == {"PASSED"}


def test_the_norm_infer_baseline_runs_its_smoke_rows_on_the_cpu(tmp_path: Path) -> None:
    """SGLang's Triton norm kernels (the baseline) through Triton's interpreter, against the adapter's float64
    reference: what `inv check` cannot show while the CUDA candidate is NOT CHECKED there."""
    task = "h200_diffusion_norm_infer__multi_shape"
    shutil.copytree(REPO / "kernels" / task, tmp_path / task, ignore=shutil.ignore_patterns("results", "upstream"))
    from kpremote.baseline import ensure_upstream

    assert ensure_upstream(tmp_path / task)
    script = """
import sys, torch
from pathlib import Path
from kpremote.agent import build
from kpremote.agent.taskspec import load_task
spec = load_task(Path(sys.argv[1]))
adapter = build.import_adapter(spec)
adapter.bind(baseline=build.import_side(spec, "baseline"), candidate=None)
for row in spec.smoke_rows():
    case = adapter.make_case(row.params, device="cpu", seed=0)
    adapter.call_baseline(row.params, case.inputs, case.outputs_baseline)
    got, want = case.outputs_baseline["out"].double(), adapter.reference(row.params, case.inputs)["out"]
    assert torch.isfinite(got).all(), row.id
    assert torch.allclose(got, want, atol=case.atol, rtol=case.rtol), (row.id, (got - want).abs().max().item())
    print("ok", row.id)
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / task)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "grid_rms_b1_l6_c512_bf16_w", "ok", "grid_layer_b2_l33_c512_bf16_wb",
                                   "ok", "extra_rms_b4_l257_c128_bf16_w"]


def test_an_h200_host_refuses_the_b200_task(rig, tmp_path: Path) -> None:
    task = "b200_diffusion_fuse_scale_shift__multi_shape"
    shutil.copytree(REPO / "kernels" / task, tmp_path / "kernels" / task, ignore=shutil.ignore_patterns("results"))
    host = rig.add_host("h200-only", gpus=[idle_gpu(0), idle_gpu(1)])
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [host])
    result = run_inv("run", "--hosts", str(hosts), "--host", "h200-only", "--task", task, cwd=tmp_path)
    assert result.returncode == 2
    assert "task arch b200 needs compute capability 10.x" in result.stderr
    assert "GPUs 0,1 NVIDIA H200 are 9.0" in result.stderr and "Traceback" not in result.stderr
    assert not list((host.root / "tasks" / task / "runs").glob("*"))  # nothing started
