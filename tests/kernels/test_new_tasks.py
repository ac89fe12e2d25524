"""The two issue-17 tasks (qknorm_rope: tvm-ffi both sides; norm_scale_shift: CuTe DSL baseline, Triton candidate) on
a machine without a GPU: `inv check` runs, says NOT CHECKED for every row and exits non-zero, never PASSED; what
can be checked here is (both tvm-ffi sides compile for every production row; the Triton candidate matches the
reference in Triton's interpreter).

The upstream files are git-ignored: each test works on a copy of the task whose baseline/upstream/ is materialized
from the pinned sglang wheel by kpremote.task.baseline (what `inv baseline --task T --materialize` does: the wheel from
kpremote's cache, else pip, and every file's sha256 checked against task.toml [baseline.sha256]), at the wheel's own
paths (baseline/upstream/sglang/...). `benchmarks/gpu/new_tasks.sh upstream`, the standalone GPU script's copy of
that step, is checked against the same pins.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomllib
from rig import REPO, run_inv

from kpremote.task import baseline, wheels
from kpremote.agent.task import build, buildrules
from kpremote.agent.task.builders import compiler, tvmffi
from kpremote.agent.task.taskspec import load_task

QKNORM = "h200_diffusion_qknorm_rope__multi_shape"
CUTEDSL = "h200_diffusion_cutedsl_norm_scale_shift__multi_shape"
NORM_TANH = "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape"  # Triton both sides: only its upstream is staged
NOT_RUNNABLE_HERE = {QKNORM: {"baseline", "candidate"}, CUTEDSL: {"baseline"}}  # sides that need a GPU
SCRIPT = REPO / "benchmarks" / "gpu" / "new_tasks.sh"
HERE = Path(__file__).resolve().parent  # triton_tree_reduce.py
WHEEL_DIR = Path(os.environ.get("SGLANG_WHEEL_DIR", "/work/main/.whl/sglang"))


def materialize(kernels: Path, tasks: tuple[str, ...] = (QKNORM, CUTEDSL)) -> subprocess.CompletedProcess:
    env = {**os.environ, "KP_KERNELS": str(kernels), "SGLANG_WHEEL_DIR": str(WHEEL_DIR), "PYTHON": sys.executable,
           "KP_TASKS": ",".join(tasks)}
    return subprocess.run(["bash", str(SCRIPT), "upstream"], env=env, capture_output=True, text=True, timeout=300)


def skip_without_the_pinned_wheel() -> None:
    """The script reads the wheel each task.toml pins from SGLANG_WHEEL_DIR, else from kpremote's wheel cache."""
    wheel = tomllib.loads((REPO / "kernels" / QKNORM / "task.toml").read_text())["baseline"]["wheel"]
    if not any((folder / wheel).is_file() for folder in (WHEEL_DIR, wheels.cache_dir())):
        pytest.skip(f"{wheel} is in neither {WHEEL_DIR} (SGLANG_WHEEL_DIR) nor {wheels.cache_dir()}: nothing for "
                    "the script to read")


def task_copy(tmp_path: Path, *tasks: str) -> Path:
    """kernels/<task> copies under tmp_path with their upstream files, materialized from the pinned wheel as
    `inv baseline --materialize` does; returns the kernels folder."""
    kernels = tmp_path / "kernels"
    for task in tasks:
        shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results", "upstream"))
        done = baseline.materialize(kernels / task)
        pinned = tomllib.loads((kernels / task / "task.toml").read_text())["baseline"]["sha256"]
        assert done.files == len(pinned) > 0
        assert all((kernels / task / "baseline" / "upstream" / path).is_file() for path in pinned)
    return kernels


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return task_copy(tmp_path_factory.mktemp("new_tasks"), QKNORM, CUTEDSL)


# ------------------------------------------------------------------------------------------------ inv check


