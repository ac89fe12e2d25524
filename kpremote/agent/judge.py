"""The trusted judge of one workload row: correctness, timing and every number, with the candidate kept outside.

    python -m kpremote.agent.judge --result-fd N      (the job and the run's secret arrive as one JSON line on stdin)

The judge imports torch and the task's bench/adapter.py (trusted, pinned) but never a side's module, and never
calls adapter.bind. It starts one side process per side (side.py), each holding the adapter and only its own
module, and drives them over a socket: "here is case k", "call case k", "time a sample on case k". Every case
is built here by adapter.make_case with seeds derived from the run's secret (which no side sees); each side
gets its own copy of the inputs (CUDA IPC from a memory pool of its own, or memfd shared memory on the CPU)
and its own outputs. The judge poisons outputs before every call and every timed sample (and writes fresh
copies of the inputs a call mutates in place, which it then judges like outputs), compares them itself, recomputes every statistic, verdict and speedup from the raw sample times, and checks them against
physical floors. A side sends back only JSON: acknowledgements and raw times.

The result goes to the runner through the inherited pipe N (a "ready" line once both sides are up, then
the result), never through a file a side could reach. The judge makes itself undumpable first.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import random
import secrets
import socket
import subprocess
import sys
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import floors, guard, stats, timing
from .channel import BadReply, Channel, ChannelClosed, encode_values, share_cpu_tensor
from .correctness import (ERROR, INCORRECT, PASSED, CaseView, Refused, SideFailed, Verdict, check_case, clone_tensors,
                          compare_output, describe, mutated_inputs, poison_outputs, reference_inputs,
                          require_inputs_untouched, restore_mutated, results_of)
from .taskspec import SIDES, TaskSpec, Workload, load_task

TIMING_CASES_GPU = 4  # fresh cases at distinct addresses the timed samples rotate over
TIMING_CASES_CPU = 2  # the interpreter is slow: fewer on a smoke run, the same boundary
CHECK_FRACTION = 0.25  # samples whose outputs are compared afterwards (plus each side's last one)
MAX_REFRESHES = 2  # times a case's inputs are rewritten in place (same addresses) before a checked sample
REFRESH_CHANCE = 0.5  # of a checked candidate sample, while refreshes are left
SIDE_START_LIMIT_S = 300.0
SEED_BITS = 63


# --------------------------------------------------------------------------------------------- seeds


def derive_seed(secret: bytes, workload_id: str, purpose: str, index: int) -> int:
    """A seed nobody can predict without the run's secret (HMAC-SHA256), 63 bits."""
    message = f"{workload_id}\0{purpose}\0{index}".encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big") >> (64 - SEED_BITS)


# --------------------------------------------------------------------------------------------- side processes


class SideProcess:
    """One side's process and the judge's end of its channel."""

    def __init__(self, side: str, env: dict[str, str], cwd: Path) -> None:
        self.side = side
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kpremote.agent.side", "--fd", str(theirs.fileno()), "--side", side,
             "--run-dir", str(cwd)],
            pass_fds=(theirs.fileno(),), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.channel = Channel(ours)

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, command: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
        """Send one command, wait for its JSON reply; a raise, a crash or a bad reply is a SideFailed."""
        try:
            self.channel.send_command(command, fds)
            reply = self.channel.recv_reply()
        except ChannelClosed:
            raise SideFailed(f"{self.side} side crashed: {self._exit()}") from None
        except BadReply as exc:
            raise SideFailed(f"{self.side} side broke the protocol: {exc}") from None
        if not reply.get("ok"):
            raise SideFailed(str(reply.get("error") or "failed without saying why"), reply.get("traceback"))
        return reply

    def _exit(self) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "closed its channel and did not exit"
        if code < 0:
            import signal

            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def threads(self) -> int | None:
        return guard.thread_count(self.pid)

    def stop(self) -> None:
        """Killed, not asked: a side has nothing to save, and torch's teardown can take seconds on a busy host."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.channel.close()


# --------------------------------------------------------------------------------------------- shared cases


@dataclass
class SharedCase:
    """One case built by the judge: each side's private copy of the inputs, its outputs, and the truth."""

    id: int
    label: str
    seed: int
    case: Any  # the adapter's Case
    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    pristine: dict[str, Any]
    keep: list[Any] = field(default_factory=list)  # (shared tensor, memfd handle) pairs of CPU tensors
    expected: dict[str, Any] | None = None
    generation: int = 0  # bumped by each in-place refresh of the inputs
    mutates: tuple[str, ...] = ()  # inputs a call rewrites in place: restored from `pristine` before every call

    def results(self, side: str) -> dict[str, Any]:
        return results_of(self.outputs[side], self.inputs[side], self.mutates)

    def restore(self, side: str) -> None:
        restore_mutated(self.pristine, self.inputs[side], self.mutates)

    def close(self) -> None:
        for _tensor, handle in self.keep:
            os.close(handle.fd)
        self.keep.clear()


