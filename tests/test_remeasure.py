"""benchmarks/gpu/remeasure.sh without a GPU: its steps checked before anything runs, the carries `pack` makes (one
path a call, under the device's 64 MiB), the H200 gate, and which tasks a call still has to run. Each case runs the
real script in a throwaway tree of its own (a git repository with the six tasks' upstream folders), never here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from rig import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "remeasure.sh"
FAMILIES = ("fuse_scale_shift", "group_norm_silu", "qknorm_rope", "cutedsl_norm_scale_shift", "norm_infer",
            "rotary_embedding", "cutedsl_norm_tanh_mul_add")
W = "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"
WHEELS_2 = [f"parts/{W}.partaa", "apache_tvm_ffi-0.1.15.post2-cp312-abi3-manylinux_2_28_x86_64.whl",
            "nvidia_cutlass_dsl-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
            "nvidia_cutlass_dsl_libs_base-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
            "nvidia_cutlass_dsl_libs_core-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
            "cuda_bindings-13.0.3-cp312-cp312-manylinux_2_28_x86_64.whl", "cuda_pathfinder-1.3.1-py3-none-any.whl",
            "einops-0.8.1-py3-none-any.whl"]
WHEELS_3 = [f"parts/{W}.partab", f"parts/{W}.partac", "protobuf-6.33.0-cp39-abi3-manylinux2014_x86_64.whl"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository root as the script wants one: the script, the seven tasks' upstream files, new_tasks.sh's wheels."""
    root = tmp_path / "repo"
    (root / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "benchmarks" / "gpu" / "remeasure.sh")
    for family in FAMILIES:
        upstream = root / "kernels" / f"h200_diffusion_{family}__multi_shape" / "baseline" / "upstream" / "sglang"
        upstream.mkdir(parents=True)
        (upstream / f"{family}.py").write_text(f"# {family}\n")
    for name in WHEELS_2 + WHEELS_3:
        (root / ".whl" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / ".whl" / name).write_text(name)
    (root / ".gitignore").write_text("/.gpustage/\n/.whl/\nupstream/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    return root


def remeasure(root: Path, *args: str, path: str | None = None, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OUT": str(root.parent / "out"), "REMEASURE_WORK": str(root.parent / "work"),
               "PYTHONPATH": str(REPO), **env}
    if path is not None:
        environ["PATH"] = path
    return subprocess.run(["bash", "benchmarks/gpu/remeasure.sh", *args], cwd=root, capture_output=True, text=True,
                          timeout=120, env=environ)


def test_steps_are_checked_before_anything_runs(tree):
    for args, said in ((["tasks", "fuse,nope"], "no task 'nope'"), (["tasks"], "'tasks' needs a list"),
                       (["bogus"], "no step 'bogus'"), (["pack", "redteam"], "'pack' runs here, alone"), ([], "usage"),
                       (["profile", "qknorm_rope"], "'profile' needs TASK:ROW"),
                       (["profile", "cutedsl:r1,nope:r2"], "profile nope:r2: no task 'nope'")):
        done = remeasure(tree, *args)
        assert done.returncode == 2 and said in done.stdout, (args, done.stdout, done.stderr)
        assert done.stdout.count("\n") == 1
    assert not (tree.parent / "out").exists() and not (tree.parent / "work").exists()


def test_pack_makes_one_carry_per_call_each_under_64_mib(tree):
    done = remeasure(tree, "pack")
    assert done.returncode == 0, done.stdout + done.stderr
    stage = tree / ".gpustage"
    for n, wheels in ((1, []), (2, WHEELS_2), (3, WHEELS_3)):
        carry = stage / f"remeasure-{n}"
        assert sorted(p.name for p in (carry / "whl").iterdir()) == sorted(Path(w).name for w in wheels)
        stamps = {p.stem: json.loads(p.read_text()) for p in (carry / "stamps").iterdir()}  # the pins, as a sync's
        assert sorted(stamps) == sorted(f"h200_diffusion_{f}__multi_shape" for f in FAMILIES)
        assert all("task_pin" in stamp and stamp["task_digest"] for stamp in stamps.values())
        with tarfile.open(carry / "upstream.tgz") as archive:  # every task's upstream files in every call
            files = [m.name for m in archive.getmembers() if m.isfile()]
        assert sorted(files) == sorted(f"kernels/h200_diffusion_{f}__multi_shape/baseline/upstream/sglang/{f}.py"
                                       for f in FAMILIES)
    # a wheel missing, and a carry over the device's 64 MiB, are refused with the line that says which
    (tree / ".whl" / "einops-0.8.1-py3-none-any.whl").unlink()
    done = remeasure(tree, "pack")
    assert done.returncode == 2 and "pack: no .whl/einops-*.whl" in done.stdout
    (tree / ".whl" / "einops-0.8.1-py3-none-any.whl").write_text("back")
    os.truncate(tree / ".whl" / WHEELS_3[0], 65 * 1024 * 1024)
    done = remeasure(tree, "pack")
    assert done.returncode == 2 and ".gpustage/remeasure-3" in done.stdout and "over a call's 64 MiB" in done.stdout
    shutil.rmtree(tree / "kernels" / "h200_diffusion_rotary_embedding__multi_shape" / "baseline" / "upstream")
    done = remeasure(tree, "pack")
    assert done.returncode == 2 and "inv baseline --materialize --task h200_diffusion_rotary_embedding" in done.stdout


def test_a_gpu_other_than_an_h200_runs_nothing(tree, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = remeasure(tree, "tasks", "fuse", path=f"{bin_dir}:{os.environ['PATH']}")
    assert done.returncode == 3, done.stdout + done.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "GPU is 'NVIDIA H100 80GB HBM3', not an H200" in summary and "nothing run" in summary
    assert not (tmp_path / "work" / "runs").exists()


def test_tasks_all_is_what_this_machine_has_not_finished(tree, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    task = "h200_diffusion_{}__multi_shape"
    # an earlier call on this machine: fuse finished (its grid failed: exit 1 is finished too), qknorm_rope was cut
    (work / "steps-20261127-090000.tsv").write_text(
        f"{work}/kernels/{task.format('fuse_scale_shift')}\t{work}/runs/x/1\t1\t250\n"
        f"{work}/kernels/{task.format('qknorm_rope')}\t{work}/runs/x/2\t124\t500\n")
    done = remeasure(tree, "tasks", "all", REMEASURE_DRY="1", REMEASURE_BUDGET_S="0")
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line.split(":")[0] for line in done.stdout.splitlines() if ": skipped, needs ~30 s" in line]
    assert skipped[:5] == ["group_norm_silu", "qknorm_rope", "cutedsl", "norm_infer", "rotary"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "left on this machine (no finished run here yet): group_norm_silu,qknorm_rope,cutedsl,norm_infer,rotary" \
        in summary


def test_parallel_starts_every_task_before_any_ends(tree, tmp_path):
    # REMEASURE_PARALLEL=1 (a host of several GPUs): each task's runner starts while the others run. The stand-in
    # runner waits (up to 60 s) to see all three started: run one after another, each would see only itself.
    log = tmp_path / "runners.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = kpremote.agent.run.runner ]; then
  echo start >> {log}
  for i in $(seq 600); do [ "$(grep -c start {log})" -ge 3 ] && break; sleep 0.1; done
  echo "saw $(grep -c start {log})" >> {log}
  exit 0
fi
exec python3 "$@"
""")
    fake.chmod(0o755)
    done = remeasure(tree, "tasks", "fuse,rotary,norm_infer", REMEASURE_DRY="1", REMEASURE_PARALLEL="1",
                     REMEASURE_ROWS="r1", PYTHON=str(fake))
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().split("\n").count("saw 3") == 3, log.read_text()
    steps = (tmp_path / "out" / "steps.txt").read_text()
    assert all(f"{name}: exit 0" in steps for name in ("fuse", "rotary", "norm_infer")), steps


def test_chain_runs_the_tasks_one_at_a_time_beside_the_red_team(tree, tmp_path):
    # REMEASURE_PARALLEL=chain (a two-GPU host): the tasks one after another on one GPU, the red team at once on the
    # other. The stand-in runner waits (up to 30 s) for the red team to start and notes any runner still running.
    log = tmp_path / "runners.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = kpremote.agent.run.runner ]; then
  [ -e {tmp_path}/running ] && echo overlap >> {log}
  touch {tmp_path}/running; echo start >> {log}
  for i in $(seq 300); do grep -q redteam {log} && break; sleep 0.1; done
  grep -q redteam {log} && echo "beside the red team" >> {log}
  rm -f {tmp_path}/running
  exit 0
fi
exec python3 "$@"
""")
    fake.chmod(0o755)
    stub = tree / "benchmarks" / "gpu" / "redteam.sh"
    stub.write_text(f"echo redteam >> {log}\nsleep 1\n")
    done = remeasure(tree, "tasks", "fuse,rotary", "redteam", REMEASURE_DRY="1", REMEASURE_PARALLEL="chain",
                     REMEASURE_ROWS="r1", PYTHON=str(fake))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = log.read_text().split("\n")
    assert lines.count("start") == 2 and "overlap" not in lines, lines
    assert lines.count("beside the red team") == 2, lines
    steps = (tmp_path / "out" / "steps.txt").read_text()
    assert "fuse: exit 0" in steps and "rotary: exit 0" in steps and "redteam: exit 0" in steps, steps
