"""The norm_tanh_mul_add task's baseline on a machine without a GPU: upstream's own host wrappers accept every row.

SGLang's Z-Image kernels cannot run here (they compute in bf16, which Triton's interpreter computes on raw bits; the
baseline refuses the interpreter, tests/kernels/test_inv_check.py). What can run is upstream's host wrapper around
each launch: its guards (`_can_use_operand`, row strides, rows that divide), which return None, and so fail the
call, for an operand they refuse; and the launch's arguments. With the Triton kernel object replaced by a recorder,
every row of bench/workloads.toml (production shapes included) goes through baseline/kernel.py as the harness calls
it, and the recorded launch must write the caller's `out`, over one program per row of x, reading the row's own
tensors with their strides.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASK = "h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape"

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import torch
    from kpremote.agent.task import build
    from kpremote.agent.task.taskspec import load_task

    task = load_task(Path(sys.argv[2]))
    adapter = build.import_adapter(task)
    baseline = build.import_side(task, "baseline")
    adapter.bind(baseline=baseline, candidate=None)
    upstream = sys.modules[baseline.rmsnorm_scale.__module__]._upstream
    from importlib import import_module
    seen_as_cuda = import_module(baseline.rmsnorm_scale.__module__.rsplit(".", 1)[0] + "._sglang").seen_as_cuda

    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.name, grid, args, kwargs))

    upstream._rmsnorm_tanh_residual_kernel = Recorder("tanh_residual")
    upstream._rmsnorm_scale_kernel = Recorder("scale")

    def same(a, b):
        return isinstance(a, torch.Tensor) and a.data_ptr() == b.data_ptr() and a.stride() == b.stride()

    failures = []
    for w in task.workloads:
        case = adapter.make_case(w.params, device="cpu", seed=0)
        inputs = {k: seen_as_cuda(v) for k, v in case.inputs.items()}
        out = case.outputs_baseline["out"]
        launches.clear()
        try:
            adapter.call_baseline(w.params, inputs, case.outputs_baseline)
        except Exception as exc:
            failures.append(f"{w.id}: {type(exc).__name__}: {exc}")
            continue
        [(name, grid, args, kwargs)] = launches
        B, S, D = w.params["shape"]
        mod = case.inputs["gate" if name == "tanh_residual" else "scale"]
        y, x = args[0], args[1]
        if name != w.params["function"] or grid != (B * S,):
            failures.append(f"{w.id}: launched {name} over {grid}")
        if y.data_ptr() != out.data_ptr() or tuple(y.shape) != (B * S, D) or not same(x, case.inputs["x"]):
            failures.append(f"{w.id}: does not write the caller's out from x")
        if name == "tanh_residual":
            if not (same(args[2], mod) and same(args[3], case.inputs["residual"])
                    and same(args[4], case.inputs["weight"])):
                failures.append(f"{w.id}: gate, residual, weight not in upstream's order")
            strides, seq_len = args[5:8], args[8]
        else:
            if not (same(args[2], case.inputs["weight"]) and same(args[3], mod)):
                failures.append(f"{w.id}: weight, scale not in upstream's order")
            strides, seq_len = args[4:6], args[6]
        rows = mod.reshape(-1, D)  # a view: the modulation's rows where they lie
        apart = (rows[1].data_ptr() - rows[0].data_ptr()) // rows.element_size() if len(rows) > 1 else strides[1]
        if seq_len != B * S // len(rows) or strides[1] != apart or strides[0] != D:
            failures.append(f"{w.id}: modulation rows read as {strides}, {seq_len} rows each")
    print(json.dumps({"rows": len(task.workloads), "failures": failures}))
    """
)


@pytest.mark.timeout(600)
def test_upstreams_wrappers_accept_every_row_and_launch_into_the_callers_out(tmp_path: Path) -> None:
    from kpremote.task.baseline import materialize

    task = tmp_path / "kernels" / TASK
    shutil.copytree(ROOT / "kernels" / TASK, task, ignore=shutil.ignore_patterns("results", "upstream"))
    assert materialize(task).files == 2
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT), str(task)], capture_output=True, text=True,
                          env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rows"] == 19 and report["failures"] == []
