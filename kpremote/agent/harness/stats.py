"""Summary statistics for timing samples and speedups (standard library only).

Percentiles use linear interpolation between closest ranks (numpy's default), so p10/p90 agree with the
users' own timing template. The standard deviation is the sample one (n - 1).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Sequence

# sqrt(pi / 2): the asymptotic ratio of the median's standard error to the mean's, for normal samples.
MEDIAN_SE_FACTOR = 1.2533
# A normal distribution's sigma over its interquartile range; used to estimate sigma robustly.
IQR_TO_SIGMA = 1.0 / 1.349


@dataclass
class Summary:
    n: int
    median: float
    mean: float
    std: float
    min: float
    p10: float
    p90: float

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th quantile (0 <= q <= 1), linearly interpolated between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """Sample standard deviation; 0 for a single value."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (len(values) - 1))


def summarize(values: Sequence[float]) -> Summary:
    return Summary(
        n=len(values),
        median=median(values),
        mean=mean(values),
        std=std(values),
        min=min(values),
        p10=percentile(values, 0.10),
        p90=percentile(values, 0.90),
    )


def median_rse(values: Sequence[float]) -> float:
    """Relative standard error of the median: 1.2533 * sigma / sqrt(n) / median.

    sigma comes from the interquartile range rather than the raw standard deviation, so one preempted sample
    (a 10x outlier) does not keep an otherwise converged measurement sampling until its cap.
    """
    n = len(values)
    if n < 2:
        return math.inf
    centre = median(values)
    if centre <= 0:
        return math.inf
    sigma = (percentile(values, 0.75) - percentile(values, 0.25)) * IQR_TO_SIGMA
    return MEDIAN_SE_FACTOR * sigma / math.sqrt(n) / centre


def speedup(baseline_median: float, candidate_median: float) -> float:
    """Baseline time over candidate time: above 1 means the candidate is faster."""
    if baseline_median <= 0 or candidate_median <= 0:
        raise ValueError(f"speedup needs positive times, got {baseline_median} and {candidate_median}")
    return baseline_median / candidate_median


