"""`inv check` (the CPU smoke run) passes for every shipped task, and an H200 host refuses the b200 copy."""

from __future__ import annotations

import json
import shutil
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
    kernels = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results"))
    result = run_inv("check", "--task", task, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "smoke: timings are not meaningful" in result.stdout
    [summary] = (kernels / task / "results" / "check").glob("*/summary/results.json")
    rows = json.loads(summary.read_text())["rows"]
    assert rows and all(r["smoke"] for r in rows)
    kind = "cuda" if "norm_infer" in task else "triton"
    if kind == "triton":
        assert {r["status"] for r in rows} == {"PASSED"}
    else:  # a CUDA side cannot run on the CPU: its rows say so, the build was at least checked
        assert {r["status"] for r in rows} == {"SKIPPED"}
        assert all("CUDA" in (r["message"] or "") for r in rows)


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
