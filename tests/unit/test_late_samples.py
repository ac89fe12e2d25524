"""A sample whose window opened before its side had queued the call (the head start ran out, so host time is in
it) is dropped, counted, and taken again with a head start long enough for both sides. Four in a row at the longest
head start mean the side waits on the host by itself: a candidate keeps its samples, host time and all (it only
makes itself slower); a baseline ends the row (a slow baseline would flatter the candidate).
The judge's end of it (sampling.Sampler._timed) against scripted side replies; the side's end, which reads the
start event after queueing the call, is tests/agent/test_trust_gpu.py's (a GPU only)."""

from __future__ import annotations

import types

import pytest

from kpremote.agent.harness import sampling, timing
from kpremote.agent.harness.correctness import ERROR, Refused
from kpremote.agent.task.taskspec import SIDES


class ScriptedSide:
    """Answers 'sample' from a script, everything else with ok; keeps every command it got."""

    pid = 1 << 23  # above any pid_max: no process, so no CPU to read while the other side is timed

    def __init__(self, samples: list[dict]) -> None:
        self.samples = list(samples)
        self.commands: list[dict] = []

    def request(self, command: dict, fds: tuple = ()) -> dict:
        self.commands.append(command)
        return self.samples.pop(0) if command["op"] == "sample" else {"ok": True}

    def head_starts(self) -> list[float]:
        return [c["us"] for c in self.commands if c["op"] == "head_start"]


class OneCase:
    id = 0
    mutates = ()
    outputs: dict = {side: {} for side in SIDES}

    def restore(self, side: str) -> None:
        pass


class Judge:
    device = "cpu"
    job: dict = {}
    bench = types.SimpleNamespace(active=0)  # the first process pair: the baseline takes its turn first

    def __init__(self, candidate_samples: list[dict]) -> None:
        self.sides = {"baseline": ScriptedSide([]), "candidate": ScriptedSide(candidate_samples)}

    def pids_of(self, side: str) -> list[int]:
        return [self.sides[side].pid]


def sampler_for(candidate_samples: list[dict], head_start_us: float = 100.0) -> sampling.Sampler:
    return sampling.Sampler(Judge(candidate_samples), [OneCase()], "cold", head_start_us)


def test_a_late_sample_is_taken_again_with_a_head_start_that_covers_its_host_time() -> None:
    sampler = sampler_for([{"ok": True, "us": 480.0, "late": True, "host_us": 400.0}, {"ok": True, "us": 5.0}])
    assert sampler._timed("candidate", OneCase()) == 5.0
    assert sampler.late == {"baseline": 0, "candidate": 1}
    assert sampler.head_start_us == timing.head_start_us(400.0) == 820.0
    for side in SIDES:  # both sides get it: what the windows are preceded by stays the same for both
        assert sampler.judge.sides[side].head_starts() == [820.0]


def test_a_late_flag_without_a_usable_host_time_still_grows_the_head_start() -> None:
    sampler = sampler_for([{"ok": True, "us": 50.0, "late": True, "host_us": "soon"}, {"ok": True, "us": 5.0}])
    assert sampler._timed("candidate", OneCase()) == 5.0
    assert sampler.head_start_us == 100.0 * sampling.HEAD_START_GROWTH


def test_an_on_time_sample_changes_nothing() -> None:
    sampler = sampler_for([{"ok": True, "us": 5.0, "late": False, "host_us": 30.0}])
    assert sampler._timed("candidate", OneCase()) == 5.0
    assert sampler.late["candidate"] == 0 and sampler.head_start_us == 100.0
    assert sampler.judge.sides["baseline"].head_starts() == []


LATE = {"ok": True, "us": 9000.0, "late": True, "host_us": 1e6}


def test_a_candidate_late_four_times_in_a_row_at_the_longest_head_start_keeps_its_samples() -> None:
    sampler = sampler_for([dict(LATE, us=9000.0 + n) for n in range(sampling.LATE_TRIES + 2)])
    # the first grows the head start to its cap, three more at the cap are dropped, the fourth there is kept
    assert sampler._timed("candidate", OneCase()) == 9000.0 + sampling.LATE_TRIES
    assert sampler.late["candidate"] == sampling.LATE_TRIES and sampler.host_bound == {"candidate"}
    assert sampler.head_start_us == timing.HEAD_START_MAX_US
    assert sampler.judge.sides["candidate"].head_starts() == [timing.HEAD_START_MAX_US]  # sent once, not again
    assert sampler._timed("candidate", OneCase()) == 9000.0 + sampling.LATE_TRIES + 1  # from now on: as it comes
    assert sampler.late["candidate"] == sampling.LATE_TRIES


def test_late_samples_before_the_head_start_reaches_its_cap_are_all_taken_again() -> None:
    # A host time too short to need the cap grows the head start 1.5x a time: the side is called host-bound only
    # once even the longest head start could not keep its call's queueing out of the window.
    small = {"ok": True, "us": 50.0, "late": True, "host_us": 10.0}
    sampler = sampler_for([small] * sampling.MAX_TAKES)
    sampler._timed("candidate", OneCase())
    growths = sampler.judge.sides["candidate"].head_starts()
    assert growths[0] == 150.0 and growths[-1] == timing.HEAD_START_MAX_US and len(growths) == 8
    assert sampler.late["candidate"] == len(growths) + sampling.LATE_TRIES - 1  # the last at the cap is kept
    assert sampler.host_bound == {"candidate"}


def test_a_baseline_late_four_times_in_a_row_at_the_longest_head_start_ends_the_row() -> None:
    sampler = sampler_for([])
    sampler.judge.sides["baseline"].samples = [dict(LATE)] * (sampling.LATE_TRIES + 1)
    with pytest.raises(Refused) as refused:
        sampler._timed("baseline", OneCase())
    verdict = refused.value.verdict
    assert verdict.status == ERROR and "baseline: 5 samples in a row opened their window" in verdict.message
    assert "head start of 2000 us" in verdict.message and "wait on the host in its call" in verdict.message
    assert sampler.late["baseline"] == sampling.LATE_TRIES + 1 and not sampler.host_bound


def test_a_host_bound_candidate_is_said_in_its_timing() -> None:
    sides = (timing.SideSamples("baseline", times_us=[5.0]), timing.SideSamples("candidate", times_us=[9.0],
                                                                                host_bound=True))
    pair = timing.PairTiming("cold", 1, *sides, "converged", "off")
    assert pair.to_json()["candidate"]["host_bound"] is True and pair.to_json()["baseline"]["host_bound"] is False


def test_priming_takes_a_late_first_sample_as_it_comes() -> None:
    # A process's first sample may be late for one-off reasons (a module loaded on first launch): priming keeps
    # nothing, so it neither takes it again nor lets it lengthen every later sample's head start.
    judge = Judge([{"ok": True, "us": 400.0, "late": True, "host_us": 900.0}])
    judge.sides["baseline"].samples = [{"ok": True, "us": 5.0}]
    sampler = sampling.Sampler(judge, [OneCase()], "cold", 100.0)
    sampler.prime()
    assert sampler.head_start_us == 100.0 and sampler.late == {"baseline": 0, "candidate": 0}
    assert [c["op"] for c in judge.sides["candidate"].commands] == ["sample"]
