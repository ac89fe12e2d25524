"""The shipped tasks' contexts (their bench/context.py, harness 2.18) on the CPU: every row that names one names one
the file defines, and each context's state, before() and after() run on a small copy of each such row with the
task's own make_case (the production shapes are a GPU's: 12288-wide projections, 648720-row norms). Of the tasks with
contexts only fuse_scale_shift's sides run on a CPU (its qwen_s19 MulAdd row is timed in its context by `inv check`:
test_inv_check.py); the others' sides need a GPU, so this is what is checked of their contexts here."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

from kpremote.agent.contract import Context
from kpremote.agent.task.taskspec import load_workloads
from rig import run_inv

REPO = Path(__file__).resolve().parents[2]
# a small copy of each context's rows: the row keys that set its size, what its ops need to hold (a head count, a
# multiple of 24 rows, channels that split into the row's groups, ...)
SMALL_PARAMS = {"qwen_ffn_residual": {"shape": [1, 5, 64]}, "qwen_residual_qkv": {"shape": [1, 5, 64]},
                "helios_cross_attention_norm": {"shape": [16, 64]}, "hunyuan_q_norm": {"shape": [48, 128]},
                "hunyuan_vae_resnet_norm1": {"shape": [1, 64, 3, 4, 5]},
                "hunyuan_vae_up_resnet_norm1": {"shape": [1, 64, 3, 4, 5]},
                "zimage_attention_norm_scale": {"shape": [1, 5, 64]}, "zimage_attention_residual": {"shape": [1, 5, 64]},
                "hunyuan_qkv_pack_reference": {"tokens": 6, "heads": 3, "head_dim": 16},
                "wan_patch_embed_qkv": {"shape": [1, 5, 64]},
                **{name: {"tokens": 6, "q_heads": 2, "k_heads": 2, "head_dim": 16, "rope_dim": 16}
                   for name in ("flux_image_join", "flux_text_join", "ernie_attention")}}
TASKS_WITH_CONTEXTS = sorted(p.parents[1].name for p in (REPO / "kernels").glob("*/bench/context.py"))


def module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def rows_with_contexts(task: str) -> list:
    return [w for w in load_workloads(REPO / "kernels" / task / "bench" / "workloads.toml") if w.context]


def small_rows(task: str) -> list[tuple[str, dict, Context, object]]:
    """Each row of the task that names a context: its id, its small params, its Context, the task's adapter."""
    folder = REPO / "kernels" / task
    adapter = module(folder / "bench" / "adapter.py", f"adapter_{task}")
    contexts = module(folder / "bench" / "context.py", f"context_{task}").CONTEXTS
    rows = rows_with_contexts(task)
    assert rows, task
    return [(row.id, {**row.params, **SMALL_PARAMS[row.context]}, contexts[row.context], adapter) for row in rows]


def results_of(case) -> dict[str, torch.Tensor]:
    """What after() reads: the call's outputs and the inputs it rewrites in place, filled with random values."""
    named = {**case.outputs_baseline, **{name: case.inputs[name] for name in case.mutates}}
    return {name: torch.randn(value.shape).to(value.dtype) for name, value in named.items()}


def test_the_shipped_tasks_have_contexts() -> None:
    assert {"h200_diffusion_fuse_scale_shift__multi_shape", "h200_diffusion_cutedsl_norm_scale_shift__multi_shape",
            "h200_diffusion_norm_infer__multi_shape", "h200_diffusion_group_norm_silu__multi_shape",
            "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape",
            "h200_diffusion_rotary_embedding__multi_shape", "h200_diffusion_qknorm_rope__multi_shape"} <= set(
        TASKS_WITH_CONTEXTS)
    for task in TASKS_WITH_CONTEXTS:
        assert all(w.production for w in rows_with_contexts(task)), task  # the production rows' contexts


def test_every_production_row_of_norm_tanh_names_the_context_of_its_function() -> None:
    rows = load_workloads(REPO / "kernels" / "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape" / "bench" /
                          "workloads.toml")
    named = {w.params["function"]: set() for w in rows if w.production}
    for w in rows:
        if w.production:
            named[w.params["function"]].add(w.context)
    assert named == {"scale": {"zimage_attention_norm_scale"}, "tanh_residual": {"zimage_attention_residual"}}


