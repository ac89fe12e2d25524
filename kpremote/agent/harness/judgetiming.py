"""The timing of a judge's row (Judge, judge.py), once its correctness gate passed: the row's process pairs timed
one after another (their samples pooled), each held to the physical floors and the stream check, retaken when only
starvation disturbed it; the row's verdict from the pooled samples; and a row with a context timed again in its warm
and context regimes (regimes.py)."""

from __future__ import annotations

import time
from typing import Any

from . import floors, guard, regimes, sampling, stats, timing
from .cases import SharedCase, allocation_order
from .correctness import ERROR, INCORRECT, Refused, Verdict, require_inputs_untouched
from ..task.taskspec import SIDES


class JudgeTiming:
    """Methods of Judge: they read its bench, spec, job, device, sides and cases, and keep what the row's timing
    found (idle CPU, seeds) on it."""

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
                      .get("host_us") for side in allocation_order(k)]
        head_start = timing.head_start_us(max(float(h or 0.0) for h in hosts)) if self.device == "cuda" else 0.0
        voids, retaken, threads = [], [], {"before": {}, "after": {}}
        pair, head_start = self._time_over_pairs(cases, mode, head_start, pairs, voids, threads, retaken)
        for case in cases:
            for side in SIDES:
                require_inputs_untouched(side, f"{case.label}, after timing", case.pristine, case.inputs[side],
                                         skip=case.mutates)
        medians = {side: getattr(pair, side).summary().median for side in SIDES}  # computed once, read everywhere
        result.update(
            timing=pair.to_json(),
            samples={side: getattr(pair, side).times_us for side in SIDES},
            gbps={side: floors.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
            verdict=self._verdict(pair, medians, pairs),  # a smoke row has no verdict
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
            pair, head_start = self._time_over_pairs(cases, mode, head_start, pairs, voids, threads, retaken,
                                                     regime=regime)
            medians = {side: getattr(pair, side).summary().median for side in SIDES}
            samples[regime] = {side: getattr(pair, side).times_us for side in SIDES}
            record[regime] = {
                "timing": pair.to_json(), "speedup": pair.speedup,
                "gbps": {side: floors.achieved_gbps(bytes_moved, medians[side]) for side in SIDES},
                "verdict": self._verdict(pair, medians, pairs, regime=regime),
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

    def _time_over_pairs(self, cases: list[SharedCase], mode: str, head_start: float, pairs: int, voids: list[str],
                         threads: dict[str, dict[str, Any]], retaken: list[str],
                         regime: str = regimes.COLD) -> tuple[timing.PairTiming, float]:
        """A regime's samples, each process pair's share in turn (pooled), and the head start they ended with."""
        timings = []
        prefix = "" if regime == regimes.COLD else f"_{regime}"
        try:
            for k in range(pairs):
                self.bench.active = k
                if self.device == "cuda":
                    for side in SIDES:
                        self.sides[side].request({"op": "head_start", "us": head_start})
                sampler = sampling.Sampler(self, cases, mode, head_start, regime=regime)
                timings.append(self._time_pair(sampler, timing.share_of(self.spec.timing, pairs), mode, voids,
                                               threads, suffix=prefix + ("" if k == 0 else f"_{k + 1}"),
                                               retaken=retaken))
                head_start = sampler.head_start_us
        finally:
            self.bench.active = 0
        return timing.pooled(timings), head_start

    def _verdict(self, pair: timing.PairTiming, medians: dict[str, float], pairs: int, *,
                 regime: str = regimes.COLD) -> dict[str, Any]:
        """A regime's verdict from its pooled samples, by the same rule as the row's (stats.row_verdict); a context
        regime's graph holds its neighbours' kernels too, each with its process's offset (its floor is wider), and
        the warm regime's inputs sit in the L2 as their placement lets them (stats.WARM_NOISE_FLOOR)."""
        return stats.row_verdict(pair.baseline.times_us, pair.candidate.times_us,
                                 medians=(medians["baseline"], medians["candidate"]),
                                 pair_medians=[(p["baseline"], p["candidate"]) for p in pair.process_pairs
                                               if p["baseline"] is not None and p["candidate"] is not None],
                                 process_floor_us=stats.process_floor_us(pairs, in_context=regime == regimes.CONTEXT)
                                 if self.device == "cuda" else 0.0, meaningful=self.device == "cuda",
                                 noise_floor=stats.WARM_NOISE_FLOOR if regime == regimes.WARM else stats.NOISE_FLOOR)

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


def _implausible(side: str, reason: str, result: dict[str, Any]) -> dict[str, Any]:
    """A candidate under a floor or off the current stream fails its row; a baseline doing it voids the row."""
    return {**result, "status": INCORRECT if side == "candidate" else ERROR, "implausible": f"{side}: {reason}",
            "message": f"{side}: {reason}", "where": f"timing, {side}"}
