"""One Qwen-Image block from the pinned SGLang wheel, timed with fuse_scale_shift's candidate mounted at its call site.

Issue 45 item 4 (docs/model-context.md, "Item 4"). Upstream code is used only from the wheel, at run time: the block is
`sglang.multimodal_gen.runtime.models.dits.qwen_image.QwenImageTransformerBlock` at Qwen-Image's production config
(dim 3072, 24 heads of 128), random seeded weights, upstream's own RoPE cache (QwenEmbedRope and the pipeline config's
get_freqs_cis). `MulAdd.forward_cuda` calls the module-level name `fuse_scale_shift_kernel` of
`sglang.multimodal_gen.runtime.layers.elementwise`; the baseline side is that name as imported, the candidate side
replaces it with the task's solution/kernel.py behind upstream's signature. Both sides live in one process: one CUDA
graph each, replayed alternated ABBA. An end-to-end check beside the row's verdict, not a verdict.

On CPU (`--device cpu --tokens small`) it runs eagerly, with MulAdd sent down forward_cuda so the mounted name is
reached as on a GPU, and the candidate's Triton kernel under TRITON_INTERPRET=1: the import/build/mount path only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from kpremote.agent.provenance import file_sha256  # noqa: E402  (standard library only)

TASK = REPO / "kernels" / "h200_diffusion_fuse_scale_shift__multi_shape"
DIM, HEADS, HEAD_DIM = 3072, 24, 128
# image tokens: (frames, h, w) patches; 64 x 64 is a 1024 x 1024 image (the fuse task's qwen_s4096 row)
TOKENS = {"production": ((1, 64, 64), (19, 47)), "small": ((1, 4, 4), (7,))}
ELEMENTWISE = "sglang.multimodal_gen.runtime.layers.elementwise"


class InputError(Exception):
    """Bad input: one line, exit 2."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheel", required=True, help="the sglang 0.5.23 .whl, or the folder it was unzipped to")
    p.add_argument("--site", required=True, help="folder of the carried dependencies (pip install --target)")
    p.add_argument("--out", required=True, help="folder for result.json and result.md")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tokens", choices=tuple(TOKENS), default="production")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--rounds", type=int, default=20, help="ABBA rounds (cuda)")
    p.add_argument("--replays", type=int, default=20, help="graph replays per timed sample (cuda)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention-backend", default="torch_sdpa", help="the same on both sides; not what is measured")
    p.add_argument("--unpack", default=None, help="where a .whl is unzipped (default: a temp folder)")
    return p.parse_args(argv)


def resolve_inputs(args: argparse.Namespace) -> tuple[Path, str]:
    """The wheel's unzipped folder and its digest; InputError for a missing wheel or site."""
    site = Path(args.site)
    if not site.is_dir():
        raise InputError(f"--site {site}: no such folder (the carried dependencies; benchmarks/gpu/block_e2e.sh)")
    wheel = Path(args.wheel)
    if wheel.is_dir():
        if not (wheel / "sglang" / "multimodal_gen").is_dir():
            raise InputError(f"--wheel {wheel}: folder holds no sglang/multimodal_gen (not an unzipped sglang wheel)")
        return wheel, "unknown (an unzipped folder was given)"
    if not wheel.is_file():
        raise InputError(f"--wheel {wheel}: no such file or folder")
    if not zipfile.is_zipfile(wheel):
        raise InputError(f"--wheel {wheel}: not a wheel (not a zip file)")
    digest = file_sha256(wheel)
    dest = Path(args.unpack) if args.unpack else Path(tempfile.mkdtemp(prefix="e2e-sglang-"))
    marker = dest / ".sha256"
    if not (marker.is_file() and marker.read_text() == digest):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(dest)
        marker.write_text(digest)
    return dest, digest