@pytest.mark.parametrize("task", [QKNORM, CUTEDSL])
def test_inv_check_says_not_checked_for_every_row_and_fails(task: str, kernels: Path) -> None:
    result = run_inv("check", "--task", task, cwd=kernels.parent, timeout=900)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    # nothing of it can be checked without a GPU: said (status "not checked"), never a pass, and not the newcomer's
    # first command failing (issue 47 item 10); the run's own record stays failed
    assert result.returncode == 0 and "not checked" in output, output
    [summary] = (kernels / task / "results" / "check").glob("*/summary/results.json")
    results = json.loads(summary.read_text())
    rows = results["rows"]
    assert rows and all(row["smoke"] for row in rows), (results.get("message"), output)
    assert {row["status"] for row in rows} == {buildrules.NOT_CHECKED}, [(r["workload"], r["status"]) for r in rows]
    record = results["provenance"]["build"]
    assert record["ok"] and record["compile_only"]
    assert set(record["not_checked"]) == NOT_RUNNABLE_HERE[task]
    assert all("cannot run without a GPU" in why for why in record["not_checked"].values())
    if task == QKNORM and compiler.find_nvcc() is None:
        assert record["note"].startswith("compile-only check skipped: nvcc not found")
    elif task == QKNORM:  # both tvm-ffi sides got the compile-only check, with the one flag list
        assert record["exports"] == [["qknorm_rope", "QKNormRopeKernel<{args}>::run"]] and record["note"] is None
        logs = {side: (summary.parents[1] / record["sides"][side]["log"]).read_text() for side in ("baseline", "candidate")}
        include = kernels / task / "baseline" / "upstream" / "sglang" / "kernels" / "jit" / "include"
        assert f"-I{include}" in logs["baseline"] and "upstream" not in logs["candidate"]
        for log in logs.values():
            assert "generated.cu" in log and "-DSGL_CUDA_ARCH=900 -std=c++20 -O3 --expt-relaxed-constexpr" in log


# ------------------------------------------------------------------------------------------------ what runs here


def test_both_qknorm_sides_compile_for_every_production_rows_template_arguments(kernels: Path, tmp_path: Path) -> None:
    """One unit per side with an export per distinct production instantiation, for sm_90 (the H200), no link."""
    pytest.importorskip("tvm_ffi")
    from tvm_ffi import libinfo

    nvcc = compiler.find_nvcc()
    if nvcc is None:
        pytest.fail("nvcc not found: the compile check of the production instantiations needs a CUDA toolkit")
    spec = load_task(kernels / QKNORM)
    adapter = build.import_adapter(spec)
    instances = sorted({", ".join(tvmffi.cpp_args(adapter.template_args(w.params)))
                        for w in spec.workloads if w.production})
    assert instances, "no production row"
    (target,) = [t for _, t in spec.build.exports]

    def compile_side(side: str) -> subprocess.CompletedProcess:
        unit = tmp_path / f"{side}.cu"
        unit.write_text(tvmffi.generated_unit(spec, side, None) + "".join(
            f"TVM_FFI_DLL_EXPORT_TYPED_FUNC(row_{i}, ({target.replace('{args}', args)}));\n"
            for i, args in enumerate(instances)))
        includes = [*compiler.include_paths(spec, side), libinfo.find_include_path(), libinfo.find_dlpack_include_path()]
        command = [nvcc, "-std=c++17", "-O2", "-gencode=arch=compute_90,code=sm_90", *spec.build.flags,
                   *(f"-I{p}" for p in includes), "-c", str(unit), "-o", str(tmp_path / f"{side}.o")]
        return subprocess.run(command, capture_output=True, text=True, timeout=900)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(("baseline", "candidate"), pool.map(compile_side, ("baseline", "candidate"))))
    for side, result in done.items():
        errors = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line][:3]
        assert result.returncode == 0, f"{side}: {errors}"


_CANDIDATE_ON_THE_INTERPRETER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import torch
    from kpremote.agent.task import build
    from kpremote.agent.task.taskspec import load_task
    sys.path.insert(0, sys.argv[3])
    import triton_tree_reduce
    triton_tree_reduce.install()  # the LayerNorm rows' tl.reduce by halves, not one Python call per element

    class NotHere:
        def __getattr__(self, name):
            raise RuntimeError("the CuTe DSL baseline cannot run without a GPU")

    spec = load_task(Path(sys.argv[2]))
    adapter = build.import_adapter(spec)
    adapter.bind(baseline=NotHere(), candidate=build.import_side(spec, "candidate"))
    report = []
    for w in spec.smoke_rows():
        case = adapter.make_case(w.params, device="cpu", seed=0)
        expected = adapter.reference(w.params, case.inputs)
        for t in case.outputs_candidate.values():
            t.fill_(float("nan"))
        adapter.call_candidate(w.params, case.inputs, case.outputs_candidate)
        for key, out in case.outputs_candidate.items():
            got, want = out.double(), expected[key].double()
            ok = bool(torch.isfinite(got).all() and torch.isclose(got, want, atol=case.atol, rtol=case.rtol).all())
            report.append([w.id, key, ok, (got - want).abs().max().item()])
    print(json.dumps(report))
    """
)


def test_the_triton_candidate_matches_the_reference_on_the_interpreter(kernels: Path) -> None:
    """Every smoke row, every element, against the float64 reference (the reduction by triton_tree_reduce)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _CANDIDATE_ON_THE_INTERPRETER, str(REPO), str(kernels / CUTEDSL),
                           str(HERE)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report and len({row for row, *_ in report}) == len(load_task(kernels / CUTEDSL).smoke_rows())
    assert [r for r in report if not r[2]] == []


