"""The kernel tasks shipped in kernels/: well formed and correct on the CPU interpreter.

The interpreter check runs the smallest rows of each Triton task in a subprocess (TRITON_INTERPRET
must be set before the sides are imported). A CUDA side's sources are compiled by `inv check`'s own
compile-only check, with the task's flags and torch's (tests/kernels/test_inv_check.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from kpremote.agent.task.taskspec import TaskSpec, load_task

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
TASKS = sorted(p.name for p in KERNELS.iterdir() if (p / "task.toml").is_file())
SMOKE_ROWS = 3  # smallest rows per Triton task checked on the interpreter
# Sides that refuse Triton's interpreter, in one line, instead of running there: SGLang's Z-Image kernels compute in
# bf16, which the interpreter computes on raw 16-bit integers (the task's baseline/kernel.py says why).
REFUSES_THE_INTERPRETER = {"h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape": "baseline"}


def _spec(name: str) -> TaskSpec:
    return load_task(KERNELS / name)


def _adapter(spec: TaskSpec) -> ModuleType:
    module_spec = importlib.util.spec_from_file_location(f"adapter_{spec.root.name}", spec.adapter_path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _elements(params: dict) -> int:
    if "shape" in params:
        return math.prod(params["shape"])
    q_heads = params["q_heads"] if "q_heads" in params else params["heads"]  # qknorm_rope names q's heads q_heads
    return params["tokens"] * (q_heads + params.get("k_heads", q_heads)) * params["head_dim"]


def _smallest(spec: TaskSpec, count: int) -> list[str]:
    return [w.id for w in sorted(spec.workloads, key=lambda w: _elements(w.params))[:count]]


def test_the_three_h200_families_are_shipped() -> None:
    assert set(TASKS) >= {
        "h200_diffusion_fuse_scale_shift__multi_shape",
        "h200_diffusion_norm_infer__multi_shape",
        "h200_diffusion_rotary_embedding__multi_shape",
    }


def test_one_folder_serves_the_h200_and_the_b200_with_no_copy() -> None:
    assert _spec("h200_diffusion_fuse_scale_shift__multi_shape").task.arches == ("h200", "b200")
    assert not [name for name in TASKS if name.startswith("b200_")]  # the former copy is gone


@pytest.mark.parametrize("name", TASKS)
def test_task_passes_the_agents_validation_and_has_its_docs(name: str) -> None:
    spec = _spec(name)  # task.toml, workloads.toml and the adapter's contract, as the agent checks them
    assert any(w.production for w in spec.workloads) and any(not w.production for w in spec.workloads)
    for doc in ("baseline_source.md", "benchmark_method.md", "results.md"):
        assert (spec.root / "docs" / doc).is_file(), doc
    if spec.build.kind == "cuda":
        for side in ("baseline", "solution"):
            for source in spec.build.sources:
                assert (spec.root / side / source).is_file(), f"{side}/{source}"


@pytest.mark.parametrize("name", TASKS)
def test_make_case_gives_each_side_its_own_outputs_and_a_matching_reference(name: str) -> None:
    """Each side gets its own output tensors, and the reference names exactly what is judged: the outputs and, for
    an in-place kernel, the inputs the call rewrites (the row's `mutates` plus Case.mutates, judged like outputs)."""
    torch = pytest.importorskip("torch")
    spec = _spec(name)
    adapter = _adapter(spec)
    row = next(w for w in spec.workloads if w.id == _smallest(spec, 1)[0])
    workload = row.params
    case = adapter.make_case(workload, device="cpu", seed=0)
    reference = adapter.reference(workload, case.inputs)
    mutated = set(row.mutates) | set(getattr(case, "mutates", ()))
    assert case.outputs_baseline.keys() == case.outputs_candidate.keys()
    assert reference.keys() == case.outputs_baseline.keys() | mutated
    assert not mutated & case.outputs_baseline.keys()
    for key in mutated:  # an in-place input: a tensor the reference gives the expected values of, same shape/dtype
        assert isinstance(case.inputs.get(key), torch.Tensor), key
        assert reference[key].shape == case.inputs[key].shape, key
    if "qknorm_rope" in name:  # SGLang's fused_inplace_qknorm_rope: mutates_args=["q", "k"], no output tensor
        assert mutated == {"q", "k"} and not case.outputs_baseline
    for key, out in case.outputs_baseline.items():
        other = case.outputs_candidate[key]
        assert out.shape == other.shape == reference[key].shape and out.dtype == other.dtype
        assert out.data_ptr() != other.data_ptr()
        assert all(out.data_ptr() != t.data_ptr() for t in case.inputs.values() if isinstance(t, torch.Tensor))
    assert case.bytes_moved == adapter.bytes_moved(workload) > 0
    # a fresh seed draws fresh inputs
    again = adapter.make_case(workload, device="cpu", seed=1)
    first = next(iter(case.inputs))
    assert not torch.equal(case.inputs[first], again.inputs[first])


_INTERPRETER_CHECK = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from kpremote.agent.task import build
    from kpremote.agent.task.taskspec import load_task

    task = load_task(__import__("pathlib").Path(sys.argv[2]))
    adapter = build.import_adapter(task)  # as the agent loads them: a side may import its own helpers (._sglang)
    adapter.bind(baseline=build.import_side(task, "baseline"), candidate=build.import_side(task, "candidate"))
    failures = []
    for w in task.workloads:
        if w.id not in sys.argv[3].split(","):
            continue
        case = adapter.make_case(w.params, device="cpu", seed=0)
        expected = adapter.reference(w.params, case.inputs)
        for side, call, outs in (("baseline", adapter.call_baseline, case.outputs_baseline),
                                 ("candidate", adapter.call_candidate, case.outputs_candidate)):
            for t in outs.values():
                t.fill_(float("nan"))
            if side == sys.argv[4]:  # this side must refuse the interpreter, in one line, and write nothing
                try:
                    call(w.params, case.inputs, outs)
                    failures.append(f"{w.id} {side}: ran under the interpreter instead of refusing it")
                except RuntimeError as exc:
                    if "cannot run under Triton's interpreter" not in str(exc):
                        failures.append(f"{w.id} {side}: {exc}")
                continue
            call(w.params, case.inputs, outs)
            for key, out in outs.items():
                got, want = out.double(), expected[key].double()
                if not (torch.isfinite(got).all() and torch.isclose(got, want, atol=case.atol, rtol=case.rtol).all()):
                    failures.append(f"{w.id} {side} {key}: max error {(got - want).abs().max().item():.3g}")
    print(json.dumps(failures))
    """
)


@pytest.mark.parametrize("name", [t for t in TASKS if t.startswith("h200_") and _spec(t).build.kind == "triton"])
def test_triton_sides_match_the_reference_on_the_interpreter(name: str, tmp_path: Path) -> None:
    """On a copy of the task whose baseline/upstream/ (SGLang's kernels, never committed) is materialized from the
    pinned wheel as `inv baseline --materialize` does, every file's sha256 checked against task.toml. A side in
    REFUSES_THE_INTERPRETER must raise its one-line refusal there instead (and is checked on a GPU only)."""
    pytest.importorskip("triton")
    from kpremote.task.baseline import materialize

    spec = _spec(name)
    rows = _smallest(spec, SMOKE_ROWS)
    task = tmp_path / "kernels" / name
    shutil.copytree(spec.root, task, ignore=shutil.ignore_patterns("results", "upstream"))
    assert materialize(task).files > 0
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETER_CHECK, str(ROOT), str(task), ",".join(rows),
         REFUSES_THE_INTERPRETER.get(name, "")],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