def geomean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("geometric mean of no values")
    if any(v <= 0 for v in values):
        raise ValueError("geometric mean needs positive values")
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def bootstrap_geomean_ci(
    speedups: Sequence[float], *, seed: int = 0, n_boot: int = 10_000, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean, resampling rows with replacement."""
    return hierarchical_geomean_ci([[s] for s in speedups], seed=seed, n_boot=n_boot, level=level)


def row_speedup_draws(
    baseline: Sequence[float], candidate: Sequence[float], *, seed: int = 0, n_draws: int = 200
) -> list[float]:
    """Bootstrap draws of one row's speedup (median of resampled baseline over median of resampled candidate)."""
    rng = random.Random(seed)
    return [
        median(rng.choices(baseline, k=len(baseline))) / median(rng.choices(candidate, k=len(candidate)))
        for _ in range(n_draws)
    ]


def with_process_offset(draws: Sequence[float], relative: float, *, seed: int = 0) -> list[float]:
    """A row's speedup draws, each scaled by a factor drawn uniformly (in log) from [1/(1+relative), 1+relative].

    relative is the row's process floor over its shorter median: how far the two side processes' own offsets may
    move its speedup. The offset holds for a whole run, so the row's samples cannot show it; this carries it
    into the headline's interval (report.headline). No offset (CPU rows, relative 0): the draws unchanged.
    """
    if relative <= 0:
        return list(draws)
    rng = random.Random(seed)
    span = math.log1p(relative)
    return [d * math.exp(rng.uniform(-span, span)) for d in draws]


def hierarchical_geomean_ci(
    draws_per_row: Sequence[Sequence[float]], *, seed: int = 0, n_boot: int = 10_000, level: float = 0.95
) -> tuple[float, float]:
    """Interval of the geomean over rows that carries both the spread between rows and each row's own noise.

    Each replicate resamples the rows with replacement and takes, for every row drawn, one of that row's
    bootstrap speedup draws. With a single draw per row this is the plain bootstrap over rows; with one row it
    is that row's measurement uncertainty, which a resampling over rows alone would hide (a zero-width interval).
    """
    if not draws_per_row or any(not draws for draws in draws_per_row):
        raise ValueError("bootstrap needs at least one row, each with at least one draw")
    rng = random.Random(seed)
    logs = [[math.log(d) for d in draws] for draws in draws_per_row]
    rows = len(logs)
    replicates = sorted(
        math.exp(math.fsum(rng.choice(logs[rng.randrange(rows)]) for _ in range(rows)) / rows) for _ in range(n_boot)
    )
    tail = (1.0 - level) / 2.0
    return percentile(replicates, tail), percentile(replicates, 1.0 - tail)


# --------------------------------------------------------------------------------------------- verdicts

FASTER, SAME, SLOWER = "FASTER", "SAME", "SLOWER"
# A change smaller than this is never called a win or a loss, however tight its interval.
NOISE_FLOOR = 0.01
RESOLUTION_QUANTA = 2  # timer ticks between two medians that still say nothing about which is faster
# How far apart two side processes may read one kernel. Each process has an offset of its own, constant for its life
# and alike at every row length: the dial's A/A rows on the H200 (benchmarks/gpu/power.py, 25 process pairs, harness
# 2.8) read -160 to +224 ns apart (a copy of the baseline, 2.7: up to 288 ns). One pair's medians closer than
# PROCESS_FLOOR_US say nothing about which side is faster; a row timed by n pairs, its samples pooled, carries the
# mean of n such offsets: PROCESS_FLOOR_US / sqrt(n) (process_floor_us). Harness 2.4-2.8 used 0.75 us for one pair.
PROCESS_FLOOR_US = 0.3
# A cold GPU row is timed by several process pairs and their samples pooled; one process's own offset can still move
# the pooled median (2.13, the H200: an A/A row read FASTER 1.047x with pairs at 1.000, 1.129, 0.961 and 0.989x).
# A row is FASTER or SLOWER only where at least this share of its pairs (3 of 4) reads it that way on its own.
PAIRS_AGREEING = 0.75
VERDICT_LEVEL = 0.95
VERDICT_DRAWS = 200  # ~1 s per row at 2,000 samples a side on a busy core; enough for a 95 % interval


# The context regime (issue 45) times one CUDA graph of the previous op, the call and the next op: three kernels or
# more, each read with its process's own offset as one kernel is, so a graph carries about sqrt(3) x one kernel's.
# On a two-H200 host (harness 2.18, 2026-11-28) the dial's A/A rows in context read SLOWER in 2 of 36 row-runs under
# the one-kernel floor (0.17-0.19 us on 14.5 us graphs, 3 and 4 of 4 pairs one way); the same samples judged with
# twice that floor read 36 of 36 SAME and left every fuse_scale_shift verdict in context as it was.
CONTEXT_FLOOR_FACTOR = 2.0
# The warm regime (issue 45) times the kernel alone on the inputs its previous op left in the L2, and how much of
# them is still there depends on where the case's memory sits: the same in every process pair of a row (they share its
# cases), so the pairs' agreement does not see it. On a two-H200 host (harness 2.19) the dial's A/A rows of ~18 us
# (inputs and outputs half the L2) read one timing case about 0.9 % from the next (standard deviation), the same way
# in all four pairs, and 32 row-runs 0.995-1.016x (8 FASTER under the 1 % floor); under 2.21, 96 row-runs 0.991-1.016x
# (mean 1.007, cause not found), 96 SAME with this floor. A change in the warm regime smaller than this is never
# called there.
WARM_NOISE_FLOOR = 0.02


def process_floor_us(pairs: int = 1, *, in_context: bool = False) -> float:
    """The process floor of a GPU row whose samples were pooled over `pairs` process pairs per side (in_context: of
    a context regime's graph, CONTEXT_FLOOR_FACTOR x)."""
    return PROCESS_FLOOR_US / math.sqrt(max(1, pairs)) * (CONTEXT_FLOOR_FACTOR if in_context else 1.0)


def speedup_interval(
    baseline: Sequence[float], candidate: Sequence[float], *, seed: int = 0, n_draws: int = VERDICT_DRAWS,
    level: float = VERDICT_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of one row's speedup (each side's samples resampled)."""
    draws = sorted(row_speedup_draws(baseline, candidate, seed=seed, n_draws=n_draws))
    tail = (1.0 - level) / 2.0
    return percentile(draws, tail), percentile(draws, 1.0 - tail)


def change_verdict(speedup_value: float, low: float, high: float, *, noise: float = NOISE_FLOOR) -> str:
    """FASTER / SAME / SLOWER, in the spirit of nvbench's compare-robust.

    SAME when the interval holds 1.0, or when the change is within the noise threshold: the larger of
    `noise` and the interval's own relative half-width. Only a change that clears both is a win or a loss.
    """
    if low <= 1.0 <= high:
        return SAME
    half_width = (high - low) / 2.0 / speedup_value if speedup_value > 0 else math.inf
    threshold = max(noise, half_width)
    if speedup_value > 1.0 and speedup_value - 1.0 > threshold:
        return FASTER
    if speedup_value < 1.0 and 1.0 / speedup_value - 1.0 > threshold:
        return SLOWER
    return SAME


def timer_quantum(*sides: Sequence[float]) -> float:
    """The smallest step between distinct sample values: the timer's resolution where samples are quantized
    (CUDA events tick in steps of about 32 ns on an H200), ~0 where they are not."""
    values = sorted({round(v, 6) for side in sides for v in side})
    gaps = [b - a for a, b in zip(values, values[1:]) if b - a > 1e-6]
    return min(gaps) if gaps else 0.0


def pairs_needed(pairs: int) -> int:
    """How many of a row's process pairs must read its change the same way for it to be a change (3 of 4)."""
    return math.ceil(PAIRS_AGREEING * pairs - 1e-9)


def pairs_pointing(pair_medians: Sequence[tuple[float, float]], verdict: str) -> int:
    """How many (baseline, candidate) pair medians read the candidate faster (FASTER) or slower (SLOWER)."""
    if verdict == FASTER:
        return sum(1 for base, cand in pair_medians if cand < base)
    return sum(1 for base, cand in pair_medians if cand > base)


def row_verdict(baseline: Sequence[float], candidate: Sequence[float], *, seed: int = 0,
                process_floor_us: float = 0.0, medians: tuple[float, float] | None = None,
                pair_medians: Sequence[tuple[float, float]] = (), meaningful: bool = True,
                noise_floor: float = NOISE_FLOOR) -> dict[str, Any]:
    """The row's speedup (median over median), its interval and its verdict, all from the raw samples.

    The noise threshold also covers the timer's resolution and, for GPU rows (process_floor_us, the judge passes
    process_floor_us(pairs)), how far apart the sides' processes may read one kernel: medians RESOLUTION_QUANTA ticks or
    process_floor_us apart or less are never a change. On the H200 a copy of the baseline read 0.917x to 1.064x
    on 3.5-5 us rows and 0.989x on a 55 us row, with intervals that did not hold 1.0. A row timed by two or more
    process pairs (pair_medians: each pair's (baseline, candidate) medians) is a change only where pairs_needed of
    them read it so; otherwise SAME, and "held" says which change the pooled samples alone would have called.
    meaningful=False (a smoke run: Triton's interpreter on a CPU): the numbers stay for the record, the verdict is
    None (and no "held"), so no FASTER or SLOWER of such timings reaches results.json, the headline's counts or the
    ledger.
    """
    base_median, cand_median = medians or (median(baseline), median(candidate))  # the judge's, when it has them
    value = speedup(base_median, cand_median)
    low, high = speedup_interval(baseline, candidate, seed=seed)
    quantum = timer_quantum(baseline, candidate)
    shortest = min(base_median, cand_median)
    apart = max(RESOLUTION_QUANTA * quantum, process_floor_us)
    noise = max(noise_floor, apart / shortest if shortest > 0 else 0.0)
    verdict: dict[str, Any] = {"speedup": value, "low": low, "high": high, "level": VERDICT_LEVEL, "noise": noise,
                               "timer_quantum_us": round(quantum, 6), "process_floor_us": process_floor_us,
                               "verdict": change_verdict(value, low, high, noise=noise)}
    if len(pair_medians) >= 2:
        verdict = {**verdict, **_pairs_agreement(verdict["verdict"], pair_medians)}
    if not meaningful:  # the numbers (and how many pairs pointed which way) stay for the record; no word is said
        verdict = {**{k: v for k, v in verdict.items() if k != "held"}, "verdict": None}
    return verdict


def _pairs_agreement(pooled: str, pair_medians: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The verdict's fields for a row of several process pairs: pairs pointing, needed, and SAME where too few do."""
    if pooled == SAME:
        return {}
    pointing, needed = pairs_pointing(pair_medians, pooled), pairs_needed(len(pair_medians))
    agreement = {"pairs_pointing": pointing, "pairs_needed": needed}
    if pointing >= needed:
        return agreement
    return {**agreement, "verdict": SAME,
            "held": f"{pooled} by the pooled samples, but {pointing} of {len(pair_medians)} process pairs read it "
                    f"{pooled} ({needed} needed)"}
