"""The process Nsight Compute measures: one side's calls of one workload, only the marked ones profiled.

    python -m kpremote.agent.ncu.profile call --job JOB.json --out DONE.json   (a profile run's target: call_side)
    python -m kpremote.agent.harness.side --fd 0 --side S --run-dir R < JOB.json  (the timing audit's: audit.call_row,
        started as a timed side is, with its job on standard input instead of a channel: call_from_fd)

Both import only the measured side into the task's adapter, make the warm-up calls outside the profiler's region,
then the measured calls inside cudaProfilerStart/Stop (ncu runs with `--profile-from-start off`). A call that
fails prints its traceback into ncu's log, which the runner quotes; DONE.json appears only after the last call.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from ..atomicfile import write_atomically
from ..task.taskspec import SIDES, TaskSpec, Workload, load_task


def call_side(job: dict[str, Any]) -> dict[str, Any]:
    """A profile run's target: warm up, then make all profiled calls of one side inside one profiler region."""
    spec, workload, device = job_task(job)
    params, side = workload.params, job["side"]
    adapter = bound_adapter(spec, side, (job.get("modules") or {}).get(side))
    case = adapter.make_case(params, device=device, seed=int(params.get("seed", 0)) + spec.timing.seeds)
    call = side_call(adapter, side, case, params)
    warm_up(call, job["warmup"], device)
    with profiled(device):
        for _ in range(job["calls"]):
            call()
        synchronize(device)
    return {"side": side, "workload": workload.id, "warmup": job["warmup"], "calls": job["calls"]}


def call_main(argv: list[str], prog: str, calls: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Read the job, make its calls, write what was done; exit 1 with the traceback on stderr if a call fails."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    from .. import sandbox

    job = json.loads(args.job.read_text())  # before the sandbox hides the run folder it lies in
    # before the side's code is imported; profiled: the GPU's counters may be root's (privileges.counters_need_root)
    print(f"profiled call: {sandbox.enter(profiled=True)}", file=sys.stderr, flush=True)
    try:
        result = calls(job)
    except Exception:  # noqa: BLE001 - the traceback lands in the ncu log, which the runner quotes
        traceback.print_exc()
        return 1
    write_atomically(args.out, json.dumps(result))
    return 0


def call_from_fd(fd: int, calls: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """The audit's target (side.main, when its descriptor is no channel): the job is read from `fd`, which then
    becomes /dev/null (as a side's standard input is); the process entered the sandbox before. Writes what was
    done to the job's `done` file; exit 1 with the traceback on stderr if a call fails."""
    import os

    with os.fdopen(os.dup(fd), "rb") as source:
        job = json.loads(source.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    try:
        result = calls(job)
    except Exception:  # noqa: BLE001 - the traceback lands in the ncu log, which the runner quotes
        traceback.print_exc()
        return 1
    write_atomically(Path(job["done"]), json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------- the pieces


def job_task(job: dict[str, Any]) -> tuple[TaskSpec, Workload, str]:
    spec = load_task(Path(job["task_dir"]))
    workload = next(w for w in spec.workloads if w.id == job["workload"])
    return spec, workload, "cuda" if job["device"].startswith("cuda") else "cpu"


def bound_adapter(spec: TaskSpec, side: str, module_file: str | None) -> Any:
    """The task's adapter with only the measured side imported (the other side is bound to None)."""
    from ..task.build import import_adapter, import_side

    module = import_side(spec, side, module_file)
    adapter = import_adapter(spec)
    if callable(getattr(adapter, "bind", None)):
        adapter.bind(**{s: module if s == side else None for s in SIDES})
    return adapter


def side_call(adapter: Any, side: str, case: Any, params: dict[str, Any]) -> Callable[[], None]:
    """One call of the side on the case's inputs, into the side's own outputs."""
    outputs = case.outputs_baseline if side == "baseline" else case.outputs_candidate
    call = getattr(adapter, f"call_{side}")
    return lambda: call(params, case.inputs, outputs)


def warm_up(call: Callable[[], None], times: int, device: str) -> None:
    """Calls outside the profiled region: JIT compilation and first-touch effects stay out of the measurement."""
    for _ in range(times):
        call()
    synchronize(device)


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


@contextmanager
def profiled(device: str) -> Iterator[None]:
    """cudaProfilerStart/Stop around the block: with `--profile-from-start off`, ncu profiles only in between."""
    if device != "cuda":
        yield
        return
    from torch.cuda import profiler

    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
