"""benchmarks/gpu/context.sh without a GPU (CONTEXT_DRY=1: --device cpu): the dial's A/A rows in context go through
the runner and come back as context_report.py's tables and one tgz; a task whose upstream files were not carried is
skipped and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from rig import REPO


def test_the_context_scripts_dry_run_times_the_dials_aa_rows_in_three_regimes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "benchmarks" / "gpu").mkdir(parents=True)
    for name in ("context.sh", "context_report.py"):
        shutil.copy(REPO / "benchmarks" / "gpu" / name, root / "benchmarks" / "gpu" / name)
    shutil.copytree(REPO / "benchmarks" / "gpu" / "dial", root / "benchmarks" / "gpu" / "dial")
    fuse = "h200_diffusion_fuse_scale_shift__multi_shape"
    group_norm = "h200_diffusion_group_norm_silu__multi_shape"
    for task in (fuse, group_norm):
        shutil.copytree(REPO / "kernels" / task, root / "kernels" / task, ignore=shutil.ignore_patterns("upstream"))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CONTEXT_WORK": str(tmp_path / "work"), "CONTEXT_DRY": "1",
           "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "benchmarks/gpu/context.sh", "tasks", "fuse,group_norm_silu,bogus", "aa", "1"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert f"fuse: skipped, no kernels/{fuse}/baseline/upstream: carry it" in summary, summary
    assert f"group_norm_silu: skipped, no kernels/{group_norm}/baseline/upstream: carry it" in summary, summary
    assert "tasks: 'bogus' is not one of: all fuse norm_infer cutedsl group_norm_silu norm_tanh rotary qknorm_rope" in (
        summary), summary
    for regime in ("cold", "warm", "context"):  # the four launch-bound A/A rows, each in every regime
        assert f"| t384_ctx_aa1 | {regime} | " in summary, summary
        assert f"| {regime} | 4 | 0 | 0 | 0 | 4 PASSED |" in summary, summary  # a CPU run says no word (smoke)
    [packed] = out.glob("context-*.tgz")
    with tarfile.open(packed) as tar:
        names = tar.getnames()
    assert any(n.startswith("runs/aa/") and n.endswith("summary/results.json") for n in names), names
    assert any(n.startswith("logs/aa-") for n in names) and not any("/raw/scratch" in n for n in names)
