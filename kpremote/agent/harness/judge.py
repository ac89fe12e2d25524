"""The trusted judge of a run's workload rows: correctness, timing and every number, with the candidate kept outside.

    python -m kpremote.agent.harness.judge --result-fd N      (the run's secret, then one job a row, as JSON lines on stdin)

The judge imports torch and the task's bench/adapter.py (trusted, pinned) but never a side's module, and never
calls adapter.bind. It starts one side process per side (side.py), each holding the adapter and only its own
module, and drives them over a socket: "here is case k", "call case k", "time a sample on case k". Every case
is built here by adapter.make_case with seeds derived from the run's secret (which no side sees); each side
gets its own copy of the inputs (CUDA IPC from a memory pool of its own, or memfd shared memory on the CPU)
and its own outputs. The judge poisons outputs before every call and every timed sample (and writes fresh
copies of the inputs a call mutates in place, which it then judges like outputs), compares them itself, recomputes every statistic, verdict and speedup from the raw sample times, and checks them against
physical floors. A side sends back only JSON: acknowledgements and raw times.

One judge and its two sides serve the rows of a run one after another (a Bench: the task, the adapter, the
sides); each row starts from nothing of the last one but those processes: its own secret-seeded cases, its own
log (the judge and both sides write to raw/workloads/<row>.log while it runs). The runner (judgeprocess.py)
keeps them only after a row that PASSED with nothing invalid; any other row ends them and the next row gets fresh
ones.

Its helpers, one job each: sideprocess.py (a side's process and the judge's end of its socket), cases.py (the
secret seeds, each case copied into memory each side may see), sampling.py (the timed loop with its checked
samples and refreshes), floors.py (the physical floors).

Results go to the runner through the inherited pipe N (per row a "ready" line once both sides are up, then the
result), never through a file a side could reach. The judge makes itself undumpable first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import floors, guard, numerics, regimes, sampling, stats, timing
from .rowlog import open_log, write_output_to
from ..sandbox import members, side_reads, side_scratch
from .cases import SharedCase, Sharing, derive_seed, make_case_guarded
from .channel import encode_values
from .correctness import (ERROR, INCORRECT, PASSED, CaseView, Refused, SideFailed, Verdict, check_case,
                          mutated_inputs, require_inputs_untouched)
from .sideprocess import SideProcess, request_guarded
from .sidestarter import SideStarter
from ..task.taskspec import SIDES, TaskSpec, Workload, load_task

TIMING_CASES_GPU = 4  # fresh cases at distinct addresses the timed samples rotate over
TIMING_CASES_CPU = 2  # the interpreter is slow: fewer on a smoke run, the same boundary


# --------------------------------------------------------------------------------------------- the row


class Bench:
    """What the rows of a run share: the task, its adapter, the memory each side may see, and the side processes."""

    def __init__(self, job: dict[str, Any], starter: SideStarter | None = None) -> None:
        self.starter = starter  # forks the side processes (sidestarter.py); None: each by exec
        self.spec: TaskSpec = load_task(Path(job["task_dir"]), timing_mode=job.get("mode"))
        self.device = "cuda" if job["device"].startswith("cuda") else "cpu"
        self.run_dir = Path(job.get("run_dir") or ".")
        self.modules = job.get("modules") or {}
        self.mode = self.spec.timing.mode if self.device == "cuda" else "smoke"
        self.pairs: list[dict[str, SideProcess]] = []  # one process per side, timing.side_pairs(...) times over
        self.active = 0  # the pair the row's commands go to now (pair 0: correctness and everything but timing)
        self.adapter: Any = None
        self.sharing: Sharing | None = None
        self.rows_started = 0  # rows these side processes have begun (1 for the first row they serve)
        self.sandbox: dict[str, str] = {}  # what each side process entered, in its own words

    @property
    def sides(self) -> dict[str, SideProcess]:
        """The active pair's side processes (empty before start and after stop)."""
        return self.pairs[self.active] if self.pairs else {}

    def every_process(self) -> list[SideProcess]:
        return [process for pair in self.pairs for process in pair.values()]

    def processes(self) -> dict[str, Any]:
        """Which processes ran the row, for the record: a pid shared by two rows is one process serving both.
        The first pair is named by side, the others by side and number (candidate_2, ...)."""
        named = {(side if k == 0 else f"{side}_{k + 1}"): process.pid
                 for k, pair in enumerate(self.pairs) for side, process in pair.items()}
        return {"judge": os.getpid(), **named, "row_of_these": self.rows_started}

    def start(self) -> dict[str, Any] | None:
        """Every pair's side processes up with their modules imported; None, or the row's ERROR."""
        if self.pairs:
            self.rows_started += 1
            return None
        self.rows_started = 1
        env = dict(os.environ)
        self.active = 0
        self.pairs = []
        try:
            for _ in range(timing.side_pairs(self.device, self.mode)):  # they import while we do
                self.pairs.append({side: SideProcess(side, {**env, **side_reads(self.run_dir, side, self.spec.root)},
                                                     self.run_dir, side_scratch(self.run_dir, side), self.starter)
                                   for side in SIDES})
        except SideFailed as exc:
            self.stop()
            return {"status": ERROR, "message": f"start: {exc.message}", "where": "import"}
        from ..task import build

        failed = self._import_all(build)
        if failed:
            self.stop()  # the next row tries afresh
        return failed

    def _import_all(self, build: Any) -> dict[str, Any] | None:
        try:
            self.adapter = build.import_adapter(self.spec)
        except Exception as exc:  # noqa: BLE001 - a task that does not import is this row's ERROR
            return {"status": ERROR, "message": f"import: bench/adapter.py: {type(exc).__name__}: {exc}",
                    "where": "import", "traceback": traceback.format_exc()}
        self.sharing = self.sharing or Sharing(self.device)
        sent = []
        try:  # every side imports its module at once: the start command to all, then the replies
            for process in self.every_process():
                process.send({"op": "start", "side": process.side, "task_dir": str(self.spec.root),
                              "device": self.device, "module_file": self.modules.get(process.side)})
                sent.append(process)
            for process in sent:
                reply = process.reply()
                self.sandbox[process.side] = str(reply.get("sandbox") or "unsandboxed: the side did not say")
        except SideFailed as exc:
            side = process.side
            return {"status": ERROR, "message": f"import: {side}: {exc.message}", "where": "import",
                    "traceback": exc.traceback_text}
        return None

    def stop(self) -> None:
        for process in self.every_process():
            process.stop()
        self.pairs = []
        self.active = 0

    def context(self, name: str) -> Any:
        """The contract.Context bench/context.py names `name` (regimes.load_context; ContextProblem if it cannot)."""
        return regimes.load_context(self.spec, name)


