"""Build kinds: which kinds may face each other (refusals name file, field and rule), one builder per kind, the
package a kind needs, and what a machine without a GPU can check (the rest is NOT CHECKED, never passed)."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path

import pytest

from kpremote.agent.task import build, builders, buildrules
from kpremote.agent.task.builders import compiler, tvmffi
from kpremote.agent.task.buildrules import (
    FREE_BASELINE_KINDS,
    KINDS,
    NOT_CHECKED,
    parse_build,
)
from kpremote.agent.task.taskspec import TaskSpecError, load_task

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "tiny_rmsnorm"
TOML = Path("tiny_rmsnorm/task.toml")


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "tiny_rmsnorm"
    shutil.copytree(FIXTURE, copy)
    monkeypatch.chdir(tmp_path)
    return copy


def set_build(task: Path, table: str) -> None:
    text = (task / "task.toml").read_text()
    head, _, rest = text.partition("[build]\nkind = \"triton\"\nflags = []\n")
    assert rest, "the fixture's [build] table changed"
    (task / "task.toml").write_text(f"{head}[build]\n{table}\n{rest}")


def refused(values: dict) -> str:
    with pytest.raises(TaskSpecError) as caught:
        parse_build(TOML, values)
    return str(caught.value)


def minimal(baseline: str, candidate: str) -> dict:
    """The least [build] table that names these kinds validly."""
    values: dict = {"kind": baseline if baseline == candidate else {"baseline": baseline, "candidate": candidate}}
    if {baseline, candidate} & {"cuda", "tvm-ffi"}:
        values["sources"] = ["kernel.cu"]
    if "tvm-ffi" in (baseline, candidate):
        values["exports"] = {"scale": "Scale<{args}>::run"}
    return values


# ------------------------------------------------------------------------------------------------ the matrix


@pytest.mark.parametrize("baseline,candidate", list(itertools.product(KINDS, KINDS)))
def test_kind_pairs_follow_the_rule_sheet(baseline: str, candidate: str) -> None:
    values = minimal(baseline, candidate)
    if baseline == candidate or baseline in FREE_BASELINE_KINDS:
        spec = parse_build(TOML, values)
        assert spec.kinds == (baseline, candidate)
        assert buildrules.kind_of(spec, "baseline") == baseline and buildrules.kind_of(spec, "candidate") == candidate
        assert spec.kind == (baseline if baseline == candidate else f"{baseline}+{candidate}")
    else:
        message = refused(values)
        assert message.startswith(f'tiny_rmsnorm/task.toml: [build] kind = {{baseline = "{baseline}", '
                                  f'candidate = "{candidate}"}} — refused: a "{baseline}" baseline needs the '
                                  f"candidate built by the same builder with the same registration style")
        assert "rule sheet" in message and f'allowed: kind = "{baseline}"' in message


def test_an_old_task_toml_keeps_its_meaning(task: Path) -> None:
    spec = load_task(task)
    assert (spec.build.kind, spec.build.kinds, spec.build.flags, spec.build.entry) == ("triton", ("triton", "triton"), (), "kernel")


def test_unknown_kind_and_bad_per_side_tables_are_named() -> None:
    assert refused({"kind": "rust"}) == (
        'tiny_rmsnorm/task.toml: [build] kind = "rust" — allowed: "triton", "cuda", "tvm-ffi", "cutedsl", "python"')
    assert refused({"kind": {"baseline": "triton", "candidate": "rust"}}).startswith(
        'tiny_rmsnorm/task.toml: [build] kind.candidate = "rust" — allowed:')
    assert "missing 'candidate'" in refused({"kind": {"baseline": "triton"}})
    assert "unknown key 'solution'" in refused({"kind": {"baseline": "triton", "candidate": "cuda", "solution": "cuda"}})
    assert "allowed: one of" in refused({"kind": ["triton", "cuda"]})


# ------------------------------------------------------------------------------------------------ flags


def test_fast_math_is_refused_when_only_one_side_is_compiled() -> None:
    values = {**minimal("triton", "cuda"), "flags": ["-O3", "--use_fast_math"]}
    assert refused(values) == (
        "tiny_rmsnorm/task.toml: [build] flags '--use_fast_math' — refused: only the candidate side is compiled, "
        "so fast math would change one side's numerics (rule sheet: no fast math unless both sides use it)")
    for flag in ("-use_fast_math", "--ftz=true", "--prec-div=false", "-ffast-math"):
        assert "refused: only the candidate side" in refused({**minimal("python", "tvm-ffi"), "flags": [flag]})


def test_fast_math_on_both_compiled_sides_is_one_list_for_both() -> None:
    spec = parse_build(TOML, {**minimal("cuda", "cuda"), "flags": ["-O3", "--use_fast_math"]})
    assert spec.flags == ("-O3", "--use_fast_math")
    assert compiler.host_flags(spec.flags) == ["-O3"]


def test_flags_and_sources_need_a_compiled_side() -> None:
    assert "must be [] for kind = {baseline = \"triton\", candidate = \"python\"}" in refused(
        {"kind": {"baseline": "triton", "candidate": "python"}, "flags": ["-O3"]})
    assert "[build] sources — only for a compiled side" in refused({"kind": "cutedsl", "sources": ["k.cu"]})
    assert "[build] sources — needed for kind = \"cuda\"" in refused({"kind": {"baseline": "python", "candidate": "cuda"}})


def test_tvm_ffi_needs_exports_each_one_callable() -> None:
    assert "[build] exports — needed for kind = \"tvm-ffi\"" in refused({"kind": "tvm-ffi", "sources": ["k.cuh"]})
    assert "[build] exports — only for kind = \"tvm-ffi\"" in refused({**minimal("cuda", "cuda"), "exports": {"a": "b"}})
    for target in ("f); system(\"x\"", "f\n#include <x>", "Scale<{other}>::run", ""):
        assert "allowed: one C++ callable expression" in refused({**minimal("tvm-ffi", "tvm-ffi"), "exports": {"f": target}})
    assert "allowed: a C identifier" in refused({**minimal("tvm-ffi", "tvm-ffi"), "exports": {"bad name": "f"}})


def test_include_dirs_are_folders_relative_to_each_compiled_side() -> None:
    spec = parse_build(TOML, {**minimal("tvm-ffi", "tvm-ffi"), "include_dirs": ["upstream/include", "inc"]})
    assert spec.include_dirs == ("upstream/include", "inc")
    assert parse_build(TOML, minimal("cuda", "cuda")).include_dirs == ()
    for bad in ("/usr/include", "../baseline/upstream"):
        assert refused({**minimal("cuda", "cuda"), "include_dirs": [bad]}) == (
            f"tiny_rmsnorm/task.toml: [build] include_dirs {bad!r} — must be a folder relative to each side's folder, "
            'e.g. "upstream/include" (baseline/upstream/include on the baseline side)')
    assert "lists a folder twice" in refused({**minimal("cuda", "cuda"), "include_dirs": ["a", "a"]})
    assert "allowed: a list of non-empty strings" in refused({**minimal("cuda", "cuda"), "include_dirs": [""]})
    assert "[build] include_dirs — only for a compiled side" in refused({"kind": "triton", "include_dirs": ["a"]})
    assert "[build] include_dirs = 'a' — allowed: a list of non-empty strings" in refused(
        {**minimal("cuda", "cuda"), "include_dirs": "a"})


def test_an_include_dir_is_searched_on_each_side_that_has_it_and_must_exist_on_one(task: Path) -> None:
    set_build(task, 'kind = "tvm-ffi"\nflags = []\nsources = ["k.cuh"]\ninclude_dirs = ["upstream/include"]\n'
                    'exports = {f = "f"}')
    for side in ("baseline", "solution"):
        (task / side / "k.cuh").write_text("// kernel\n")
    spec = load_task(task)
    with pytest.raises(RuntimeError) as caught:
        compiler.include_paths(spec, "baseline")
    assert str(caught.value) == ("tiny_rmsnorm/task.toml: [build] include_dirs 'upstream/include' — no such folder in "
                                 "baseline/ or solution/")
    (task / "baseline" / "upstream" / "include").mkdir(parents=True)
    assert compiler.include_paths(spec, "baseline") == [str(task / "baseline"), str(task / "baseline" / "upstream" / "include")]
    assert compiler.include_paths(spec, "candidate") == [str(task / "solution")]  # the candidate lacks it: skipped


def test_the_generated_unit_registers_each_export_with_the_rows_template_arguments(task: Path) -> None:
    torch = pytest.importorskip("torch")
    set_build(task, 'kind = "tvm-ffi"\nflags = ["-O3"]\nsources = ["k.cuh"]\n'
                    'exports = {scale = "Scale<{args}>::run", plain = "plain"}')
    for side in ("baseline", "solution"):
        (task / side / "k.cuh").write_text("// kernel\n")
    spec = load_task(task)
    args = ", ".join(tvmffi.cpp_args((128, True, torch.bfloat16, "kFoo")))
    unit = tvmffi.generated_unit(spec, "candidate", args)
    assert f'#include "{(task / "solution" / "k.cuh").resolve()}"' in unit
    assert unit.index("#include <tvm/ffi/function.h>") < unit.index("k.cuh")  # what load_inline puts first
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, (Scale<128, true, bf16_t, kFoo>::run));" in unit
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(plain, (plain));" in unit
    without_args = tvmffi.generated_unit(spec, "baseline", None)
    assert "Scale<" not in without_args and "(plain, (plain))" in without_args
    with pytest.raises(TypeError, match="allowed bool, int, float, str or a torch dtype"):
        tvmffi.cpp_args(([1],))


def test_a_source_that_registers_its_own_export_is_refused(task: Path) -> None:
    set_build(task, 'kind = "tvm-ffi"\nflags = []\nsources = ["k.cuh"]\nexports = {scale = "Scale<{args}>::run"}')
    (task / "baseline" / "k.cuh").write_text("// kernel\n")
    (task / "solution" / "k.cuh").write_text("TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, (Scale<1>::run));\n")
    spec = load_task(task)
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, (Scale<2>::run));" in tvmffi.generated_unit(spec, "baseline", "2")
    with pytest.raises(RuntimeError) as caught:
        tvmffi.generated_unit(spec, "candidate", "2")
    assert str(caught.value).startswith(
        "tiny_rmsnorm/solution/k.cuh: registers its own TVM_FFI_DLL_EXPORT_TYPED_FUNC — refused: the builder writes "
        "one registration per [build] exports entry for both sides (rule sheet: the same registration style on both sides)")


# ------------------------------------------------------------------------------------------------ packages


def test_a_kind_whose_package_the_host_lacks_is_refused_naming_it(task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_build(task, 'kind = {baseline = "triton", candidate = "cutedsl"}')
    (task / "solution" / "kernel.py").write_text("")
    monkeypatch.setitem(buildrules.PACKAGES, "cutedsl", ("kp_not_installed_anywhere", "nvidia-cutlass-dsl"))
    monkeypatch.setattr(buildrules, "gpu_driver_here", lambda: True)  # a GPU host, where the side would run
    with pytest.raises(TaskSpecError) as caught:
        load_task(task)
    message = str(caught.value)
    assert message.startswith('tiny_rmsnorm/task.toml: [build] kind = {baseline = "triton", candidate = "cutedsl"} — '
                              "the candidate side needs the package nvidia-cutlass-dsl (import kp_not_installed_anywhere)")
    assert "pip install nvidia-cutlass-dsl" in message


def test_without_the_gpu_driver_only_the_packages_of_sides_that_run_there_are_needed(
        task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_build(task, 'kind = {baseline = "triton", candidate = "cutedsl"}')
    (task / "solution" / "kernel.py").write_text("")
    monkeypatch.setitem(buildrules.PACKAGES, "cutedsl", ("kp_not_installed_anywhere", "nvidia-cutlass-dsl"))
    monkeypatch.setattr(buildrules, "gpu_driver_here", lambda: False)
    assert load_task(task).build.kinds == ("triton", "cutedsl")  # its rows will be NOT CHECKED, not refused
    monkeypatch.setitem(buildrules.PACKAGES, "triton", ("kp_not_installed_anywhere", "triton"))
    with pytest.raises(TaskSpecError, match=r"the baseline side needs the package triton"):
        load_task(task)  # a triton side runs here (the interpreter): its package is needed


def test_package_versions_are_those_the_kinds_use() -> None:
    spec = parse_build(TOML, minimal("triton", "tvm-ffi"))
    versions = buildrules.package_versions(spec)
    assert set(versions) == {"triton", "apache-tvm-ffi"}
    assert versions["triton"]  # installed here
    assert buildrules.package_versions(parse_build(TOML, minimal("python", "python"))) == {}


# ------------------------------------------------------------------------------------------------ builders


def test_one_builder_per_kind() -> None:
    spec = parse_build(TOML, minimal("python", "cuda"))
    assert isinstance(builders.builder_for(spec, "baseline"), builders.ModuleBuilder)
    assert isinstance(builders.builder_for(spec, "candidate"), builders.CudaBuilder)
    assert {k: builders.BUILDERS[k].kind for k in KINDS} == {k: k for k in KINDS}
    assert buildrules.needed_files(spec, "baseline") == ["kernel.py"]
    assert buildrules.needed_files(spec, "candidate") == ["kernel.cu"]


def test_without_a_gpu_only_triton_and_python_sides_run() -> None:
    for baseline, candidate in itertools.product(KINDS, KINDS):
        if baseline != candidate and baseline not in FREE_BASELINE_KINDS:
            continue
        spec = parse_build(TOML, minimal(baseline, candidate))
        reasons = buildrules.not_checked_here(spec, "cpu")
        expected = {side for side, kind in (("baseline", baseline), ("candidate", candidate))
                    if kind not in ("triton", "python")}
        assert set(reasons) == expected, (baseline, candidate)
        assert buildrules.not_checked_here(spec, "cuda") == {}
        assert buildrules.needs_triton_interpreter(spec, "cpu") == ("triton" in (baseline, candidate))
        assert not buildrules.needs_triton_interpreter(spec, "cuda")


def test_a_triton_baseline_and_a_python_candidate_run_side_by_side_on_the_cpu(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    set_build(task, 'kind = {baseline = "triton", candidate = "python"}')
    (task / "solution" / "kernel.py").write_text(
        "import torch\n\n"
        "def rmsnorm(x, weight, out, eps):\n"
        "    out.copy_(x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps) * weight)\n")
    spec = load_task(task)
    record = build.build_sides(spec, tmp_path / "run", "cpu")
    assert record.ok and not record.compile_only and record.not_checked == {}
    assert record.kinds == {"baseline": "triton", "candidate": "python"}
    assert record.sides["candidate"].builder == "python import, one process"
    assert "triton JIT" in record.sides["baseline"].builder and record.packages == {"triton": record.packages["triton"]}
    for name in [n for n in list(sys.modules) if n.startswith(("kp_baseline", "kp_candidate"))]:
        monkeypatch.delitem(sys.modules, name)
    adapter = build.import_adapter(spec)
    adapter.bind(baseline=build.import_side(spec, "baseline"), candidate=build.import_side(spec, "candidate"))
    workload = spec.workloads[0].params
    case = adapter.make_case(workload, device="cpu", seed=0)
    adapter.call_baseline(workload, case.inputs, case.outputs_baseline)
    adapter.call_candidate(workload, case.inputs, case.outputs_candidate)
    torch.testing.assert_close(case.outputs_candidate["out"], case.outputs_baseline["out"], atol=1e-5, rtol=1e-5)


def test_a_cutedsl_side_on_the_cpu_is_not_checked_and_never_imported(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_build(task, 'kind = {baseline = "triton", candidate = "cutedsl"}')
    (task / "solution" / "kernel.py").write_text("raise SystemExit('imported on a machine without a GPU')\n")
    monkeypatch.setitem(buildrules.PACKAGES, "cutedsl", ("json", "nvidia-cutlass-dsl"))  # present: not refused
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    record = build.build_sides(load_task(task), tmp_path / "run", "cpu")
    assert record.ok and record.compile_only
    assert record.not_checked == {"candidate": "candidate side (cutedsl) cannot run without a GPU"}
    assert NOT_CHECKED in record.sides["candidate"].builder
    assert record.packages == {"nvidia-cutlass-dsl": buildrules.distribution_version("nvidia-cutlass-dsl"),
                               "triton": record.packages["triton"]}


TVM_KERNEL = """\
#include <tvm/ffi/tvm_ffi.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cuda_runtime.h>

