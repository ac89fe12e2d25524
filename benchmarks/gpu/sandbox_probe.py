"""Does the sandbox leave a GPU side working? One script, three checks, on a GPU host (python3 with torch).

    python benchmarks/gpu/sandbox_probe.py all OUT_DIR

1. judge: run under the namespace launcher (PID + mount namespace, as the judge is): CUDA works as process 1,
   a tensor shared by CUDA IPC (legacy handles, as cases.py shares them) opens in a sandboxed child side.
2. side: Landlock + seccomp entered before torch is imported; CUDA init, the IPC tensor, a Triton kernel
   compiled into the scratch cache, CUDA events; writes outside scratch, signals to the judge and reading a run's
   state.json refused, /dev/shm writable (the judge's namespace's own).
3. ncu: Nsight Compute profiles a sandboxed target (the audit's case).
Prints one JSON line per check.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))

from kpremote.agent import sandbox  # noqa: E402


def side(scratch: str) -> dict:
    applied = sandbox.enter(Path(scratch))
    out: dict = {"applied": applied}
    import torch

    data = sys.stdin.buffer.read()
    rebuild, args = pickle.loads(data) if data else (None, None)
    torch.cuda.init()
    if rebuild is not None:
        shared = rebuild(*args)
        out["ipc_sum"] = float(shared.float().sum().item())
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x + offs, tl.load(x + offs, mask=mask) + 1, mask=mask)

    x = torch.zeros(1 << 20, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    add_one[(x.numel() // 1024,)](x, x.numel(), BLOCK=1024)
    end.record()
    torch.cuda.synchronize()
    out["triton_ok"] = bool((x == 1).all().item())
    out["event_us"] = start.elapsed_time(end) * 1000
    out["triton_cache_files"] = sum(1 for _ in Path(scratch, "triton").rglob("*"))
    for what, target in (("write_outside", lambda: open(os.environ.get("PROBE_OUTSIDE", "/tmp/x"), "w")),
                         ("signal_judge", lambda: os.kill(os.getppid(), 0)),
                         ("read_records", lambda: open(os.environ["PROBE_RECORDS"]).read()),
                         ("shm_write", lambda: open(f"/dev/shm/kp-probe-{os.getpid()}", "w"))):
        try:
            target()
            out[what] = "allowed"
        except OSError as exc:
            out[what] = f"refused: {exc.strerror}"
    return out


def records(scratch: Path) -> dict[str, str]:
    """A run folder with a state.json, hidden from the sandboxed process as a run's records are; under $HOME, where
    a kpremote root lies (a hidden folder in /tmp would hide what ncu writes to /tmp once the target has started)."""
    run = Path(tempfile.mkdtemp(prefix=".kp-probe-run-", dir=Path.home()))
    (run / "state.json").write_text("{}")
    return {**sandbox.reads_env(run, []), "PROBE_RECORDS": str(run / "state.json")}


def judge(out_dir: str) -> dict:
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    result: dict = {"pid_in_namespace": os.getpid(), "proc_entries": len([p for p in os.listdir("/proc") if p.isdigit()])}
    t = torch.arange(1000, device="cuda", dtype=torch.float32)
    payload = pickle.dumps(reduce_tensor(t))
    scratch = sandbox.make_scratch(Path(tempfile.mkdtemp(prefix="kp-probe-")))
    env = {**os.environ, **sandbox.scratch_env(scratch), **records(scratch),
           "PROBE_OUTSIDE": str(Path(out_dir) / "planted.txt")}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE), "side", str(scratch)], input=payload, capture_output=True,
                          env=env, timeout=300)
    result["side_seconds"] = round(time.perf_counter() - started, 2)
    result["side_rc"] = proc.returncode
    result["side"] = json.loads(proc.stdout.decode().strip().splitlines()[-1]) if proc.returncode == 0 else \
        proc.stderr.decode()[-3000:]
    result["expected_sum"] = float(t.sum().item())
    return result


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "side":
        print(json.dumps(side(argv[1])))
        return 0
    if what == "judge":
        print(json.dumps(judge(argv[1])))
        return 0
    if what == "ncuside":
        scratch = argv[1]
        applied = sandbox.enter(Path(scratch))
        import torch

        x = torch.ones(1 << 22, device="cuda")
        (x * 2).sum().item()
        print(json.dumps({"ncu_side_applied": applied}))
        return 0
    out_dir = argv[1]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    print(json.dumps({"support": sandbox.support().to_json()}), flush=True)
    ns = subprocess.run([sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--", sys.executable, str(HERE),
                         "judge", out_dir], capture_output=True, cwd=HERE.parents[2], timeout=400)
    print(ns.stdout.decode()[-4000:] or ns.stderr.decode()[-4000:], flush=True)
    print(json.dumps({"namespace_rc": ns.returncode}), flush=True)
    scratch = sandbox.make_scratch(Path(tempfile.mkdtemp(prefix="kp-ncu-")))
    ncu = os.environ.get("NCU", "ncu")
    report = Path(out_dir) / "probe"
    env = {**os.environ, **sandbox.scratch_env(scratch), **records(scratch)}
    started = time.perf_counter()
    run = subprocess.run([ncu, "--target-processes", "all", "--clock-control", "none", "-f", "-o", str(report),
                          sys.executable, str(HERE), "ncuside", str(scratch)], capture_output=True, env=env,
                         timeout=400)
    print(json.dumps({"ncu_rc": run.returncode, "ncu_seconds": round(time.perf_counter() - started, 1),
                      "report": report.with_suffix(".ncu-rep").exists(),
                      "tail": (run.stdout.decode() + run.stderr.decode())[-1500:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