class Judge:
    """One row, start to end, with both sides in their own processes (the bench's)."""

    def __init__(self, bench: Bench, job: dict[str, Any], secret: bytes, announce_ready: Any) -> None:
        self.bench = bench
        self.job = job
        self.secret = secret
        self.announce_ready = announce_ready
        self.spec = bench.spec
        self.workload: Workload = next(w for w in self.spec.workloads if w.id == job["workload"])
        self.params = self.workload.params
        self.device = bench.device
        self.cases: dict[int, SharedCase] = {}
        self.next_id = 0
        self.seeds: dict[str, list[int]] = {"correctness": [], "timing": [], "refresh": []}
        self.rng = random.Random(secrets.randbits(64))
        self.checked = {side: 0 for side in SIDES}
        self.refreshes = 0
        self.largest: dict[str, float] = {}
        self.numerics = numerics.new_record(self.workload.contract)  # the row's contract, filled case by case
        self.idle_cpu_s = {side: 0.0 for side in SIDES}  # each side's CPU while the other's were timed (takes kept)
        self.take_idle_cpu_s: dict[str, float] = {}  # the same, of the last take only
        self.regime_refreshes: dict[str, int] = {}  # per context regime: its in-place refreshes of the state

    @property
    def sides(self) -> dict[str, SideProcess]:
        return self.bench.sides

    def pids_of(self, side: str) -> list[int]:
        """Every process of one side: one in each process pair."""
        return [pair[side].pid for pair in self.bench.pairs]

    @property
    def adapter(self) -> Any:
        return self.bench.adapter

    @property
    def sharing(self) -> Sharing:
        return self.bench.sharing

    # ---------------------------------------------------------------- start and stop

    def start(self) -> dict[str, Any] | None:
        """The bench's sides up, told this row's workload and log; None, or the row's ERROR."""
        failed = self.bench.start()
        if failed:
            return failed
        for process in self.bench.every_process():
            side = process.side
            log = open_log(self.job["log"]) if self.job.get("log") else None
            try:
                process.request({"op": "row", "workload": self.params}, [log] if log is not None else [])
            except SideFailed as exc:
                return {"status": ERROR, "message": f"{side}: {exc.message}", "where": "import",
                        "traceback": exc.traceback_text}
            finally:
                if log is not None:
                    os.close(log)
        self.announce_ready()
        return None

    def stop(self) -> None:
        for case in self.cases.values():
            case.close()
        self.cases = {}

    # ---------------------------------------------------------------- cases

    def new_case(self, label: str, seed: int) -> SharedCase:
        case = make_case_guarded(self.adapter, self.params, self.device, seed, label)
        mutates = mutated_inputs(self.workload.mutates, case, label)
        shared = self.sharing.share(case, self.next_id, label, seed)
        shared.mutates = mutates
        self.next_id += 1
        for process in self.bench.every_process():
            side = process.side
            fds: list[int] = []
            command = {"op": "case", "id": shared.id, "mutates": list(mutates),
                       "inputs": encode_values(shared.inputs[side], fds, shared.keep),
                       "outputs": encode_values(shared.outputs[side], fds, shared.keep)}
            request_guarded(process, command, f"{label}, handing the case to the {side}", fds)
        self.cases[shared.id] = shared
        return shared

    def drop_case(self, shared: SharedCase) -> None:
        for process in self.bench.every_process():
            request_guarded(process, {"op": "drop", "id": shared.id}, f"{shared.label}, drop")
        shared.close()
        self.cases.pop(shared.id, None)

    def view(self, shared: SharedCase) -> CaseView:
        case = shared.case
        atol = float(case.atol if self.workload.atol is None else self.workload.atol)
        rtol = float(case.rtol if self.workload.rtol is None else self.workload.rtol)

        def call(side: str) -> dict[str, Any] | None:
            return self.sides[side].request({"op": "call", "id": shared.id}).get("problem")

        return CaseView(shared.label, shared.inputs, shared.outputs, shared.pristine, call, atol, rtol, shared.mutates,
                        self.workload.contract)

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
                check_case(self.adapter, self.params, self.view(shared), device=self.device, largest=self.largest,
                           record=self.numerics)
                checked += 1
                self.drop_case(shared)
            for k in range(k_timing):
                seed = derive_seed(self.secret, self.workload.id, "timing", k)
                self.seeds["timing"].append(seed)
                shared = self.new_case(f"timing case {k} (seed {seed})", seed)
                shared.expected = check_case(self.adapter, self.params, self.view(shared), device=self.device,
                                             largest=self.largest, record=self.numerics)
                checked += 1
                timing_cases.append(shared)
        except Refused as refused:
            refused.verdict.seeds_checked = checked
            return refused.verdict, timing_cases
        return Verdict(PASSED, seeds_checked=checked, max_abs_err=self.largest,
                       numerics=self.numerics), timing_cases

    # ---------------------------------------------------------------- timing

    def time_row(self, cases: list[SharedCase]) -> dict[str, Any]:
        settings = self.spec.timing
        mode = settings.mode if self.device == "cuda" else "smoke"
        bytes_moved = self._bytes_moved(cases[0].case)
        result: dict[str, Any] = {"bytes_moved": bytes_moved, "flops": cases[0].case.flops, "implausible": None}
        pairs = len(self.bench.pairs) if mode != "graph" else 1
        if self.device == "cuda":
            if not bytes_moved:
                return {**result, "status": ERROR, "where": "timing",
                        "message": "bench/adapter.py gives no bytes_moved for this row: a GPU timing needs it for "
                                   "its physical floor (define bytes_moved(workload) or set Case.bytes_moved)"}
            for k in range(pairs):
                for side in ("candidate", "baseline"):
                    reason = self.bench.pairs[k][side].request({"op": "stream_check", "id": cases[0].id}).get("reason")
                    if reason:
                        return _implausible(side, str(reason), {**result, "timing": None})
        ids = [case.id for case in cases]
        hosts = []
        for k in range(pairs):  # the first pair warms the GPU up; the others only their own processes
            warmup_s = (settings.warmup_s if k == 0 else settings.warmup_s / pairs) if self.device == "cuda" else 0.0
            hosts += [self.bench.pairs[k][side].request({"op": "warm_up", "ids": ids, "seconds": warmup_s})
                      .get("host_us") for side in SIDES]
        head_start = timing.head_start_us(max(float(h or 0.0) for h in hosts)) if self.device == "cuda" else 0.0
        timings, voids, retaken, threads = [], [], [], {"before": {}, "after": {}}
        try:
            for k in range(pairs):
                self.bench.active = k
                if self.device == "cuda":
                    for side in SIDES:
                        self.sides[side].request({"op": "head_start", "us": head_start})
                sampler = sampling.Sampler(self, cases, mode, head_start)
                timings.append(self._time_pair(sampler, timing.share_of(settings, pairs), mode, voids, threads,
                                               suffix="" if k == 0 else f"_{k + 1}", retaken=retaken))
                head_start = sampler.head_start_us
        finally:
            self.bench.active = 0
        pair = timing.pooled(timings)
        for case in cases:
            for side in SIDES:
                require_inputs_untouched(side, f"{case.label}, after timing", case.pristine, case.inputs[side],
                                         skip=case.mutates)
        medians = {side: getattr(pair, side).summary().median for side in SIDES}  # computed once, read everywhere
        result.update(
            timing=pair.to_json(),
            samples={side: getattr(pair, side).times_us for side in SIDES},
            gbps={side: floors.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
            verdict=stats.row_verdict(pair.baseline.times_us, pair.candidate.times_us,
                                      medians=(medians["baseline"], medians["candidate"]),
                                      pair_medians=[(p["baseline"], p["candidate"]) for p in pair.process_pairs
                                                    if p["baseline"] is not None and p["candidate"] is not None],
                                      process_floor_us=stats.process_floor_us(pairs) if self.device == "cuda" else 0.0,
                                      meaningful=self.device == "cuda"),  # a smoke row has no verdict
            checks={"timing_cases": len(cases), "checked_samples": dict(self.checked), "refreshes": self.refreshes,
                    "check_fraction": sampling.CHECK_FRACTION, "memory_isolation": self.sharing.isolation,
                    "process_pairs": pairs, "retaken": retaken,
                    "idle_cpu_s": {side: round(used, 4) for side, used in self.idle_cpu_s.items()}},
            side_threads=threads,
        )
        if pair.candidate.host_bound:
            result["message"] = (f"the candidate's calls wait on the host: {sampling.LATE_TRIES} samples in a row "
                                 f"opened their window before it had queued the call, at a "
                                 f"{timing.HEAD_START_MAX_US:.0f} us head start; its times hold that host time")
        if voids:
            result["invalid"] = "; ".join(voids)
        if self.device == "cuda":
            floor = floors.floor_bandwidth(mode, bytes_moved, self.job.get("l2_bytes") or 0, self.job.get("copy_gbps"),
                                           self.job.get("l2_copy_gbps"))
            for side in ("candidate", "baseline"):
                reason = floors.floor_check(bytes_moved, medians[side], *floor)
                if reason:
                    return _implausible(side, reason, result)
        if self.workload.context is not None:
            return self._time_in_context(cases, result, head_start, pairs)
        return result

    def _time_in_context(self, cases: list[SharedCase], result: dict[str, Any], head_start: float,
                         pairs: int) -> dict[str, Any]:
        """The row's warm and context regimes (regimes.py), after its cold samples: each over the same process
        pairs, with its own samples, interval and verdict; result gains `regimes` (and their samples)."""
        try:
            context = self.bench.context(self.workload.context)
        except regimes.ContextProblem as problem:
            raise Refused(Verdict(ERROR, str(problem), "timing, bench/context.py", {"kind": "context"})) from None
        for index, case in enumerate(cases):
            regimes.prepare(self, case, context, index)
        settings = self.spec.timing
        mode = settings.mode if self.device == "cuda" else "smoke"
        voids: list[str] = []
        threads: dict[str, dict[str, Any]] = {"before": {}, "after": {}}
        retaken: list[str] = []
        record: dict[str, Any] = {"name": self.workload.context, "headline": regimes.HEADLINE_REGIME}
        samples: dict[str, dict[str, list[float]]] = {}
        bytes_moved = result.get("bytes_moved")
        for regime in regimes.CONTEXT_REGIMES:
            checked_before = dict(self.checked)
            timings = []
            try:
                for k in range(pairs):
                    self.bench.active = k
                    if self.device == "cuda":
                        for side in SIDES:
                            self.sides[side].request({"op": "head_start", "us": head_start})
                    sampler = sampling.Sampler(self, cases, mode, head_start, regime=regime)
                    timings.append(self._time_pair(sampler, timing.share_of(settings, pairs), mode, voids, threads,
                                                   suffix=f"_{regime}" + ("" if k == 0 else f"_{k + 1}"),
                                                   retaken=retaken))
                    head_start = sampler.head_start_us
            finally:
                self.bench.active = 0
            pair = timing.pooled(timings)
            medians = {side: getattr(pair, side).summary().median for side in SIDES}
            samples[regime] = {side: getattr(pair, side).times_us for side in SIDES}
            record[regime] = {
                "timing": pair.to_json(), "speedup": pair.speedup,
                "gbps": {side: floors.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
                "verdict": self._verdict(pair, medians, pairs, in_context=regime == regimes.CONTEXT),
                "checks": {"checked_samples": {side: self.checked[side] - checked_before[side] for side in SIDES},
                           "refreshes": self.regime_refreshes.get(regime, 0)}}
            if regime == regimes.WARM and self.device == "cuda":  # its inputs in the L2: held to the L2's copy rate
                floor = floors.floor_bandwidth("graph", bytes_moved or 0, self.job.get("l2_bytes") or 0,
                                               self.job.get("copy_gbps"), self.job.get("l2_copy_gbps"))
                for side in ("candidate", "baseline"):
                    reason = floors.floor_check(bytes_moved, medians[side], *floor)
                    if reason:
                        return _implausible(side, f"{regime} regime: {reason}", {**result, "regimes": record})
        for case in cases:
            for side in SIDES:
                require_inputs_untouched(side, f"{case.label}, after its context regimes", case.pristine,
                                         case.inputs[side], skip=(*case.mutates, *context.writes))
            regimes.check_inputs_after(case)
        result["regimes"] = record
        result["regime_samples"] = samples
        result["side_threads_in_context"] = threads
        result["checks"] = {**result["checks"], "retaken_in_context": retaken}
        if voids:
            result["invalid"] = "; ".join(filter(None, [result.get("invalid"), *voids]))
        return result

    def _verdict(self, pair: timing.PairTiming, medians: dict[str, float], pairs: int, *,
                 in_context: bool) -> dict[str, Any]:
        """A regime's verdict from its pooled samples, by the same rule as the row's (stats.row_verdict); a context
        regime's graph holds its neighbours' kernels too, each with its process's offset (its floor is wider)."""
        return stats.row_verdict(pair.baseline.times_us, pair.candidate.times_us,
                                 medians=(medians["baseline"], medians["candidate"]),
                                 pair_medians=[(p["baseline"], p["candidate"]) for p in pair.process_pairs
                                               if p["baseline"] is not None and p["candidate"] is not None],
                                 process_floor_us=stats.process_floor_us(pairs, in_context=in_context)
                                 if self.device == "cuda" else 0.0, meaningful=self.device == "cuda")

    def _time_pair(self, sampler: sampling.Sampler, settings: Any, mode: str, voids: list[str],
                   threads: dict[str, dict[str, Any]], suffix: str, retaken: list[str]) -> timing.PairTiming:
        """The active pair's share of the row's samples; what disturbed it goes to voids, its thread counts to
        threads (keyed side + suffix), a take dropped for starvation and timed again to retaken."""
        sampler.prepare()  # graph mode's graphs (cold), the context's graphs (context, on a GPU)
        # Counted before the first sample command: a side that recognises a timed call and starts a thread then
        # is seen, however early (the correctness calls and the warm-up have run every other code path).
        threads_before = {side: self.sides[side].threads() for side in SIDES}
        sampler.prime()
        pair, disturbed, dropped = guard.take_until_undisturbed(lambda: self._timed_take(sampler, settings))
        retaken += [f"{why}: timed again" for why in dropped]
        for side, used in self.take_idle_cpu_s.items():
            self.idle_cpu_s[side] += used
        threads_after = {side: self.sides[side].threads() for side in SIDES}
        sampler.final_checks()
        for side in SIDES:
            threads["before"][side + suffix] = threads_before[side]
            threads["after"][side + suffix] = threads_after[side]
        voids += [f"the {side} side started {threads_after[side] - threads_before[side]} thread(s) during timing"
                  for side in SIDES if (threads_after[side] or 0) > (threads_before[side] or 0)]
        voids += disturbed
        return pair

    def _timed_take(self, sampler: sampling.Sampler, settings: Any) -> tuple[timing.PairTiming, list[str]]:
        """One take of the active pair's samples, and what disturbed either side's schedule meanwhile."""
        schedules = {side: guard.schedule_of(self.sides[side].pid) for side in SIDES}
        idle_before, idle_s_before = dict(sampler.idle_cpu_s), dict(sampler.idle_s)
        timed_from = time.monotonic()
        pair = sampler.run(settings)
        timed_s = time.monotonic() - timed_from
        afterwards = {side: guard.schedule_of(self.sides[side].pid) for side in SIDES}
        self.take_idle_cpu_s = {side: sampler.idle_cpu_s[side] - idle_before[side] for side in SIDES}
        waits = {side: guard.waited_s(schedules[side], afterwards[side]) for side in SIDES}
        disturbed = [guard.interference(side, schedules[side], afterwards[side], timed_s,
                                        starvation=self.device == "cuda",
                                        other_waited_s=next(waits[o] for o in SIDES if o != side))
                     for side in SIDES]
        disturbed += [guard.idle_interference(side, next(o for o in SIDES if o != side), self.take_idle_cpu_s[side],
                                              sampler.idle_s[side] - idle_s_before[side]) for side in SIDES]
        return pair, [why for why in disturbed if why]

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
        _log(f"sides ready (row {self.bench.rows_started} of these processes)")
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
            result.pop("regime_samples", None)
        except SideFailed as exc:
            result.update(status=ERROR, message=f"timing: {exc.message}", where="timing", timing=None,
                          traceback=exc.traceback_text)
        except Exception as exc:  # noqa: BLE001
            result.update(status=ERROR, message=f"timing: {type(exc).__name__}: {exc}", where="timing", timing=None,
                          traceback=traceback.format_exc())
        result["seeds"] = self.seeds
        _log(f"timing: {result['status']}")
        return result


_ROW_STARTED = [__import__("time").monotonic()]


def _log(what: str) -> None:
    """A line in the row's log with the seconds since the row began: where a row's time went."""
    print(f"judge +{__import__('time').monotonic() - _ROW_STARTED[0]:.2f} s: {what}", file=sys.stderr, flush=True)


def _implausible(side: str, reason: str, result: dict[str, Any]) -> dict[str, Any]:
    """A candidate under a floor or off the current stream fails its row; a baseline doing it voids the row."""
    return {**result, "status": INCORRECT if side == "candidate" else ERROR, "implausible": f"{side}: {reason}",
            "message": f"{side}: {reason}", "where": f"timing, {side}"}


# --------------------------------------------------------------------------------------------- entry point


def run_row(bench: Bench, job: dict[str, Any], secret: bytes, announce_ready: Any) -> dict[str, Any]:
    judge = Judge(bench, job, secret, announce_ready)
    try:
        return judge.run()
    finally:
        judge.stop()


def _void_for_leftovers(result: dict[str, Any], leftovers: list[str]) -> None:
    """Processes a side started and left running past its row (a daemon, a helper that setsid away): killed, and
    the row's numbers void, whatever they were."""
    if leftovers:
        why = f"a side left {len(leftovers)} process(es) running past its row, killed: {', '.join(leftovers)}"
        result["invalid"] = "; ".join(filter(None, [result.get("invalid"), why]))


def _void_for_tampering(result: dict[str, Any], processes: list[SideProcess]) -> None:
    """A side whose process replaced the machinery that times and reports its samples (its seal broke: seal.py):
    whatever it reported of its times is void, and the row says what was replaced."""
    by_side: dict[str, list[str]] = {}
    for process in processes:
        for name in process.tampered:
            by_side.setdefault(process.side, [])
            if name not in by_side[process.side]:
                by_side[process.side].append(name)
    if not by_side or result.get("timing") is None:
        return
    why = "; ".join(f"the {side} side's process replaced what times and reports its samples ({', '.join(names)}): "
                    f"its times are void"
                    for side, names in sorted(by_side.items()))
    result["invalid"] = "; ".join(filter(None, [result.get("invalid"), why]))


def write_line(fd: int, value: dict[str, Any]) -> None:
    data = (json.dumps(value, default=str) + "\n").encode()
    while data:
        written = os.write(fd, data)
        data = data[written:]


def serve_rows(lines: Any, secret: bytes, result_fd: int, starter: SideStarter | None = None) -> None:
    """One row per job line, until stdin closes; the bench (and its sides) lives as long as the lines come."""
    bench: Bench | None = None
    ours = {starter.pid} if starter else set()  # the starter is the judge's own, never a row's leftover
    try:
        for line in lines:
            job = json.loads(line)["job"]
            write_output_to(job.get("log"))
            _ROW_STARTED[0] = __import__("time").monotonic()
            workload = job["workload"]
            try:
                bench = bench or Bench(job, starter)
                result = run_row(bench, job, secret, lambda: write_line(result_fd, {"ready": workload}))
                if bench.sides:
                    result["processes"] = bench.processes()
                    result["sandbox"] = dict(bench.sandbox)
                _void_for_leftovers(result, members.kill_leftovers({p.pid for p in bench.every_process()} | ours))
                _void_for_tampering(result, bench.every_process())
            except Exception as exc:  # noqa: BLE001 - the runner gets a result it can show, never a dead process
                result = {"status": ERROR, "message": f"judge: {type(exc).__name__}: {exc}", "where": "judge",
                          "traceback": traceback.format_exc()}
            write_line(result_fd, {"result": result, "workload": workload})
    finally:
        if bench is not None:
            bench.stop()


def main(argv: list[str]) -> int:
    guard.make_undumpable()
    guard.safe_sys_path()
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.harness.judge")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--run-dir", help="the run folder (for people reading `ps`; the jobs come on stdin)")
    args = parser.parse_args(argv)
    starter = SideStarter.fork()  # before the secret is read: the starter and its sides never hold it
    try:
        secret = bytes.fromhex(json.loads(sys.stdin.readline())["secret"])
        serve_rows(sys.stdin, secret, args.result_fd, starter)
    finally:
        if starter is not None:
            starter.stop()
    os.close(args.result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
