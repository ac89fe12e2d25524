"""The shipped tasks' contexts (their bench/context.py, harness 2.18) on the CPU: every row that names one names one
the file defines; each context's state, before() and after() run on a small copy of each such row with the task's own
make_case (the production shapes are a GPU's: 12288-wide projections, 648720-row norms): before() writes what the row
reads and nothing else, after() reads the row's results, the state follows from its seed and stays as built but for
after()'s results. Then the real judge on small copies of the rows: `inv check` where both sides run on the CPU
(group_norm_silu, rotary_embedding; fuse_scale_shift's qwen_s19 row is timed in its context by test_inv_check.py),
and the runner with both sides a torch stand-in (the adapter's reference) where they need a GPU."""

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
                "zimage_attention_norm_scale": {"shape": [1, 5, 64]},
                "zimage_attention_residual": {"shape": [1, 5, 64]},
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
    named = {w.id: w.context for w in rows if w.context}
    assert named == {"hunyuanvideo_t27030_h24_d128": "hunyuan_qkv_pack_reference"}


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


# The tasks whose sides need a GPU (a tvm-ffi JIT, a bf16 Triton kernel the interpreter refuses): their contexts go
# through the real judge on the CPU with both sides a stand-in, the adapter's own float64 reference in torch (the
# side finds the adapter it runs under in sys.modules). What this checks is the context against the task's adapter
# and the judge (its writes, its after(), the in-place q and k), not the kernels.
STAND_IN_SIDES = {
    "h200_diffusion_qknorm_rope__multi_shape": (["flux_img_t4096_h24_d128", "flux_txt_t512_h24_d128",
                                                 "ernie_img_t4096_h32_d128_neox_round_full"], '''
"""Stand-in side: the adapter's float64 QK norm + RoPE, in place on q and k."""
import sys


class _Kernel:
    def __init__(self, head_dim, rope_dim, is_neox, use_pdl, dtype, cache_dtype, round_norm, full_width, half_warp):
        self.flags = {"rope_dim": rope_dim, "is_neox": is_neox, "round_norm_before_rope": round_norm,
                      "cache_has_full_width": full_width}

    def qknorm_rope(self, q, k, q_weight, k_weight, cache, positions, eps):
        adapter, workload = sys.modules["kp_adapter"], {**self.flags, "eps": eps}
        inputs = {"cos_sin_cache": cache, "positions": positions}
        q.copy_(adapter._qknorm_rope(workload, q, q_weight, inputs))
        k.copy_(adapter._qknorm_rope(workload, k, k_weight, inputs))


def load(*template_args):
    return _Kernel(*template_args)
'''),
    "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape": (["zimage_1024_main_tanh_residual",
                                                               "zimage_1024_main_scale"], '''
"""Stand-in side: the adapter's bf16-native reference, into out."""
import sys


def rmsnorm_tanh_residual(x, gate, residual, weight, eps, out):
    inputs = {"x": x, "gate": gate, "residual": residual, "weight": weight}
    out.copy_(sys.modules["kp_adapter"].reference({"function": "tanh_residual", "eps": eps}, inputs)["out"])


def rmsnorm_scale(x, weight, scale, eps, out):
    inputs = {"x": x, "weight": weight, "scale": scale}
    out.copy_(sys.modules["kp_adapter"].reference({"function": "scale", "eps": eps}, inputs)["out"])
'''),
    "h200_diffusion_cutedsl_norm_scale_shift__multi_shape": (["qwen_s19_c3072", "wan_s37800_c5120_fp32mod"], '''
"""Stand-in side: the adapter's float64 norm + modulation, into out."""
import sys


def fused_norm_scale_shift(x, weight, bias, scale, shift, norm_type, eps, out):
    inputs = {"x": x, "scale": scale, "shift": shift}
    inputs.update({name: t for name, t in (("weight", weight), ("bias", bias)) if t is not None})
    workload = {"norm_type": norm_type, "eps": eps}
    out.copy_(sys.modules["kp_adapter"].reference(workload, inputs)["out"])
'''),
    "h200_diffusion_norm_infer__multi_shape": (["helios_layernorm_m8640_c5120_fp32",
                                                "hunyuanvideo_rmsnorm_m648720_c128_bf16"], '''
"""Stand-in side (both: a Triton baseline and a CUDA candidate in the task): the adapter's float64 norm, into out."""
import sys


def norm_infer(x, weight, bias, eps, is_rms_norm, out):
    inputs = {"x": x, **{name: t for name, t in (("weight", weight), ("bias", bias)) if t is not None}}
    workload = {"norm": "rms" if is_rms_norm else "layer", "eps": eps}
    out.copy_(sys.modules["kp_adapter"].reference(workload, inputs)["out"])
'''),
}


def stand_in_copy(task: str, root: Path) -> Path:
    """small_smoke_copy with both sides the stand-in: a Python module `kernel` (build kind triton, no flags)."""
    rows, source = STAND_IN_SIDES[task]
    copy = small_smoke_copy(task, rows, root)
    for side in ("baseline", "solution"):
        shutil.rmtree(copy / side)
        (copy / side).mkdir()
        (copy / side / "kernel.py").write_text(source.lstrip())
    toml = copy / "task.toml"
    text = without_section(without_section(toml.read_text(), "[baseline.sha256]"), "[build]")
    text += '\n[build]\nkind = "triton"\nflags = []\nentry = "kernel"\n'
    toml.write_text("\n".join(line for line in text.splitlines() if not line.startswith("gpu_only")) + "\n")
    return copy


def without_section(text: str, header: str) -> str:
    """task.toml's text without one [section] (its header to the next one): the stand-in's build replaces the task's,
    and it pins no upstream file."""
    lines, kept, inside = text.splitlines(), [], False
    for line in lines:
        if line.startswith("["):
            inside = line.split("#")[0].strip() == header
        if not inside:
            kept.append(line)
    return "\n".join(kept) + "\n"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("task", sorted(STAND_IN_SIDES))
def test_the_gpu_tasks_contexts_pass_the_real_judge_with_stand_in_sides(task: str, tmp_path: Path) -> None:
    from agent.test_runner import results_of, run_agent

    copy = stand_in_copy(task, tmp_path)
    contexts = {w.id: w.context for w in rows_with_contexts(task)}
    done = run_agent(copy, tmp_path / "run")
    rows = {row["workload"]: row for row in results_of(tmp_path / "run")["rows"]}
    assert set(rows) == set(STAND_IN_SIDES[task][0]), done.stdout[-3000:] + done.stderr[-3000:]
    for row_id, row in rows.items():
        assert row["status"] == "PASSED", (row_id, row.get("message"), done.stderr[-2000:])
        assert row["regimes"]["name"] == contexts[row_id], row_id
        for regime in ("warm", "context"):
            assert all(n >= 1 for n in row["regimes"][regime]["checks"]["checked_samples"].values()), (row_id, regime)