def setup_sglang(wheel_dir: Path, site: Path, attention_backend: str) -> None:
    """sglang importable, one rank of its distributed state, and the global server args the block's layers read."""
    sys.path[:0] = [str(site), str(wheel_dir)]
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("WORLD_SIZE", "1"), ("RANK", "0"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    import dataclasses

    from sglang.multimodal_gen.runtime.distributed import parallel_state
    from sglang.multimodal_gen.runtime.server_args import ServerArgs, set_global_server_args

    # ServerArgs.__post_init__ resolves a model path (hub look-ups); the block needs only the fields' defaults.
    server_args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(server_args, f.name, value)
    server_args.model_path = "Qwen/Qwen-Image"
    server_args.attention_backend = attention_backend
    server_args.kv_gather_degree = 1  # __post_init__'s default for one rank
    set_global_server_args(server_args)
    parallel_state.maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)


def load_candidate():
    """The task's solution/kernel.py as a module (its own file, by path)."""
    path = TASK / "solution" / "kernel.py"
    spec = importlib.util.spec_from_file_location("fuse_scale_shift_candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_upstream(candidate_fn):
    """The candidate's destination-passing fuse_scale_shift behind upstream's fuse_scale_shift_kernel signature."""
    import torch

    def fuse_scale_shift_kernel(x, scale, shift, scale_constant=1.0, block_l=128, block_c=128):
        out = torch.empty_like(x)
        candidate_fn(x, scale, shift, scale_constant, out)
        return out

    return fuse_scale_shift_kernel


def build_block(device: str, dtype, seed: int):
    """One QwenImageTransformerBlock at the production config, every parameter drawn from a seeded generator."""
    import torch

    from sglang.multimodal_gen.runtime.models.dits.qwen_image import QwenImageTransformerBlock

    block = QwenImageTransformerBlock(dim=DIM, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM)
    block = block.to(device=device, dtype=dtype).eval()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in block.named_parameters():
            fan_in = param.shape[-1] if param.dim() > 1 else DIM
            std = 1.0 if "norm" in name and param.dim() == 1 else fan_in**-0.5
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return block


def make_inputs(device: str, dtype, img_shape: tuple[int, int, int], txt_len: int, seed: int) -> dict:
    """Block inputs as QwenImageTransformer2DModel.forward hands them over: states, silu(temb), the RoPE caches."""
    import torch
    import torch.nn.functional as F

    from sglang.multimodal_gen.configs.models.dits.qwenimage import QwenImageDitConfig
    from sglang.multimodal_gen.configs.pipeline_configs.qwen_image import QwenImagePipelineConfig
    from sglang.multimodal_gen.runtime.models.dits.qwen_image import QwenEmbedRope

    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    img_tokens = img_shape[0] * img_shape[1] * img_shape[2]
    rope = QwenEmbedRope(theta=10000, axes_dim=list(QwenImageDitConfig().arch_config.axes_dims_rope), scale_rope=True)
    (img_cache, txt_cache), _ = QwenImagePipelineConfig.get_freqs_cis([img_shape], [txt_len], rope, device, dtype)
    temb = torch.randn(1, DIM, generator=gen).to(device=device, dtype=dtype)
    return {
        "hidden_states": torch.randn(1, img_tokens, DIM, generator=gen).to(device=device, dtype=dtype),
        "encoder_hidden_states": torch.randn(1, txt_len, DIM, generator=gen).to(device=device, dtype=dtype),
        "encoder_hidden_states_mask": None,
        "temb_img_silu": F.silu(temb),
        "temb_txt_silu": F.silu(temb),
        "image_rotary_emb": (img_cache.to(device), txt_cache.to(device)),
    }


class Mount:
    """Swaps elementwise.fuse_scale_shift_kernel (the name MulAdd.forward_cuda calls) between the two sides."""

    def __init__(self, candidate_fn):
        import importlib

        self.module = importlib.import_module(ELEMENTWISE)
        self.sides = {"baseline": self.module.fuse_scale_shift_kernel, "candidate": as_upstream(candidate_fn)}

    def use(self, side: str) -> None:
        self.module.fuse_scale_shift_kernel = self.sides[side]

    def count(self, side: str, run) -> list[list[int]]:
        """Shapes of x in each call the block makes to the mounted name during one eager forward."""
        calls: list[list[int]] = []
        inner = self.sides[side]

        def counted(x, *a, **k):
            calls.append(list(x.shape))
            return inner(x, *a, **k)

        self.module.fuse_scale_shift_kernel = counted
        try:
            run()
        finally:
            self.use(side)
        return calls


def native_neighbours(block, device: str) -> None:
    """Every CustomOp but MulAdd on forward_native; MulAdd on forward_cuda, as a CUDA host dispatches it, so the
    mounted name is reached. Used on CPU (forward_cpu asks for sgl_kernel's CPU ops) and on a GPU without the CuTe
    DSL (nvidia-cutlass-dsl, ~97 MB of wheels: more than one device call carries) that the norm-modulate ops use.
    On CPU upstream's fuse_scale_shift_kernel is its sgl_kernel CPU op, so both names become the wheel's own torch
    fallback (fuse_scale_shift_kernel_native), before Mount takes the baseline."""
    import importlib

    from sglang.kernels.ops.diffusion.common.fallback_torch import fuse_scale_shift_kernel_native
    from sglang.multimodal_gen.runtime.layers.custom_op import CustomOp
    from sglang.multimodal_gen.runtime.layers.elementwise import MulAdd

    if device == "cpu":
        for name in (ELEMENTWISE, "sglang.multimodal_gen.runtime.layers.layernorm"):
            importlib.import_module(name).fuse_scale_shift_kernel = fuse_scale_shift_kernel_native
    for module in block.modules():
        if isinstance(module, MulAdd):
            module._forward_method = module.forward_cuda
        elif isinstance(module, CustomOp):
            module._forward_method = module.forward_native


def has_cute_dsl() -> bool:
    try:
        import cutlass.cute  # noqa: F401
    except Exception:
        return False
    return True


def diff(a, b) -> dict:
    """Candidate side a against baseline side b: largest |a - b|, that over b's largest |value| (an elementwise ratio
    explodes where b is near 0), and the fraction of elements that differ at all."""
    d = (a.float() - b.float()).abs()
    peak = float(b.float().abs().max())
    return {"max_abs": float(d.max()), "max_abs_over_peak": float(d.max()) / peak if peak else float("inf"),
            "differing_fraction": float((d > 0).float().mean())}


def time_sides(replay: dict, rounds: int, replays: int) -> dict:
    """ABBA: rounds alternate (baseline, candidate, candidate, baseline) and its mirror; each sample is `replays`
    calls of the side's replay between two CUDA events, in us per call."""
    import torch

    samples = {side: [] for side in replay}
    for r in range(rounds):
        order = ("baseline", "candidate", "candidate", "baseline") if r % 2 == 0 else (
            "candidate", "baseline", "baseline", "candidate")
        for side in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                replay[side]()
            end.record()
            end.synchronize()
            samples[side].append(start.elapsed_time(end) * 1000.0 / replays)
    return {side: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v), "samples": len(v)}
            for side, v in samples.items()}


