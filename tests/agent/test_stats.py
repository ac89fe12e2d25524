"""stats: known values, and the bootstrap's properties (seeded, bracketing, degenerate cases)."""

from __future__ import annotations

import math
import random

import pytest

from kpremote.agent.harness import stats


def test_percentiles_interpolate_linearly_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert stats.percentile(values, 0.10) == pytest.approx(1.3)
    assert stats.percentile(values, 0.90) == pytest.approx(3.7)
    assert stats.percentile(values, 0.0) == 1.0
    assert stats.percentile(values, 1.0) == 4.0
    assert stats.median(values) == pytest.approx(2.5)
    assert stats.median([5.0, 1.0, 3.0]) == 3.0


def test_summary_has_the_known_moments() -> None:
    summary = stats.summarize([2, 4, 4, 4, 5, 5, 7, 9])
    assert summary.n == 8
    assert summary.mean == pytest.approx(5.0)
    assert summary.std == pytest.approx(math.sqrt(32 / 7))  # sample standard deviation
    assert summary.min == 2
    assert summary.median == pytest.approx(4.5)
    assert summary.p10 == pytest.approx(3.4)
    assert summary.p90 == pytest.approx(7.6)
    assert stats.std([3.0]) == 0.0


def test_relative_standard_error_of_the_median() -> None:
    values = [float(v) for v in range(1, 101)]
    sigma = (75.25 - 25.75) / 1.349
    assert stats.median_rse(values) == pytest.approx(1.2533 * sigma / 10 / 50.5)
    assert stats.median_rse([7.0] * 20) == 0.0
    assert stats.median_rse([7.0]) == math.inf


def test_one_outlier_barely_moves_the_standard_error() -> None:
    steady = [10.0 + 0.01 * (i % 5) for i in range(50)]
    assert stats.median_rse(steady + [1000.0]) < 2 * stats.median_rse(steady) + 1e-9


