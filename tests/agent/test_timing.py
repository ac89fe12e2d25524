"""timing: the sampling loop's order and stopping rules, the SM-clock guard, graph sizing, the head start.

The CUDA paths (events, L2 flush, graphs, stream checks) need a GPU: they are exercised by the GPU truth runs
(benchmarks/README.md). Everything here is the logic around them.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import pytest

from kpremote.agent.harness import streamcheck, timing
from kpremote.agent.harness.smclock import ClockGuard
from kpremote.agent.task.taskspec import TimingSettings


def sides() -> tuple[timing.SideSamples, timing.SideSamples]:
    return timing.SideSamples("baseline", lambda: None), timing.SideSamples("candidate", lambda: None)


def test_samples_alternate_abba_and_stop_once_both_sides_converge() -> None:
    order: list[str] = []

    def measure(side: timing.SideSamples) -> float:
        order.append(side.name[0])
        return 10.0 if side.name == "baseline" else 5.0

    pair = sides()
    reason = timing.sample_abba(pair, measure, TimingSettings(min_samples=10, min_time_s=0.0))
    assert reason == "converged"
    assert "".join(order[:8]) == "bccbbccb"
    assert len(pair[0].times_us) == len(pair[1].times_us) == 10


def test_noisy_samples_run_to_the_sample_cap() -> None:
    rng = random.Random(0)
    pair = sides()
    settings = TimingSettings(min_samples=10, min_time_s=0.0, target_rse=1e-6, max_samples=40)
    assert timing.sample_abba(pair, lambda side: rng.uniform(1, 100), settings) == "max_samples"
    assert len(pair[0].times_us) == 40


def test_minimum_time_per_side_is_honoured_then_the_time_cap_stops_it() -> None:
    def measure(side: timing.SideSamples) -> float:
        time.sleep(0.002)
        return 1.0

    pair = sides()
    reason = timing.sample_abba(pair, measure, TimingSettings(min_samples=2, min_time_s=0.05, max_time_s=10.0))
    assert reason == "converged" and all(side.wall_s >= 0.05 for side in pair)

    rng = random.Random(1)
    pair = sides()
    settings = TimingSettings(min_samples=2, min_time_s=0.0, max_time_s=0.05, target_rse=1e-9, max_samples=10**6)
    assert timing.sample_abba(pair, lambda s: measure(s) * rng.uniform(1, 9), settings) == "max_time_s"


def test_samples_taken_while_the_sm_clock_sagged_are_dropped_and_counted() -> None:
    # Two readings per sample (before, after); every third sample sees 1000 MHz of a 1980 MHz maximum.
    readings = itertools.cycle([1980, 1980, 1980, 1980, 1000, 1980])
    guard = ClockGuard(lambda: next(readings), max_mhz=1980)
    values = itertools.count(1)
    pair = sides()
    settings = TimingSettings(min_samples=12, min_time_s=0.0, target_rse=10.0)
    timing.sample_abba(pair, lambda side: float(next(values)), settings, guard)
    dropped = pair[0].dropped_clock + pair[1].dropped_clock
    kept = len(pair[0].times_us) + len(pair[1].times_us)
    assert dropped > 0 and dropped * 2 == kept  # one sample in three dropped
    kept_values = set(pair[0].times_us + pair[1].times_us)
    assert 3.0 not in kept_values and 6.0 not in kept_values and 1.0 in kept_values


def test_clock_guard_uses_the_nvml_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ClockGuard.for_gpu(None, None) == (None, "unavailable: GPU UUID unknown")
    fixture = tmp_path / "nvml.json"
    gpu = {"index": 0, "uuid": "GPU-x", "name": "H200", "cc": [9, 0], "memory_used_mib": 0, "memory_total_mib": 1,
           "sm_clock_mhz": 1400, "sm_clock_max_mhz": 1980}
    fixture.write_text(json.dumps({"gpus": [gpu]}))
    monkeypatch.setenv("KPREMOTE_NVML_FIXTURE", str(fixture))
    guard, note = ClockGuard.for_gpu("GPU-x", None)
    assert guard is not None and guard.max_mhz == 1980 and note.startswith("on:")
    assert guard.read() == 1400 and guard.sagged(1400) is True and guard.sagged(1500, 1980) is False
    fixture.write_text(json.dumps({"gpus": [{**gpu, "sm_clock_mhz": None}]}))
    guard, note = ClockGuard.for_gpu("GPU-x", 1980)
    assert guard is None and "no SM clock" in note


@pytest.mark.parametrize(("single_us", "calls"), [(1.0, 1024), (3.0, 512), (0.1, 4096), (250.0, 4), (2000.0, 1)])
def test_graph_holds_enough_calls_for_about_a_millisecond(single_us: float, calls: int) -> None:
    assert timing.calls_per_graph(single_us) == calls


def test_head_start_is_twice_the_launch_time_and_capped() -> None:
    assert timing.head_start_us(10.0) == 40.0
    assert timing.head_start_us(10_000.0) == timing.HEAD_START_MAX_US


def test_a_cold_gpu_row_gets_four_pairs_and_anything_else_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(timing.SIDE_PAIRS_ENV, raising=False)
    assert timing.side_pairs("cuda", "cold") == timing.SIDE_PAIRS == 4
    assert timing.side_pairs("cuda", "graph") == 1 and timing.side_pairs("cpu", "cold") == 1
    monkeypatch.setenv(timing.SIDE_PAIRS_ENV, "2")
    assert timing.side_pairs("cpu", "smoke") == 2
    monkeypatch.setenv(timing.SIDE_PAIRS_ENV, "none")
    assert timing.side_pairs("cuda", "cold") == 4


def test_each_pair_gets_its_share_and_the_pooled_row_keeps_each_pairs_medians() -> None:
    settings = TimingSettings(min_time_s=0.5, max_time_s=20.0, max_samples=2000, target_rse=0.005)
    share = timing.share_of(settings, 4)
    assert (share.min_time_s, share.max_time_s, share.max_samples) == (0.125, 5.0, 500)
    assert share.target_rse == pytest.approx(0.01) and timing.share_of(settings, 1) is settings

    def pair(base: float, cand: float, n: int) -> timing.PairTiming:
        return timing.PairTiming("cold", 1, timing.SideSamples("baseline", times_us=[base] * n, late=1),
                                 timing.SideSamples("candidate", times_us=[cand] * n, dropped_clock=2), "converged", "on")

    row = timing.pooled([pair(5.0, 4.0, 3), pair(5.2, 4.1, 5)])
    assert row.baseline.times_us == [5.0] * 3 + [5.2] * 5 and row.baseline.late == 2 and row.candidate.dropped_clock == 4
    assert row.process_pairs == [{"baseline": 5.0, "candidate": 4.0, "n": 3}, {"baseline": 5.2, "candidate": 4.1, "n": 5}]
    assert row.to_json()["process_pairs"] == row.process_pairs
    single = pair(1.0, 1.0, 2)
    assert timing.pooled([single]) is single


def test_the_stream_check_fails_only_when_every_measurement_says_elsewhere() -> None:
    readings = iter([(80.5, 113.0), (80.0, 82.0)])  # one busy-host blip, then the stream and device agree
    assert streamcheck.off_stream_by_latency(lambda: next(readings)) is None
    always = streamcheck.off_stream_by_latency(lambda: (10.0, 2010.0))  # the work really runs on another stream
    assert always and always.startswith(streamcheck.OFF_STREAM) and always.count("10.0 / 2010.0 us") == streamcheck.STREAM_CHECK_TRIES
    assert streamcheck.off_stream_by_latency(lambda: (100.0, 110.0)) is None


def test_a_sides_statistics_are_computed_once_and_read_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from kpremote.agent.harness import stats

    made = []
    real = stats.summarize
    monkeypatch.setattr(stats, "summarize", lambda values: made.append(len(values)) or real(values))
    pair = timing.PairTiming("cold", 1, timing.SideSamples("baseline", times_us=[5.0, 5.2, 5.1]),
                             timing.SideSamples("candidate", times_us=[4.0, 4.1]), "converged", "on")
    first, again = pair.to_json(), pair.to_json()
    assert first == again and pair.speedup == pytest.approx(5.1 / 4.05)
    assert made == [3, 2]  # one summary a side, however often the row's numbers are read
    pair.candidate.times_us.append(4.2)  # new samples: a new summary
    assert pair.to_json()["candidate"]["n"] == 3 and made == [3, 2, 3]
    verdict = stats.row_verdict([5.0] * 20, [4.0] * 20, medians=(5.0, 2.5))
    assert verdict["speedup"] == 2.0  # the judge's medians, not recomputed