def test_only_rotary_embeddings_hunyuanvideo_row_has_a_context() -> None:
    """On a CUDA host Qwen-Image and Wan rotate q and k with FlashInfer: their rows follow no call the model makes
    there, and get no context (docs/model-context.md)."""
    rows = load_workloads(REPO / "kernels" / "h200_diffusion_rotary_embedding__multi_shape" / "bench" /
                          "workloads.toml")
    assert {w.id: w.context for w in rows if w.context} == {"hunyuanvideo_t27030_h24_d128": "hunyuan_qkv_pack_reference"}


def test_every_production_row_of_group_norm_silu_names_its_context() -> None:
    rows = load_workloads(REPO / "kernels" / "h200_diffusion_group_norm_silu__multi_shape" / "bench" /
                          "workloads.toml")
    named = {w.id: w.context for w in rows if w.production}
    assert set(named.values()) == {"hunyuan_vae_resnet_norm1", "hunyuan_vae_up_resnet_norm1"}, named
    # the first resnet of up blocks 2 and 3 halves the channels: its conv1 writes C / 2 (the rows' notes place them)
    assert {i for i, c in named.items() if c == "hunyuan_vae_up_resnet_norm1"} == {
        "hunyuanvideo_vae_c512_t9_h128_bf16", "hunyuanvideo_vae_c256_t17_h256_bf16"}


@pytest.mark.parametrize("task", TASKS_WITH_CONTEXTS)
def test_each_context_runs_its_ops_on_a_small_copy_of_its_rows(task: str) -> None:
    for row_id, params, context, adapter in small_rows(task):
        assert isinstance(context, Context) and context.writes and context.results, row_id
        case = adapter.make_case(params, device="cpu", seed=1)
        pristine = {name: value.clone() for name, value in case.inputs.items() if torch.is_tensor(value)}
        state = context.state(params, case.inputs, device="cpu", seed=2)
        context.before(params, state, case.inputs)
        for name, value in pristine.items():  # before() writes its writes, and only them, with finite values
            written = case.inputs[name]
            assert (written.shape, written.dtype) == (value.shape, value.dtype)
            assert torch.equal(written, value) == (name not in context.writes), (row_id, name)
        for name in context.writes:
            assert torch.isfinite(case.inputs[name].float()).all(), (row_id, name)
        for name in context.results:
            state[name].fill_(float("nan"))
        context.after(params, state, results_of(case))
        for name in context.results:  # after() writes every one of its results
            assert torch.isfinite(state[name].float()).all(), (row_id, name)


@pytest.mark.parametrize("task", TASKS_WITH_CONTEXTS)
def test_each_contexts_after_reads_the_rows_results(task: str) -> None:
    """after() on other results writes other values: it consumes what the kernel wrote (every output and mutated
    input), so a side that left them unwritten would show in what after() makes."""
    for row_id, params, context, adapter in small_rows(task):
        case = adapter.make_case(params, device="cpu", seed=1)
        state = context.state(params, case.inputs, device="cpu", seed=2)
        torch.manual_seed(3)
        results = results_of(case)
        context.after(params, state, results)
        first = {name: state[name].clone() for name in context.results}
        for name in results:  # one result changed at a time: after() reads each
            changed = {**results, name: torch.randn(results[name].shape).to(results[name].dtype)}
            context.after(params, state, changed)
            assert any(not torch.equal(first[n], state[n]) for n in context.results), (row_id, name)