class Sharing:
    """Copies a case's tensors into memory each side may see: its own CUDA memory pool, or memfd on the CPU.

    A CUDA IPC handle opens a whole allocator segment, not one tensor: without a pool per side, a side could
    read whatever else the judge keeps in the same segment (another side's outputs, the expected ones).
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.pools: dict[str, Any] = {}
        self.isolation = "memfd" if device == "cpu" else "none"
        if device == "cuda":
            import torch

            if hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool"):
                self.pools = {side: torch.cuda.MemPool() for side in SIDES}
                self.isolation = "a CUDA memory pool per side"

    @contextmanager
    def pool(self, side: str) -> Iterator[None]:
        if side in self.pools:
            import torch

            with torch.cuda.use_mem_pool(self.pools[side]):
                yield
        else:
            with nullcontext():
                yield

    def copy(self, value: Any, side: str, keep: list[Any]) -> Any:
        import torch

        if not torch.is_tensor(value):
            return value
        if value.device.type == "cpu":
            shared, handle = share_cpu_tensor(value.detach())
            keep.append((shared, handle))
            return shared
        with self.pool(side):
            return copy_with_layout(value.detach())

    def share(self, case: Any, case_id: int, label: str, seed: int) -> SharedCase:
        keep: list[Any] = []
        inputs, outputs = {}, {}
        for side in SIDES:
            inputs[side] = {name: self.copy(v, side, keep) for name, v in case.inputs.items()}
            side_outputs = case.outputs_baseline if side == "baseline" else case.outputs_candidate
            outputs[side] = {name: self.copy(v, side, keep) for name, v in side_outputs.items()}
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return SharedCase(case_id, label, seed, case, inputs, outputs, clone_tensors(case.inputs), keep)


def copy_with_layout(tensor: Any) -> Any:
    """A copy with the same shape, strides and storage offset (a view stays a view of its own whole storage)."""
    import torch

    storage = tensor.untyped_storage()
    fresh = torch.empty(max(1, storage.nbytes()), dtype=torch.uint8, device=tensor.device).untyped_storage()
    if storage.nbytes():
        fresh.copy_(storage)
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(fresh, tensor.storage_offset(), tensor.shape,
                                                                        tensor.stride())


# --------------------------------------------------------------------------------------------- the row


class Judge:
    """One row, start to end, with both sides in their own processes."""

    def __init__(self, job: dict[str, Any], secret: bytes, announce_ready: Any) -> None:
        self.job = job
        self.secret = secret
        self.announce_ready = announce_ready
        self.spec: TaskSpec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
        self.workload: Workload = next(w for w in self.spec.workloads if w.id == job["workload"])
        self.params = self.workload.params
        self.device = "cuda" if job["device"].startswith("cuda") else "cpu"
        self.sides: dict[str, SideProcess] = {}
        self.adapter: Any = None
        self.sharing: Sharing | None = None
        self.cases: dict[int, SharedCase] = {}
        self.next_id = 0
        self.seeds: dict[str, list[int]] = {"correctness": [], "timing": [], "refresh": []}
        self.rng = random.Random(secrets.randbits(64))
        self.checked = {side: 0 for side in SIDES}
        self.refreshes = 0
        self.largest: dict[str, float] = {}

    # ---------------------------------------------------------------- start and stop

    def start(self) -> dict[str, Any] | None:
        """Both side processes up with their modules imported; None, or the row's ERROR."""
        env = dict(os.environ)
        cwd = Path(self.job.get("run_dir") or ".")
        self.sides = {side: SideProcess(side, env, cwd) for side in SIDES}  # they import while the judge does
        from . import build

        try:
            self.adapter = build.import_adapter(self.spec)
        except Exception as exc:  # noqa: BLE001 - a task that does not import is this row's ERROR
            return {"status": ERROR, "message": f"import: bench/adapter.py: {type(exc).__name__}: {exc}",
                    "where": "import", "traceback": traceback.format_exc()}
        self.sharing = Sharing(self.device)
        modules = self.job.get("modules") or {}
        for side, process in self.sides.items():
            try:
                process.request({"op": "start", "side": side, "task_dir": str(self.spec.root), "device": self.device,
                                 "workload": self.params, "module_file": modules.get(side)})
            except SideFailed as exc:
                return {"status": ERROR, "message": f"import: {side}: {exc.message}", "where": "import",
                        "traceback": exc.traceback_text}
        self.announce_ready()
        return None

    def stop(self) -> None:
        for process in self.sides.values():
            process.stop()
        for case in self.cases.values():
            case.close()

    # ---------------------------------------------------------------- cases

    def new_case(self, label: str, seed: int) -> SharedCase:
        case = _guarded_make_case(self.adapter, self.params, self.device, seed, label)
        mutates = mutated_inputs(self.workload.mutates, case, label)
        shared = self.sharing.share(case, self.next_id, label, seed)
        shared.mutates = mutates
        self.next_id += 1
        for side in SIDES:
            fds: list[int] = []
            command = {"op": "case", "id": shared.id, "mutates": list(mutates),
                       "inputs": encode_values(shared.inputs[side], fds, shared.keep),
                       "outputs": encode_values(shared.outputs[side], fds, shared.keep)}
            _guarded_request(self.sides[side], command, f"{label}, handing the case to the {side}", fds)
        self.cases[shared.id] = shared
        return shared

    def drop_case(self, shared: SharedCase) -> None:
        for side in SIDES:
            _guarded_request(self.sides[side], {"op": "drop", "id": shared.id}, f"{shared.label}, drop")
        shared.close()
        self.cases.pop(shared.id, None)

    def view(self, shared: SharedCase) -> CaseView:
        case = shared.case
        atol = float(case.atol if self.workload.atol is None else self.workload.atol)
        rtol = float(case.rtol if self.workload.rtol is None else self.workload.rtol)

        def call(side: str) -> dict[str, Any] | None:
            return self.sides[side].request({"op": "call", "id": shared.id}).get("problem")

        return CaseView(shared.label, shared.inputs, shared.outputs, shared.pristine, call, atol, rtol, shared.mutates)

    # ---------------------------------------------------------------- correctness

    def correctness(self) -> tuple[Verdict, list[SharedCase]]:
        """The gate on `seeds` secret-seeded cases, then on the timing cases (kept for timing)."""
        n_seeds = self.spec.timing.seeds
        k_timing = TIMING_CASES_GPU if self.device == "cuda" else TIMING_CASES_CPU
        timing_cases: list[SharedCase] = []
        checked = 0
        try:
            for k in range(n_seeds):
                seed = derive_seed(self.secret, self.workload.id, "correctness", k)
                self.seeds["correctness"].append(seed)
                shared = self.new_case(f"seed {seed}", seed)
                check_case(self.adapter, self.params, self.view(shared), device=self.device, largest=self.largest)
                checked += 1
                self.drop_case(shared)
            for k in range(k_timing):
                seed = derive_seed(self.secret, self.workload.id, "timing", k)
                self.seeds["timing"].append(seed)
                shared = self.new_case(f"timing case {k} (seed {seed})", seed)
                shared.expected = check_case(self.adapter, self.params, self.view(shared), device=self.device,
                                             largest=self.largest)
                checked += 1
                timing_cases.append(shared)
        except Refused as refused:
            refused.verdict.seeds_checked = checked
            return refused.verdict, timing_cases
        return Verdict(PASSED, seeds_checked=checked, max_abs_err=self.largest), timing_cases

    # ---------------------------------------------------------------- timing

    def time_row(self, cases: list[SharedCase]) -> dict[str, Any]:
        settings = self.spec.timing
        mode = settings.mode if self.device == "cuda" else "smoke"
        bytes_moved = self._bytes_moved(cases[0].case)
        result: dict[str, Any] = {"bytes_moved": bytes_moved, "flops": cases[0].case.flops, "implausible": None}
        if self.device == "cuda":
            if not bytes_moved:
                return {**result, "status": ERROR, "where": "timing",
                        "message": "bench/adapter.py gives no bytes_moved for this row: a GPU timing needs it for "
                                   "its physical floor (define bytes_moved(workload) or set Case.bytes_moved)"}
            for side in ("candidate", "baseline"):
                reason = self.sides[side].request({"op": "stream_check", "id": cases[0].id}).get("reason")
                if reason:
                    return _implausible(side, str(reason), {**result, "timing": None})
        ids = [case.id for case in cases]
        hosts = [self.sides[side].request({"op": "warm_up", "ids": ids, "seconds": settings.warmup_s
                                           if self.device == "cuda" else 0.0}).get("host_us") for side in SIDES]
        head_start = 0.0
        if self.device == "cuda":
            head_start = timing.head_start_us(max(float(h or 0.0) for h in hosts))
            for side in SIDES:
                self.sides[side].request({"op": "head_start", "us": head_start})
        sampler = Sampler(self, cases, mode)
        if mode == "graph":
            sampler.capture_graphs()
        # Counted before the first sample command: a side that recognises a timed call and starts a thread then
        # is seen, however early (the correctness calls and the warm-up have run every other code path).
        threads_before = {side: self.sides[side].threads() for side in SIDES}
        sampler.prime()
        pair = sampler.run(settings, head_start)
        threads_after = {side: self.sides[side].threads() for side in SIDES}
        sampler.final_checks()
        for case in cases:
            for side in SIDES:
                require_inputs_untouched(side, f"{case.label}, after timing", case.pristine, case.inputs[side],
                                         skip=case.mutates)
        medians = {side: stats.median(getattr(pair, side).times_us) for side in SIDES}
        result.update(
            timing=pair.to_json(),
            samples={side: getattr(pair, side).times_us for side in SIDES},
            gbps={side: floors.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
            verdict=stats.row_verdict(pair.baseline.times_us, pair.candidate.times_us),
            checks={"timing_cases": len(cases), "checked_samples": dict(self.checked), "refreshes": self.refreshes,
                    "check_fraction": CHECK_FRACTION, "memory_isolation": self.sharing.isolation},
            side_threads={"before": threads_before, "after": threads_after},
        )
        grew = [side for side in SIDES if (threads_after[side] or 0) > (threads_before[side] or 0)]
        if grew:
            result["invalid"] = "; ".join(f"the {side} side started {threads_after[side] - threads_before[side]} "
                                          f"thread(s) during timing" for side in grew)
        if self.device == "cuda":
            floor = floors.floor_bandwidth(mode, bytes_moved, self.job.get("l2_bytes") or 0, self.job.get("copy_gbps"),
                                           self.job.get("l2_copy_gbps"))
            for side in ("candidate", "baseline"):
                reason = floors.floor_check(bytes_moved, medians[side], *floor)
                if reason:
                    return _implausible(side, reason, result)
        return result

    def _bytes_moved(self, case: Any) -> int | None:
        if case.bytes_moved:
            return int(case.bytes_moved)
        if callable(getattr(self.adapter, "bytes_moved", None)):
            value = self.adapter.bytes_moved(self.params)
            return int(value) if value else None
        return None

    # ---------------------------------------------------------------- one row

    def run(self) -> dict[str, Any]:
        failed = self.start()
        _log("sides ready")
        if failed:
            return failed
        verdict, cases = self.correctness()
        _log(f"correctness: {verdict.status}")
        result: dict[str, Any] = {"status": verdict.status, "message": verdict.message, "where": verdict.where,
                                  "correctness": verdict.to_json(), "timing": None, "seeds": self.seeds}
        if verdict.status != PASSED:
            return result  # nothing is timed for a row that is not correct
        try:
            result.update(self.time_row(cases))
        except Refused as refused:
            result.update(status=refused.verdict.status, message=refused.verdict.message,
                          where=refused.verdict.where, mismatch=refused.verdict.mismatch, timing=None)
            result.pop("samples", None)
        except SideFailed as exc:
            result.update(status=ERROR, message=f"timing: {exc.message}", where="timing", timing=None,
                          traceback=exc.traceback_text)
        except Exception as exc:  # noqa: BLE001
            result.update(status=ERROR, message=f"timing: {type(exc).__name__}: {exc}", where="timing", timing=None,
                          traceback=traceback.format_exc())
        result["seeds"] = self.seeds
        _log(f"timing: {result['status']}")
        return result


class Sampler:
    """The timed loop: ABBA over the sides, rotating over the timing cases, poisoning and checking outputs."""

    def __init__(self, judge: Judge, cases: list[SharedCase], mode: str) -> None:
        self.judge = judge
        self.cases = cases
        self.mode = mode
        self.turn = {side: 0 for side in SIDES}
        self.last: dict[str, tuple[SharedCase, int]] = {}  # each side's last sampled case, and its generation
        self.last_checked: dict[str, bool] = {}
        self.calls_per_sample = 1
        self.flusher = timing.L2Flusher(judge.job.get("l2_bytes")) if judge.device == "cuda" else None

    def capture_graphs(self) -> None:
        singles = []
        for side in SIDES:
            single = [self._timed(side, self.cases[0], graph=False) for _ in range(3)]
            singles.append(stats.median(single))
        # A graph of n in-place calls would apply the call n times to one restored input: one call per graph.
        mutating = any(case.mutates for case in self.cases)
        self.calls_per_sample = 1 if mutating else timing.calls_per_graph(min(singles))
        for side in SIDES:
            for case in self.cases:
                _guarded_request(self.judge.sides[side], {"op": "capture", "id": case.id, "n": self.calls_per_sample},
                                 f"{case.label}, {side} graph capture")

    def run(self, settings: Any, head_start: float) -> timing.PairTiming:
        gpu = self.judge.job.get("gpu") or {}
        clock, clock_check = (None, "off: CPU smoke run")
        if self.judge.device == "cuda":
            clock, clock_check = timing.ClockGuard.for_gpu(gpu.get("uuid"), gpu.get("sm_clock_max_mhz"))
        sides = (timing.SideSamples("baseline"), timing.SideSamples("candidate"))
        if self.mode == "smoke":
            settings = type(settings)(min_samples=timing.SMOKE_SAMPLES, min_time_s=0.0,
                                      max_samples=timing.SMOKE_SAMPLES, max_time_s=60.0, target_rse=0.5)
        reason = timing.sample_abba(sides, lambda s: self.measure(s.name), settings, clock)
        return timing.PairTiming(self.mode, self.calls_per_sample, sides[0], sides[1], reason, clock_check, head_start)

    def measure(self, side: str) -> float:
        case = self.cases[self.turn[side] % len(self.cases)]
        self.turn[side] += 1
        checked = self.judge.rng.random() < CHECK_FRACTION
        if checked and side == "candidate" and self.judge.refreshes < MAX_REFRESHES and self.judge.rng.random() < REFRESH_CHANCE:
            self.refresh(case)
        elapsed = self._timed(side, case) / self.calls_per_sample
        self.last[side], self.last_checked[side] = (case, case.generation), checked
        if checked:
            self.verify(side, case, "during timing")
        return elapsed

    def prime(self) -> None:
        """One untimed sample per side and case, so first-use costs (event creation, graph upload) stay out."""
        for side in SIDES:
            for case in self.cases:
                self._timed(side, case)

    def _timed(self, side: str, case: SharedCase, *, graph: bool | None = None) -> float:
        graph = self.mode == "graph" if graph is None else graph
        poison_outputs(case.outputs[side])
        case.restore(side)  # fresh copies of the mutated inputs, outside the timed window like the poison
        if self.flusher is not None:
            import torch

            self.flusher.flush()
            torch.cuda.synchronize()
        reply = self.judge.sides[side].request({"op": "sample", "id": case.id, "graph": graph})
        value = reply.get("us")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise SideFailed(f"{side} side sent a sample time that is not a positive number: {value!r}")
        persisting = reply.get("persisting_l2_bytes")
        if isinstance(persisting, int) and not isinstance(persisting, bool) and persisting > 0:
            raise Refused(Verdict(INCORRECT if side == "candidate" else ERROR,
                                  f"{side}: {floors.IMPLAUSIBLE_PREFIX.split(':')[0]}: it reserved {persisting} bytes "
                                  f"of persisting L2 (cudaLimitPersistingL2CacheSize): data kept in L2 across the "
                                  f"flush makes its timing a fiction", f"timing, {side}",
                                  {"kind": "persisting_l2", "bytes": persisting}))
        return float(value)

    def verify(self, side: str, case: SharedCase, when: str) -> None:
        """The outputs (and mutated inputs) of the sample just taken against the case's expected result."""
        self.judge.checked[side] += 1
        view = self.judge.view(case)
        status = INCORRECT if side == "candidate" else ERROR
        got_all, layout = case.results(side), case.results("baseline")
        for name, expected in case.expected.items():
            got = got_all[name]
            mismatch = compare_output(expected, got, layout[name], atol=view.atol, rtol=view.rtol, name=name)
            if mismatch is not None:
                where = f"{case.label}, {side} output {name!r} {when}"
                raise Refused(Verdict(status, f"{side} changed behaviour {when}: output {name!r} of a timed call is "
                                              f"wrong ({case.label}): {describe(mismatch)}", where,
                                      {"output": name, **mismatch}))

    def final_checks(self) -> None:
        """Each side's last timed call is always compared."""
        for side, (case, generation) in self.last.items():
            # (a refresh after a side's last sample left outputs of the old inputs: nothing to compare them with)
            if not self.last_checked.get(side) and generation == case.generation:
                self.verify(side, case, "during timing (last sample)")

    def refresh(self, case: SharedCase) -> None:
        """New secret-seeded inputs written into the case's tensors in place: a cache keyed by address goes stale."""
        judge = self.judge
        seed = derive_seed(judge.secret, judge.workload.id, "refresh", judge.refreshes)
        fresh = _guarded_make_case(judge.adapter, judge.params, judge.device, seed, f"{case.label}, refresh")
        same_layout = all(
            (not _is_tensor(v) and v == fresh.inputs.get(name)) or
            (_is_tensor(v) and _is_tensor(fresh.inputs.get(name)) and tuple(v.shape) == tuple(fresh.inputs[name].shape)
             and v.dtype == fresh.inputs[name].dtype)
            for name, v in case.case.inputs.items())
        if not same_layout:
            return
        judge.refreshes += 1
        case.generation += 1
        judge.seeds["refresh"].append(seed)
        for name, value in fresh.inputs.items():
            if _is_tensor(value):
                case.pristine[name].copy_(value)
                for side in SIDES:
                    case.inputs[side][name].copy_(value)
        view = judge.view(case)
        if callable(getattr(judge.adapter, "reference", None)):
            expected = judge.adapter.reference(judge.params, reference_inputs(case.inputs["baseline"], case.pristine))
            case.expected = {name: expected[name].detach().clone() for name in case.results("baseline")}
        else:
            from .correctness import run_side

            case.restore("baseline")
            run_side(view, "baseline", judge.device)
            case.expected = {name: t.detach().clone() for name, t in case.results("baseline").items()}
        if judge.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self.verify_expected_finite(case)

    def verify_expected_finite(self, case: SharedCase) -> None:
        from .correctness import _non_finite

        for name, value in case.expected.items():
            bad = _non_finite(value)
            if bad is not None:
                raise Refused(Verdict(ERROR, f"the reference for refreshed {case.label} is not finite: {bad['detail']}",
                                      f"{case.label}, refresh", {"output": name, **bad}))


_STARTED = __import__("time").monotonic()


def _log(what: str) -> None:
    """A line in the row's log with the seconds since the judge started: where a row's time went."""
    print(f"judge +{__import__('time').monotonic() - _STARTED:.2f} s: {what}", file=sys.stderr, flush=True)


def _is_tensor(value: Any) -> bool:
    import torch

    return torch.is_tensor(value)


def _guarded_make_case(adapter: Any, params: dict[str, Any], device: str, seed: int, label: str) -> Any:
    from .correctness import _guarded

    return _guarded(f"{label}, make_case", lambda: adapter.make_case(params, device=device, seed=seed))


def _guarded_request(process: SideProcess, command: dict[str, Any], where: str,
                     fds: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
    from .correctness import _guarded

    return _guarded(where, lambda: process.request(command, fds))


def _implausible(side: str, reason: str, result: dict[str, Any]) -> dict[str, Any]:
    """A candidate under a floor or off the current stream fails its row; a baseline doing it voids the row."""
    return {**result, "status": INCORRECT if side == "candidate" else ERROR, "implausible": f"{side}: {reason}",
            "message": f"{side}: {reason}", "where": f"timing, {side}"}


# --------------------------------------------------------------------------------------------- entry point


def run_row(job: dict[str, Any], secret: bytes, announce_ready: Any) -> dict[str, Any]:
    judge = Judge(job, secret, announce_ready)
    try:
        return judge.run()
    finally:
        judge.stop()


def write_line(fd: int, value: dict[str, Any]) -> None:
    data = (json.dumps(value, default=str) + "\n").encode()
    while data:
        written = os.write(fd, data)
        data = data[written:]


def main(argv: list[str]) -> int:
    guard.make_undumpable()
    guard.safe_sys_path()
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.judge")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--run-dir", help="the run folder (for people reading `ps`; the job comes on stdin)")
    args = parser.parse_args(argv)
    message = json.loads(sys.stdin.readline())
    sys.stdin.close()
    job, secret = message["job"], bytes.fromhex(message["secret"])
    try:
        result = run_row(job, secret, lambda: write_line(args.result_fd, {"ready": True}))
    except Exception as exc:  # noqa: BLE001 - the runner gets a result it can show, never just a dead process
        result = {"status": ERROR, "message": f"judge: {type(exc).__name__}: {exc}", "where": "judge",
                  "traceback": traceback.format_exc()}
    write_line(args.result_fd, {"result": result})
    os.close(args.result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