def call_block(block, inputs: dict):
    """One forward, inside the forward context a pipeline's denoising step sets (the attention reads it)."""
    import torch

    from sglang.multimodal_gen.runtime.managers.forward_context import set_forward_context

    with torch.no_grad(), set_forward_context(current_timestep=0, attn_metadata=None):
        return block(**inputs)


def capture(block, inputs: dict):
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call_block(block, inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call_block(block, inputs)
    return graph, outputs


def run_row(block, mount: Mount, inputs: dict, device: str, rounds: int, replays: int) -> dict:
    """One (image, text) token count: call count, the two sides' agreement, and on CUDA their graph times."""
    import torch

    def forward():
        return call_block(block, inputs)

    row: dict = {"calls": {}}
    outs = {}
    for side in ("baseline", "candidate"):
        calls = mount.count(side, forward)
        row["calls"][side] = {"count": len(calls), "shapes": calls}
        mount.use(side)
        outs[side] = forward()
    row["agreement"] = {
        "encoder_hidden_states": diff(outs["candidate"][0], outs["baseline"][0]),
        "hidden_states": diff(outs["candidate"][1], outs["baseline"][1]),
    }
    if device == "cuda":
        replay = {}
        try:
            for side in ("baseline", "candidate"):
                mount.use(side)
                replay[side] = capture(block, inputs)[0].replay
            row["mode"] = "cuda graph replay"
        except Exception as e:  # a host sync on upstream's path: time eager forwards instead, and say so
            row["mode"] = f"eager (graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]})"
            torch.cuda.synchronize()
            replay = {side: (lambda side=side: (mount.use(side), forward())) for side in ("baseline", "candidate")}
        mount.use("baseline")
        row["timing"] = time_sides(replay, rounds, replays)
        row["ratio_candidate_over_baseline"] = row["timing"]["candidate"]["median_us"] / row["timing"]["baseline"][
            "median_us"]
    return row


def _cell(side: dict) -> str:
    return f"{side['median_us']:.1f} ({side['min_us']:.1f}-{side['max_us']:.1f})"


def write_results(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Qwen-Image block, fuse_scale_shift mounted at MulAdd's call site ({result['device']})", ""]
    for key in ("torch", "triton", "sglang_wheel_sha256", "solution_sha256", "dtype", "attention_backend", "neighbours",
                "block_parameters"):
        lines.append(f"- {key}: {result[key]}")
    lines += ["",
              "| image tokens | text tokens | calls / forward | baseline us | candidate us | ratio | max abs diff |",
              "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        t = row.get("timing")
        base, cand = (_cell(t["baseline"]), _cell(t["candidate"])) if t else ("-", "-")
        ratio = f"{row['ratio_candidate_over_baseline']:.4f} ({row['mode']})" if t else "not timed (cpu)"
        worst = max(v["max_abs"] for v in row["agreement"].values())
        lines.append(f"| {row['image_tokens']} | {row['text_tokens']} | {row['calls']['baseline']['count']} | {base} "
                     f"| {cand} | {ratio} | {worst:.3g} |")
    (out / "result.md").write_text("\n".join(lines) + "\n")


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "absent"
    return triton.__version__


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        wheel_dir, wheel_digest = resolve_inputs(args)
    except InputError as e:
        print(f"block_e2e: {e}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the candidate's kernel on CPU
    # forward_native of the norm-modulate ops is @torch.compile'd upstream: eager here, the same on both sides
    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    setup_sglang(wheel_dir, Path(args.site), args.attention_backend)
    import torch

    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    block = build_block(args.device, dtype, args.seed)
    neighbours = "upstream" if args.device == "cuda" and has_cute_dsl() else "native"
    if neighbours == "native":
        native_neighbours(block, args.device)
    mount = Mount(load_candidate().fuse_scale_shift)
    img_shape, txt_lens = TOKENS[args.tokens]
    rows = []
    for txt_len in txt_lens:
        inputs = make_inputs(args.device, dtype, img_shape, txt_len, args.seed)
        row = run_row(block, mount, inputs, args.device, args.rounds, args.replays)
        row.update(image_tokens=inputs["hidden_states"].shape[1], text_tokens=txt_len)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("image_tokens", "text_tokens", "agreement")} | {
            "calls": row["calls"]["baseline"]["count"], "ratio": row.get("ratio_candidate_over_baseline")}))
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton_version(), "sglang_wheel_sha256": wheel_digest,
        "block_parameters": sum(p.numel() for p in block.parameters()),
        "solution_sha256": file_sha256(TASK / "solution" / "kernel.py"), "dtype": str(dtype).replace("torch.", ""),
        "attention_backend": args.attention_backend, "neighbours": neighbours, "tokens": args.tokens,
        "rounds": args.rounds,
        "replays": args.replays, "seed": args.seed, "mounted_name": f"{ELEMENTWISE}.fuse_scale_shift_kernel",
        "rows": rows,
    }
    write_results(Path(args.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