_TREE_AGAINST_TRITONS_FOLD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter
    sys.path.insert(0, sys.argv[1])
    import triton_tree_reduce

    @triton.jit
    def pair_sum(a0, a1, b0, b1):
        return a0 + b0, a1 + b1

    @triton.jit
    def rows(x_ptr, total_ptr, squares_ptr, N: tl.constexpr, BLOCK: tl.constexpr):  # one program per row
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0)
        total, squares = tl.reduce((x, x * x), 0, pair_sum)
        tl.store(total_ptr + row, total)
        tl.store(squares_ptr + row, squares)

    def reduced(n, block):
        x = torch.arange(3 * n, dtype=torch.int64).reshape(3, n) - n  # exact in any order of additions
        total, squares = torch.empty(3, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
        rows[(3,)](x, total, squares, N=n, BLOCK=block)
        return total.tolist() + squares.tolist()

    shapes = [(1, 1), (5, 8), (7, 8), (33, 64), (100, 128)]
    fold = [reduced(n, block) for n, block in shapes]  # Triton's own per-element fallback
    triton_tree_reduce.install()
    assert interpreter.ReduceOps.generic_reduce is triton_tree_reduce.tree_reduce
    print(json.dumps({"fold": fold, "tree": [reduced(n, block) for n, block in shapes]}))
    """
)


def test_the_reduction_tree_gives_what_tritons_own_fold_gives() -> None:
    """The candidate's interpreter check reduces by triton_tree_reduce: on integers (exact in any order) it agrees
    with the interpreter's own per-element fold, for blocks of 1 to 128 elements, masked tails included."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _TREE_AGAINST_TRITONS_FOLD, str(HERE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    rows = [[range(r * n - n, r * n) for r in range(3)] for n in (1, 5, 7, 33, 100)]  # x's rows, as arange makes
    sums = [[sum(row) for row in x] + [sum(v * v for v in row) for row in x] for x in rows]
    assert report["fold"] == sums  # Triton's fold really reduced the rows: the comparison below means something
    assert report["tree"] == report["fold"]


# ------------------------------------------------------------------------------------------------ the pins


def test_new_tasks_sh_materializes_the_wheel_paths_as_task_toml_pins_them(tmp_path: Path) -> None:
    """The standalone script writes baseline/upstream/<path> with <path> as the wheel holds it (no python/ prefix),
    the same bytes kpremote.task.baseline materializes."""
    skip_without_the_pinned_wheel()
    kernels = tmp_path / "kernels"
    tasks = (QKNORM, CUTEDSL, NORM_TANH)
    for task in tasks:
        shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results", "upstream"))
    done = materialize(kernels, tasks)
    assert done.returncode == 0, done.stdout + done.stderr
    for task in tasks:
        assert f"{task}: " in done.stdout and "sha256 as task.toml pins them" in done.stdout
        assert baseline.ensure_upstream(kernels / task) is None  # every pinned file there, with its pinned sha256
        assert not (kernels / task / "baseline" / "upstream" / "python").exists()


def test_new_tasks_sh_refuses_an_upstream_file_whose_sha256_differs_from_the_pin(tmp_path: Path) -> None:
    skip_without_the_pinned_wheel()
    kernels = tmp_path / "kernels"
    for task in (QKNORM, CUTEDSL):
        shutil.copytree(REPO / "kernels" / task, kernels / task, ignore=shutil.ignore_patterns("results", "upstream"))
    toml = kernels / CUTEDSL / "task.toml"
    pinned = "6ab4c5c6009a4ff23eef74a399617e4075dcb6cc98019947e210ec21cd573f6b"
    assert toml.read_text().count(pinned) == 1
    toml.write_text(toml.read_text().replace(pinned, "0" * 64))
    done = materialize(kernels)
    assert done.returncode != 0
    assert (f"{CUTEDSL}: sglang/kernels/ops/diffusion/norm/scale_residual_norm_cutedsl.py: sha256 {pinned} "
            f"in the wheel, task.toml [baseline.sha256] pins {'0' * 64}") in done.stderr
    assert not (kernels / CUTEDSL / "baseline" / "upstream").exists()