template <int kScale>
__global__ void scale_kernel(const float* x, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * kScale;
}

template <int kScale>
struct Scale {
  // outputs last, launched on the caller's stream
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
    int64_t n = x.numel();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(x.device().device_type, x.device().device_id));
    scale_kernel<kScale><<<(n + 255) / 256, 256, 0, stream>>>(
        static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), n);
  }
};
"""


def tvm_ffi_task(task: Path, candidate_source: str) -> None:
    set_build(task, 'kind = "tvm-ffi"\nflags = ["-O3"]\nsources = ["scale.cuh"]\nexports = {scale = "Scale<{args}>::run"}')
    (task / "baseline" / "scale.cuh").write_text(TVM_KERNEL)
    (task / "solution" / "scale.cuh").write_text(candidate_source)


needs_nvcc = pytest.mark.skipif(compiler.find_nvcc() is None, reason="the compile-only check needs nvcc here")


def test_a_tvm_ffi_task_of_several_arches_is_built_for_each(task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_arch_list(monkeypatch)
    text = (task / "task.toml").read_text()
    (task / "task.toml").write_text(text.replace('arch = "any"', 'arch = ["h200", "h100", "b200"]'))
    tvmffi._arch_list_for(load_task(task))
    assert os.environ["TVM_FFI_CUDA_ARCH_LIST"] == "9.0 10.0"


@needs_nvcc
def test_tvm_ffi_sides_are_compiled_without_a_gpu_and_their_rows_not_checked(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tvm_ffi")
    _no_arch_list(monkeypatch)
    tvm_ffi_task(task, TVM_KERNEL)
    text = (task / "task.toml").read_text()
    (task / "task.toml").write_text(text.replace('arch = "any"', 'arch = "h200"'))
    record = build.build_sides(load_task(task), tmp_path / "run", "cpu")
    assert record.ok, {s: r.error for s, r in record.sides.items()}
    assert record.compile_only and set(record.not_checked) == {"baseline", "candidate"}
    assert record.exports == [["scale", "Scale<{args}>::run"]] and record.packages["apache-tvm-ffi"]
    assert record.env.get("TVM_FFI_CUDA_ARCH_LIST") == "9.0"  # from the task's arch, for both sides alike
    for side in ("baseline", "candidate"):
        log = (tmp_path / "run" / record.sides[side].log).read_text()
        assert "-O3" in log and "generated.cu" in log and "-gencode=arch=compute_90,code=sm_90" in log


@needs_nvcc
def test_a_tvm_ffi_side_that_does_not_compile_fails_the_build(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tvm_ffi")
    _no_arch_list(monkeypatch)
    tvm_ffi_task(task, TVM_KERNEL.replace("int64_t n = x.numel();", "int64_t n = x.no_such_member();"))
    record = build.build_sides(load_task(task), tmp_path / "run", "cpu")
    assert record.sides["baseline"].ok
    assert not record.sides["candidate"].ok and not record.ok
    assert record.sides["candidate"].error.startswith("RuntimeError: nvcc failed on the generated tvm-ffi unit")


@needs_nvcc
def test_an_include_dir_of_one_side_reaches_its_compile_check(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tvm_ffi")
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "9.0")
    set_build(task, 'kind = "tvm-ffi"\nflags = ["-O3"]\nsources = ["scale.cuh"]\ninclude_dirs = ["upstream/include"]\n'
                    'exports = {scale = "Scale<{args}>::run"}')
    header = task / "baseline" / "upstream" / "include" / "up" / "kernel.cuh"
    header.parent.mkdir(parents=True)
    header.write_text(TVM_KERNEL)
    (task / "baseline" / "scale.cuh").write_text("#include <up/kernel.cuh>\n")  # found through include_dirs only
    (task / "solution" / "scale.cuh").write_text(TVM_KERNEL)
    record = build.build_sides(load_task(task), tmp_path / "run", "cpu")
    assert record.ok, {s: r.error for s, r in record.sides.items()}
    log = (tmp_path / "run" / record.sides["baseline"].log).read_text()
    assert f"-I{task / 'baseline' / 'upstream' / 'include'}" in log
    assert "upstream" not in (tmp_path / "run" / record.sides["candidate"].log).read_text()
    shutil.rmtree(task / "baseline" / "upstream")  # e.g. upstream files not materialized: the build says so
    record = build.build_sides(load_task(task), tmp_path / "run2", "cpu")
    assert not record.ok and not record.sides["baseline"].ok
    assert record.sides["baseline"].error == ("RuntimeError: tiny_rmsnorm/task.toml: [build] include_dirs "
                                              "'upstream/include' — no such folder in baseline/ or solution/")


def test_a_tvm_ffi_check_without_the_package_is_skipped_with_a_note(
        task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tvm_ffi_task(task, TVM_KERNEL)
    spec = load_task(task)
    monkeypatch.setattr(tvmffi, "find_nvcc", lambda: "/usr/bin/true")
    real_find_spec = tvmffi.importlib.util.find_spec
    monkeypatch.setattr(tvmffi.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tvm_ffi" else real_find_spec(name, *a))
    built = builders.BUILDERS["tvm-ffi"].check(spec, "baseline", tmp_path / "b")
    assert built.error is None
    assert built.note == "compile-only check skipped: apache-tvm-ffi (its headers) is not installed here"


def test_a_side_may_not_build_tvm_ffi_itself(task: Path) -> None:
    (task / "solution" / "kernel.py").write_text("from tvm_ffi import cpp\n")
    with pytest.raises(TaskSpecError, match=r"solution/kernel.py:1: builds or loads its own binary \(from tvm_ffi import cpp\)"):
        load_task(task)


def _no_arch_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """TVM_FFI_CUDA_ARCH_LIST unset for this test, and unset again after it even where the builder set it: a bare
    delenv of an unset variable records nothing to undo, and "9.0 10.0" leaked into every later test's processes
    (a tvm-ffi check of an h200 task then compiled for sm_100 and failed its arch assertion)."""
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "")
    monkeypatch.delenv("TVM_FFI_CUDA_ARCH_LIST")


def test_a_tvm_ffi_row_is_built_in_the_sandboxed_process_scratch_folder(tmp_path: Path, monkeypatch) -> None:
    """A side's timing process may write only its scratch folder: a row's template arguments are built there (its
    build folder, where they went before, is read-only under the sandbox), and in the build folder only outside it."""
    side = tvmffi.TvmFfiSide(None, "baseline", tmp_path / "build")
    monkeypatch.delenv(tvmffi.SCRATCH_ENV, raising=False)
    assert side.row_folder("kp_baseline_1") == tmp_path / "build" / "kp_baseline_1"
    monkeypatch.setenv(tvmffi.SCRATCH_ENV, str(tmp_path / "scratch"))
    assert side.row_folder("kp_baseline_1") == tmp_path / "scratch" / "tvm-ffi" / "kp_baseline_1"
