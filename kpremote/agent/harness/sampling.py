"""The timed loop of one row: ABBA over the two side processes, rotating over the timing cases, with the outputs
poisoned before every sample and a random fraction of the samples (and each side's last) checked against the
expected result; now and then a case's inputs are rewritten in place with fresh secret-seeded values.

The judge (judge.py) drives it; the sampling order, the stopping rules and the clock guard are timing.py's, the
L2 flush before every sample runs here in the judge's process.
"""

from __future__ import annotations

import math
import time
from typing import Any

from . import floors, guard, regimes, stats, timing
from .cases import SharedCase, allocation_order, derive_seed, make_case_guarded
from .comparison import compare_output, describe
from .correctness import ERROR, INCORRECT, Refused, SideFailed, Verdict, poison_outputs, reference_inputs
from .rowjudge import RowJudge
from .sideprocess import request_guarded
from .smclock import ClockGuard
from ..task.taskspec import SIDES

CHECK_FRACTION = 0.25  # samples whose outputs are compared afterwards (plus each side's last one)
MAX_REFRESHES = 2  # times a case's inputs are rewritten in place (same addresses) before a checked sample
REFRESH_CHANCE = 0.5  # of a checked candidate sample, while refreshes are left
LATE_TRIES = 4  # late samples in a row at the longest head start: the side's calls wait on the host
HEAD_START_GROWTH = 1.5  # after a late sample, both sides' head start grows by this factor at least (to the cap)
MAX_TAKES = 24  # one sample's takes at most: the head start reaches its cap from 20 us in 12 growths