def test_speedup_and_geomean() -> None:
    assert stats.speedup(10.0, 5.0) == 2.0
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert stats.geomean([0.5, 2.0, 8.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        stats.speedup(10.0, 0.0)
    with pytest.raises(ValueError):
        stats.geomean([])


def test_bootstrap_of_identical_rows_is_a_point() -> None:
    low, high = stats.bootstrap_geomean_ci([1.5, 1.5, 1.5], seed=3, n_boot=500)
    assert low == pytest.approx(1.5) and high == pytest.approx(1.5)


def test_bootstrap_is_seeded_and_brackets_the_geomean() -> None:
    speedups = [0.9, 1.1, 1.4, 2.0, 1.2]
    first = stats.bootstrap_geomean_ci(speedups, seed=7, n_boot=2000)
    assert first == stats.bootstrap_geomean_ci(speedups, seed=7, n_boot=2000)
    assert first != stats.bootstrap_geomean_ci(speedups, seed=8, n_boot=2000)
    low, high = first
    assert min(speedups) <= low < stats.geomean(speedups) < high <= max(speedups)


def test_one_row_interval_reflects_its_measurement_noise() -> None:
    baseline = [10.0 + 0.1 * (i % 7) for i in range(60)]
    candidate = [5.0 + 0.3 * (i % 11) for i in range(60)]
    draws = stats.row_speedup_draws(baseline, candidate, seed=1, n_draws=200)
    low, high = stats.hierarchical_geomean_ci([draws], seed=0, n_boot=2000)
    point = stats.median(baseline) / stats.median(candidate)
    assert low < point < high
    assert high - low > 0.01  # a plain bootstrap over one row would give a zero-width interval


def test_row_draws_of_constant_samples_are_the_exact_ratio() -> None:
    assert set(stats.row_speedup_draws([2.0] * 10, [1.0] * 10, n_draws=20)) == {2.0}


def test_a_copy_of_the_baseline_is_same_never_a_win() -> None:
    rng = random.Random(3)
    baseline = [10.0 + rng.gauss(0, 0.2) for _ in range(300)]
    candidate = [10.0 + rng.gauss(0, 0.2) for _ in range(300)]
    assert stats.row_verdict(baseline, candidate)["verdict"] == stats.SAME
    drifted = [t * 0.995 for t in baseline]  # 0.5 % faster with a tight interval: inside the 1 % noise floor
    verdict = stats.row_verdict(baseline, drifted)
    assert verdict["low"] > 1.0 and verdict["verdict"] == stats.SAME


def test_clear_changes_are_faster_or_slower() -> None:
    rng = random.Random(4)
    baseline = [10.0 + rng.gauss(0, 0.2) for _ in range(300)]
    assert stats.row_verdict(baseline, [t * 0.8 for t in baseline])["verdict"] == stats.FASTER
    assert stats.row_verdict(baseline, [t * 1.25 for t in baseline])["verdict"] == stats.SLOWER


def test_a_smoke_rows_timings_have_no_verdict_however_clear() -> None:
    baseline = [10.0 + 0.01 * (i % 7) for i in range(40)]
    verdict = stats.row_verdict(baseline, [t * 1.6 for t in baseline], meaningful=False)
    assert verdict["verdict"] is None and verdict["speedup"] < 0.7 and verdict["high"] < 1.0  # the numbers stay


def test_a_wide_interval_is_same_even_off_one() -> None:
    assert stats.change_verdict(1.05, 0.97, 1.13) == stats.SAME  # holds 1.0
    assert stats.change_verdict(1.05, 1.001, 1.20) == stats.SAME  # change within the interval's half-width
    assert stats.change_verdict(1.05, 1.04, 1.06) == stats.FASTER


def test_medians_a_timer_tick_apart_are_the_same_however_tight_the_interval() -> None:
    # The H200 read a copy of the baseline as 0.974x (SLOWER) on a ~1.2 us row: every sample on one 32 ns tick.
    tick = 0.032
    baseline = [37 * tick] * 60 + [38 * tick] * 5
    candidate = [38 * tick] * 60 + [39 * tick] * 5
    verdict = stats.row_verdict(baseline, candidate)
    assert verdict["low"] == verdict["high"] or verdict["high"] - verdict["low"] < 0.01
    assert verdict["verdict"] == stats.SAME and abs(verdict["timer_quantum_us"] - tick) < 1e-6
    assert stats.row_verdict(baseline, [t + 10 * tick for t in baseline])["verdict"] == stats.SLOWER
    assert stats.row_verdict(baseline, [t * 0.7 for t in baseline])["verdict"] == stats.FASTER


def test_samples_that_are_not_quantized_keep_the_one_percent_floor() -> None:
    import random

    rng = random.Random(7)
    baseline = [10.0 + rng.random() * 0.01 for _ in range(200)]
    verdict = stats.row_verdict(baseline, [t * 0.95 for t in baseline])
    assert verdict["noise"] == stats.NOISE_FLOOR and verdict["verdict"] == stats.FASTER


def test_gpu_medians_closer_than_the_process_floor_are_the_same() -> None:
    # Two processes read one kernel up to ~PROCESS_FLOOR_US apart on the H200: not a win on a 4 us row, but the
    # same gap is still a win where the judge passes no floor (CPU rows), and a 30 % gain still counts.
    tick = 0.032
    baseline = [130 * tick] * 80 + [131 * tick] * 20  # 4.16 us
    candidate = [126 * tick] * 80 + [127 * tick] * 20  # 4 ticks (128 ns) faster: 3.2 %
    floor = stats.PROCESS_FLOOR_US
    assert stats.row_verdict(baseline, candidate, process_floor_us=floor)["verdict"] == stats.SAME
    assert stats.row_verdict(baseline, candidate)["verdict"] == stats.FASTER
    assert stats.row_verdict(baseline, [t * 0.7 for t in baseline], process_floor_us=floor)["verdict"] == stats.FASTER
    slower_by_a_floor = [t + 0.25 for t in baseline]  # 0.25 us slower: SLOWER on CPU, SAME on one pair's GPU row
    assert stats.row_verdict(baseline, slower_by_a_floor, process_floor_us=floor)["verdict"] == stats.SAME
    assert stats.row_verdict(baseline, slower_by_a_floor)["verdict"] == stats.SLOWER


def test_four_process_pairs_halve_the_floor() -> None:
    # Pooled over four pairs a row carries the mean of four processes' offsets: a 0.2 us change on a 4 us row (5 %)
    # is a change there, and inside one pair's floor.
    tick = 0.032
    baseline = [130 * tick] * 80 + [131 * tick] * 20  # 4.16 us
    slower = [t + 0.2 for t in baseline]
    assert stats.process_floor_us(4) == stats.PROCESS_FLOOR_US / 2
    assert stats.row_verdict(baseline, slower, process_floor_us=stats.process_floor_us(4))["verdict"] == stats.SLOWER
    assert stats.row_verdict(baseline, slower, process_floor_us=stats.process_floor_us(1))["verdict"] == stats.SAME


def test_a_context_graph_has_a_wider_floor_than_one_kernel() -> None:
    # The two-H200 host under 2.18: the dial's A/A row t384_ctx_aa3 in its context (a 14.5 us graph of the previous
    # op, the call and the next op) read SLOWER 0.988x with all four pairs the candidate's way (0.05-0.24 us), under
    # one kernel's floor. These are its four pairs' medians.
    baseline, candidate, pairs = _pooled([(14.56, 14.752, 52), (14.72, 14.816, 56), (14.64, 14.688, 58),
                                          (14.384, 14.624, 62)])
    medians = (14.56, 14.736)  # the judge's pooled medians of that row
    one_kernel = stats.row_verdict(baseline, candidate, medians=medians, pair_medians=pairs,
                                   process_floor_us=stats.process_floor_us(4))
    assert one_kernel["verdict"] == stats.SLOWER
    in_context = stats.process_floor_us(4, in_context=True)
    assert in_context == stats.process_floor_us(4) * stats.CONTEXT_FLOOR_FACTOR
    assert stats.row_verdict(baseline, candidate, medians=medians, pair_medians=pairs,
                             process_floor_us=in_context)["verdict"] == stats.SAME
    # fuse_scale_shift's qwen_s19 in its context on the same host: 0.8 us off a 50 us graph stays a change
    faster, _, _ = _pooled([(49.248, 0, 60)] * 4)
    slower_base, _, _ = _pooled([(50.064, 0, 60)] * 4)
    assert stats.row_verdict(slower_base, faster, pair_medians=[(50.064, 49.248)] * 4,
                             process_floor_us=in_context)["verdict"] == stats.FASTER


def _pooled(pairs: list[tuple[float, float, int]]) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Samples of a row timed by process pairs: each pair's sides read their median, +-1 timer tick, n times."""
    tick = 0.032
    baseline = [b + tick * (i % 3 - 1) for b, _, n in pairs for i in range(n)]
    candidate = [c + tick * (i % 3 - 1) for _, c, n in pairs for i in range(n)]
    return baseline, candidate, [(b, c) for b, c, _ in pairs]


def test_a_change_that_one_process_pair_makes_is_not_a_change() -> None:
    # The red team's plant_pyc_baseline row on the H200 under 2.13, an A/A row: one baseline process read 0.5 us above
    # the others and its pair held 76 of 188 samples, so the pooled samples alone called it FASTER 1.047x. These are
    # its four pairs' medians, the outlying pair given more of the samples so that the pooling alone reads FASTER here.
    baseline, candidate, pairs = _pooled([(5.664, 5.664, 20), (6.176, 5.472, 120), (5.472, 5.696, 30),
                                          (5.664, 5.728, 30)])
    floor = stats.process_floor_us(4)
    assert stats.row_verdict(baseline, candidate, process_floor_us=floor)["verdict"] == stats.FASTER
    verdict = stats.row_verdict(baseline, candidate, process_floor_us=floor, pair_medians=pairs)
    assert verdict["verdict"] == stats.SAME and (verdict["pairs_pointing"], verdict["pairs_needed"]) == (1, 3)
    assert verdict["held"] == "FASTER by the pooled samples, but 1 of 4 process pairs read it FASTER (3 needed)"
    # a real win (control_fast, same run) reads FASTER in every pair and stays FASTER
    baseline, candidate, pairs = _pooled([(5.328, 3.616, 30), (5.6, 3.536, 24), (5.36, 3.552, 18), (5.632, 3.488, 34)])
    won = stats.row_verdict(baseline, candidate, process_floor_us=floor, pair_medians=pairs)
    assert (won["verdict"], won["pairs_pointing"], "held" in won) == (stats.FASTER, 4, False)
    # three of four pairs are enough, either way; two are not
    baseline, candidate, pairs = _pooled([(4.0, 4.4, 50), (4.0, 4.4, 50), (4.0, 4.4, 50), (4.4, 4.0, 10)])
    slower = stats.row_verdict(baseline, candidate, process_floor_us=floor, pair_medians=pairs)
    assert (slower["verdict"], slower["pairs_pointing"]) == (stats.SLOWER, 3)
    baseline, candidate, pairs = _pooled([(4.0, 4.4, 80), (4.0, 4.4, 80), (4.4, 4.0, 10), (4.4, 4.0, 10)])
    split = stats.row_verdict(baseline, candidate, process_floor_us=floor, pair_medians=pairs)
    assert split["verdict"] == stats.SAME and split["held"].startswith("SLOWER by the pooled samples, but 2 of 4")
    # a SAME row and a row of one pair (graph mode) carry no agreement
    assert "pairs_pointing" not in stats.row_verdict(baseline, baseline, pair_medians=pairs)
    assert "pairs_pointing" not in stats.row_verdict(baseline, candidate, pair_medians=pairs[:1])
    assert [stats.pairs_needed(n) for n in (2, 3, 4, 8)] == [2, 3, 3, 6]
