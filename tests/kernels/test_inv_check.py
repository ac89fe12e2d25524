"""`inv check` (the CPU smoke run) passes for every shipped task whose sides all run on the CPU, says NOT CHECKED
(status "not checked", exit 0: never a pass, never a failure of the candidate) for the one whose CUDA candidate
cannot run there (after compile-checking it) and for the one whose task.toml says it is checked on a GPU only, and an
H100 host refuses the task that serves the H200 and the B200."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rig import REPO, idle_gpu, run_inv

from kpremote.agent.task import buildrules
from kpremote.agent.task.builders import compiler

H200_TASKS = [
    "h200_diffusion_fuse_scale_shift__multi_shape",
    "h200_diffusion_norm_infer__multi_shape",
    "h200_diffusion_rotary_embedding__multi_shape",
    "h200_diffusion_group_norm_silu__multi_shape",
]


CPU_RUNNABLE_TASKS = [t for t in H200_TASKS if "norm_infer" not in t]  # every side Triton: runs in the interpreter
NORM_INFER = "h200_diffusion_norm_infer__multi_shape"  # a Triton baseline against a CUDA candidate
NORM_TANH = "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape"  # a Triton baseline that refuses the interpreter


def inv_check_copy(task: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """`inv check` on a copy without baseline/upstream/ (it is never committed): the check materializes it from
    the pinned sglang wheel first (downloaded once into the kpremote cache), then runs the smoke rows. Returns the
    run and its summary/results.json."""
    kernels = tmp_path / "kernels"
    shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results", "upstream"))
    result = run_inv("check", "--task", task, cwd=tmp_path, timeout=900)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert "baseline/upstream/ materialized from sglang-0.5.23-" in result.stderr.replace("\n", ""), output
    assert "smoke: timings are not meaningful" in result.stdout, output
    [summary] = (kernels / task / "results" / "check").glob("*/summary/results.json")
    document = json.loads(summary.read_text())
    assert document["rows"] and all(r["smoke"] for r in document["rows"])
    assert document["provenance"]["baseline_upstream"]["release"] == "sglang 0.5.23"
    return result, document


@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", CPU_RUNNABLE_TASKS)
def test_inv_check_passes_on_the_cpu(task: str, tmp_path: Path) -> None:
    result, document = inv_check_copy(task, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {r["status"] for r in document["rows"]} == {"PASSED"}


@pytest.mark.timeout(900)  # the CUDA candidate's compile-only check really compiles: `nvcc -c` over torch's headers
def test_inv_check_says_not_checked_for_the_cuda_candidate(tmp_path: Path) -> None:
    """A CUDA candidate cannot run on the CPU: every row is NOT CHECKED (never PASSED), the check says so and exits
    0 (the run's own record stays failed, exit 1); what can be checked here was: the Triton baseline side built,
    the CUDA candidate compiled with nvcc -c (or a note says why that check was skipped)."""
    result, document = inv_check_copy(NORM_INFER, tmp_path)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output  # not a pass (its status says not checked), not the candidate's failure
    assert f"{NORM_INFER}: not checked on this CPU: candidate side (cuda) cannot run without a GPU" in result.stdout
    assert document["exit_code"] == 1 and document["status"] == "failed"  # results.json: never a pass
    assert "Traceback" not in result.stderr, output
    rows = document["rows"]
    assert {r["status"] for r in rows} == {buildrules.NOT_CHECKED}, [(r["workload"], r["status"]) for r in rows]
    assert all("candidate side (cuda) cannot run without a GPU" in r["message"] for r in rows)
    record = document["provenance"]["build"]
    assert record["kinds"] == {"baseline": "triton", "candidate": "cuda"}
    assert record["ok"] and record["compile_only"] and set(record["not_checked"]) == {"candidate"}
    assert record["sides"]["baseline"]["ok"] and record["sides"]["baseline"]["error"] is None
    assert record["sides"]["candidate"]["ok"] and record["sides"]["candidate"]["error"] is None
    run_dir = next((tmp_path / "kernels" / NORM_INFER / "results" / "check").glob("*/summary")).parent
    candidate_log = (run_dir / record["sides"]["candidate"]["log"]).read_text()
    if compiler.find_nvcc() is None:
        assert record["note"].startswith("compile-only check skipped: nvcc not found")
    else:  # compiled, with the task's one flag list, into an object file and no further
        assert record["note"] is None
        assert " -c " in candidate_log and "solution/kernel.cu" in candidate_log
        assert "-O3 -std=c++20 --generate-code=arch=compute_90,code=sm_90" in candidate_log
        assert "-D__CUDA_NO_HALF_OPERATORS__" in candidate_log  # torch's own flags, as the GPU build passes them
        assert list((run_dir / "raw" / "build" / "candidate").glob("kernel.cu.o"))


@pytest.mark.timeout(900)
def test_inv_check_of_norm_tanh_mul_add_says_it_is_checked_on_a_gpu_only(tmp_path: Path) -> None:
    """SGLang's Z-Image kernels compute in bf16, which Triton's interpreter computes on raw 16-bit integers: the task
    says so (task.toml [task] gpu_only), so every smoke row is NOT CHECKED with that line, nothing is called (never
    PASSED, never numbers that are not upstream's), and the newcomer's check says so and exits 0. The candidate is
    checked there by tests/kernels/test_tasks_compile.py."""
    result, document = inv_check_copy(NORM_TANH, tmp_path)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    assert "Traceback" not in result.stderr, output
    assert f"{NORM_TANH}: not checked on this CPU: checked on a GPU only: its baseline" in result.stdout, output
    rows = document["rows"]
    assert {r["status"] for r in rows} == {buildrules.NOT_CHECKED}, [(r["workload"], r["status"]) for r in rows]
    assert all("cannot run under Triton's interpreter" in r["message"] for r in rows)


def test_the_norm_infer_baseline_runs_its_smoke_rows_on_the_cpu(tmp_path: Path) -> None:
    """SGLang's Triton norm kernels (the baseline) through Triton's interpreter, against the adapter's float64
    reference: what `inv check` cannot show while the CUDA candidate is NOT CHECKED there."""
    task = "h200_diffusion_norm_infer__multi_shape"
    shutil.copytree(REPO / "kernels" / task, tmp_path / task, ignore=shutil.ignore_patterns("results", "upstream"))
    from kpremote.task.baseline import ensure_upstream

    assert ensure_upstream(tmp_path / task)
    script = """
import sys, torch
from pathlib import Path
from kpremote.agent.task import build
from kpremote.agent.task.taskspec import load_task
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


def test_an_h100_host_refuses_the_h200_and_b200_task(rig, tmp_path: Path) -> None:
    task = "h200_diffusion_fuse_scale_shift__multi_shape"  # arch = ["h200", "b200"]
    shutil.copytree(REPO / "kernels" / task, tmp_path / "kernels" / task, ignore=shutil.ignore_patterns("results"))
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}  # compute capability 9.0, as an H200
    host = rig.add_host("h100-only", gpus=[idle_gpu(0, **h100), idle_gpu(1, **h100)])
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [host])
    result = run_inv("run", "--hosts", str(hosts), "--host", "h100-only", "--task", task, cwd=tmp_path)
    assert result.returncode == 2
    assert ("task arch h200,b200 needs an H200 or a B200: GPUs 0,1 (NVIDIA H100 80GB HBM3) are not an H200 and are "
            "not a B200") in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((host.root / "tasks" / task / "runs").glob("*"))  # nothing started