@pytest.mark.parametrize("task", TASKS_WITH_CONTEXTS)
def test_each_contexts_state_and_writes_follow_from_its_seed(task: str) -> None:
    """The judge hands each side a copy of the state it built from a secret seed and recomputes what before()
    writes: the same seed makes the same state and the same writes, another seed other ones."""
    for row_id, params, context, adapter in small_rows(task):
        def built(seed: int) -> tuple[dict, dict]:
            case = adapter.make_case(params, device="cpu", seed=1)
            state = context.state(params, case.inputs, device="cpu", seed=seed)
            kept = {n: v.clone() for n, v in state.items() if torch.is_tensor(v) and n not in context.results}
            context.before(params, state, case.inputs)
            return kept, {name: case.inputs[name] for name in context.writes}

        (state_a, written_a), (state_b, written_b), (state_c, written_c) = built(5), built(5), built(6)
        assert state_a.keys() == state_b.keys() and all(torch.equal(state_a[n], state_b[n]) for n in state_a), row_id
        assert all(torch.equal(written_a[n], written_b[n]) for n in written_a), row_id
        assert not all(torch.equal(written_a[n], written_c[n]) for n in written_a), row_id


@pytest.mark.parametrize("task", TASKS_WITH_CONTEXTS)
def test_each_context_writes_no_state_but_its_results(task: str) -> None:
    """The judge holds every state tensor but after()'s results to its built bits after the context regimes
    (regimes.check_inputs_after): a context that keeps an intermediate in its state fails every GPU run."""
    for row_id, params, context, adapter in small_rows(task):
        case = adapter.make_case(params, device="cpu", seed=1)
        state = context.state(params, case.inputs, device="cpu", seed=2)
        built = {n: v.clone() for n, v in state.items() if torch.is_tensor(v) and n not in context.results}
        context.before(params, state, case.inputs)
        context.after(params, state, results_of(case))
        changed = [n for n, v in built.items() if not torch.equal(v, state[n])]
        assert not changed, (row_id, changed)


# the tasks whose sides both run on the CPU (Triton's interpreter), with a context row of each context they define
CPU_SMOKE = {"h200_diffusion_group_norm_silu__multi_shape": ["hunyuanvideo_vae_c512_t5_h32_bf16",
                                                             "hunyuanvideo_vae_c512_t9_h128_bf16"],
             "h200_diffusion_rotary_embedding__multi_shape": ["hunyuanvideo_t27030_h24_d128"]}


def small_smoke_copy(task: str, rows: list[str], root: Path) -> Path:
    """A copy of the task (without results/ and baseline/upstream/) whose workloads.toml holds only `rows`, each
    shrunk to its context's small shape and marked smoke."""
    copy = root / "kernels" / task
    shutil.copytree(REPO / "kernels" / task, copy, ignore=shutil.ignore_patterns("results", "upstream"))
    document = tomllib.loads((copy / "bench" / "workloads.toml").read_text())
    lines = []
    for row in document["workload"]:
        if row["id"] in rows:
            small = {**row, **SMALL_PARAMS[row["context"]], "smoke": True}
            lines += ["[[workload]]", *(f"{key} = {json.dumps(value)}" for key, value in small.items()), ""]
    defaults = [f"{key} = {json.dumps(value)}" for key, value in document.get("defaults", {}).items()]
    (copy / "bench" / "workloads.toml").write_text("\n".join(["[defaults]", *defaults, "", *lines]))
    return copy


@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", sorted(CPU_SMOKE))
def test_the_context_rows_pass_a_cpu_smoke_run_in_every_regime(task: str, tmp_path: Path) -> None:
    """The real judge and sides (`inv check`) on a small copy of the task's context rows: each PASSED, timed cold,
    warm and in its context, every regime's checked samples taken (the context's writes, its after() and the
    kernel's results in it checked against the judge's)."""
    copy = small_smoke_copy(task, CPU_SMOKE[task], tmp_path)
    result = run_inv("check", "--task", task, cwd=tmp_path, timeout=900)
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    [summary] = (copy / "results" / "check").glob("*/summary/results.json")
    rows = {row["workload"]: row for row in json.loads(summary.read_text())["rows"]}
    assert set(rows) == set(CPU_SMOKE[task]), output
    for row_id, row in rows.items():
        assert row["status"] == "PASSED", (row_id, row.get("message"))
        for regime in ("warm", "context"):
            assert all(n >= 1 for n in row["regimes"][regime]["checks"]["checked_samples"].values()), (row_id, regime)
