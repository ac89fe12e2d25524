"""The shipped tasks' contexts (their bench/context.py, harness 2.18) on the CPU: every row that names one names one
the file defines, and each context's state, before() and after() run on a small copy of each such row with the
task's own make_case (the production shapes are a GPU's: 12288-wide projections, 648720-row norms). Of the tasks with
contexts only fuse_scale_shift's sides run on a CPU (its qwen_s19 MulAdd row is timed in its context by `inv check`:
test_inv_check.py); the others' sides need a GPU, so this is what is checked of their contexts here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kpremote.agent.contract import Context
from kpremote.agent.task.taskspec import load_workloads

REPO = Path(__file__).resolve().parents[2]
# a small shape of each context's rows: what its ops need to hold (a head count, a multiple of 24 rows, ...)
SMALL_SHAPES = {"qwen_ffn_residual": [1, 5, 64], "qwen_residual_qkv": [1, 5, 64],
                "helios_cross_attention_norm": [16, 64], "hunyuan_q_norm": [48, 128]}
TASKS_WITH_CONTEXTS = sorted(p.parents[1].name for p in (REPO / "kernels").glob("*/bench/context.py"))


def module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def rows_with_contexts(task: str) -> list:
    return [w for w in load_workloads(REPO / "kernels" / task / "bench" / "workloads.toml") if w.context]


def test_the_norm_tasks_and_fuse_scale_shift_have_contexts() -> None:
    assert {"h200_diffusion_fuse_scale_shift__multi_shape", "h200_diffusion_cutedsl_norm_scale_shift__multi_shape",
            "h200_diffusion_norm_infer__multi_shape"} <= set(TASKS_WITH_CONTEXTS)
    for task in TASKS_WITH_CONTEXTS:
        assert all(w.production for w in rows_with_contexts(task)), task  # the production rows' contexts


@pytest.mark.parametrize("task", TASKS_WITH_CONTEXTS)
def test_each_context_runs_its_ops_on_a_small_copy_of_its_rows(task: str) -> None:
    folder = REPO / "kernels" / task
    adapter = module(folder / "bench" / "adapter.py", f"adapter_{task}")
    contexts = module(folder / "bench" / "context.py", f"context_{task}").CONTEXTS
    rows = rows_with_contexts(task)
    assert rows, task
    for row in rows:
        context = contexts[row.context]
        assert isinstance(context, Context) and context.writes == ("x",)
        params = {**row.params, "shape": SMALL_SHAPES[row.context]}
        case = adapter.make_case(params, device="cpu", seed=1)
        pristine = {name: value.clone() for name, value in case.inputs.items() if torch.is_tensor(value)}
        state = context.state(params, case.inputs, device="cpu", seed=2)
        context.before(params, state, case.inputs)
        for name, value in pristine.items():  # before() writes x, and only x, with finite values of x's layout
            written = case.inputs[name]
            assert (written.shape, written.dtype) == (value.shape, value.dtype)
            assert torch.equal(written, value) == (name not in context.writes), (row.id, name)
        assert torch.isfinite(case.inputs["x"].float()).all(), row.id
        outputs = {"out": torch.randn(case.inputs["x"].shape).to(case.inputs["x"].dtype)}
        for name in context.results:
            state[name].fill_(float("nan"))
        context.after(params, state, outputs)
        for name in context.results:  # after() writes every one of its results
            assert torch.isfinite(state[name].float()).all(), (row.id, name)