class Sampler:
    """The timed loop: ABBA over the sides, rotating over the timing cases, poisoning and checking outputs."""

    def __init__(self, judge: RowJudge, cases: list[SharedCase], mode: str, head_start_us: float = 0.0,
                 regime: str = regimes.COLD) -> None:
        self.judge = judge
        self.cases = cases
        self.mode = mode
        self.regime = regime  # cold (every row), or warm / context (a row with a context: regimes.py)
        self.head_start_us = head_start_us
        self.late = {side: 0 for side in SIDES}  # samples taken again: the window opened before the call was queued
        self.host_bound: set[str] = set()  # sides whose calls wait on the host: their late samples are kept
        self.turn = {side: 0 for side in SIDES}
        self.last: dict[str, tuple[SharedCase, int]] = {}  # each side's last sampled case, and its generation
        self.last_checked: dict[str, bool] = {}
        self.calls_per_sample = 1
        self.idle_cpu_s = {side: 0.0 for side in SIDES}  # each side's CPU time while the other's samples were taken
        self.idle_s = {side: 0.0 for side in SIDES}  # the wall time of those samples
        self.flusher = timing.L2Flusher(judge.job.get("l2_bytes")) if judge.device == "cuda" else None

    def first_in_turn(self) -> tuple[str, ...]:
        """The sides in the order the active process pair takes them where they allocate memory (its graphs, its
        first samples): alternating from one pair to the next (cases.allocation_order)."""
        return allocation_order(self.judge.bench.active)

    def prepare(self) -> None:
        """What the regime needs before its first sample: graph mode's graphs of N calls (cold), the context's graph
        of before -> call -> after per case (context, on a GPU)."""
        if self.regime == regimes.COLD and self.mode == "graph":
            self.capture_graphs()
        elif self.regime == regimes.CONTEXT and self.judge.device == "cuda":
            for side in self.first_in_turn():
                for case in self.cases:
                    request_guarded(self.judge.sides[side], {"op": "capture_context", "id": case.id},
                                    f"{case.label}, {side} context graph capture")

    def capture_graphs(self) -> None:
        singles = []
        for side in self.first_in_turn():
            single = [self._timed(side, self.cases[0], graph=False) for _ in range(3)]
            singles.append(stats.median(single))
        # A graph of n in-place calls would apply the call n times to one restored input: one call per graph.
        mutating = any(case.mutates for case in self.cases)
        self.calls_per_sample = 1 if mutating else timing.calls_per_graph(min(singles))
        for side in self.first_in_turn():
            for case in self.cases:
                request_guarded(self.judge.sides[side], {"op": "capture", "id": case.id, "n": self.calls_per_sample},
                                 f"{case.label}, {side} graph capture")

    def run(self, settings: Any) -> timing.PairTiming:
        gpu = self.judge.job.get("gpu") or {}
        clock, clock_check = (None, "off: CPU smoke run")
        if self.judge.device == "cuda":
            clock, clock_check = ClockGuard.for_gpu(gpu.get("uuid"), gpu.get("sm_clock_max_mhz"))
        sides = (timing.SideSamples("baseline"), timing.SideSamples("candidate"))
        if self.mode == "smoke":
            settings = type(settings)(min_samples=timing.SMOKE_SAMPLES, min_time_s=0.0,
                                      max_samples=timing.SMOKE_SAMPLES, max_time_s=60.0, target_rse=0.5)
        reason = timing.sample_abba(sides, lambda s: self.measure(s.name), settings, clock)
        for side in sides:
            side.late, side.host_bound = self.late[side.name], side.name in self.host_bound
        mode = self.mode if self.regime == regimes.COLD else self.regime
        return timing.PairTiming(mode, self.calls_per_sample, sides[0], sides[1], reason, clock_check,
                                 self.head_start_us)

    def measure(self, side: str) -> float:
        case = self.cases[self.turn[side] % len(self.cases)]
        self.turn[side] += 1
        checked = self.judge.rng.random() < CHECK_FRACTION
        if self.regime != regimes.COLD:
            if checked and side == "candidate" and self.judge.regime_refreshes.get(self.regime, 0) < \
                    regimes.MAX_REFRESHES and self.judge.rng.random() < REFRESH_CHANCE:
                regimes.refresh(self.judge, case, self.regime)
        elif checked and side == "candidate" and self.judge.refreshes < MAX_REFRESHES and self.judge.rng.random() < REFRESH_CHANCE:
            self.refresh(case)
        elapsed = self._timed(side, case) / self.calls_per_sample
        self.last[side], self.last_checked[side] = (case, case.generation), checked
        if checked:
            self.verify(side, case, "during timing")
        return elapsed

    def prime(self) -> None:
        """One untimed sample per side and case, so first-use costs (event creation, graph upload) stay out; one
        that came late (a first launch loading its module) is not taken again and does not lengthen the head start."""
        for side in self.first_in_turn():
            for case in self.cases:
                self._timed_once(side, case, graph=None)

    def _timed(self, side: str, case: SharedCase, *, graph: bool | None = None) -> float:
        """One sample's time. A sample whose window opened while its side was still queueing the call (its head
        start ran out: host time would be in it) is dropped, counted, and taken again with a longer head start.
        A candidate late LATE_TRIES times in a row at the longest head start waits on the host by itself (a host
        sync in its call): its samples are kept as they come, host time and all, which only makes it slower. The
        baseline's are not: a slow baseline would flatter the candidate, so the row ends instead."""
        in_a_row = at_cap = 0
        for _ in range(MAX_TAKES):
            value, late_host_us = self._timed_once(side, case, graph=graph)
            if late_host_us is None or side in self.host_bound:
                return value
            in_a_row += 1
            at_cap += int(self.head_start_us >= timing.HEAD_START_MAX_US)
            if at_cap >= LATE_TRIES and side == "candidate":
                self.host_bound.add(side)
                return value
            self.late[side] += 1
            if at_cap >= LATE_TRIES:
                break
            self._lengthen_head_start(late_host_us)
        raise Refused(Verdict(ERROR, f"{side}: {in_a_row} samples in a row opened their window before the side had "
                                     f"queued the call, the last with a head start of {self.head_start_us:.0f} us: "
                                     f"their times would hold host time, not the kernel's (does the {side} wait on "
                                     f"the host in its call, or is this host busy?)", f"timing, {side}",
                              {"kind": "late_launch", "head_start_us": round(self.head_start_us, 2)}))

    def _lengthen_head_start(self, host_us: float) -> None:
        """At least HEAD_START_GROWTH x, and enough for the host time the late sample's side took to queue it."""
        wanted = max(self.head_start_us * HEAD_START_GROWTH, timing.head_start_us(host_us))
        longer = min(timing.HEAD_START_MAX_US, wanted)
        if longer > self.head_start_us:
            self.head_start_us = longer
            for side in SIDES:  # both sides alike: the head start is outside the window, but keep them symmetric
                request_guarded(self.judge.sides[side], {"op": "head_start", "us": longer},
                                f"timing, {side} head start")

    def _timed_once(self, side: str, case: SharedCase, *, graph: bool | None) -> tuple[float, float | None]:
        """The sample's time, and None or, when its window opened too early, the host time its side took to queue."""
        graph = (self.mode == "graph" and self.regime == regimes.COLD) if graph is None else graph
        poison_outputs(case.outputs[side])
        case.restore(side)  # fresh copies of the mutated inputs, outside the timed window like the poison
        if self.regime != regimes.COLD:
            regimes.poison(case, side, self.regime)  # what before() (and after()) write: a side that skips it fails
        if self.flusher is not None:
            import torch

            self.flusher.flush()
            torch.cuda.synchronize()
        idle = next(other for other in SIDES if other != side)
        idle_from, wall_from = self._cpu_of_every_process(idle), time.perf_counter()  # this sample's alone
        command = {"op": "sample", "id": case.id, "graph": graph}
        if self.regime != regimes.COLD:
            command["regime"] = self.regime
        reply = self.judge.sides[side].request(command)
        idle_to, wall_to = self._cpu_of_every_process(idle), time.perf_counter()
        if idle_from is not None and idle_to is not None:
            self.idle_cpu_s[idle] += idle_to - idle_from
            self.idle_s[idle] += wall_to - wall_from
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
        if reply.get("late") is not True:
            return float(value), None
        host_us = reply.get("host_us")
        finite = isinstance(host_us, (int, float)) and not isinstance(host_us, bool) and math.isfinite(host_us)
        return float(value), float(host_us) if finite and host_us > 0 else 0.0

    def _cpu_of_every_process(self, side: str) -> float | None:
        """CPU time of every process of a side, in every process pair (an idle pair's spins beside the timed one
        too); None where one cannot be read (gone: that sample is not counted)."""
        readings = [guard.cpu_s(pid) for pid in self.judge.pids_of(side)]
        return None if None in readings else sum(readings)

    def verify(self, side: str, case: SharedCase, when: str) -> None:
        """The outputs (and mutated inputs) of the sample just taken against the case's expected result; in a
        context regime, what regimes.check_sample checks."""
        self.judge.checked[side] += 1
        if self.regime != regimes.COLD:
            regimes.check_sample(self.judge, case, side, self.regime, when)
            return
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
        fresh = make_case_guarded(judge.adapter, judge.params, judge.device, seed, f"{case.label}, refresh")
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
        from .comparison import non_finite as _non_finite

        for name, value in case.expected.items():
            bad = _non_finite(value)
            if bad is not None:
                raise Refused(Verdict(ERROR, f"the reference for refreshed {case.label} is not finite: {bad['detail']}",
                                      f"{case.label}, refresh", {"output": name, **bad}))


def _is_tensor(value: Any) -> bool:
    import torch

    return torch.is_tensor(value)
