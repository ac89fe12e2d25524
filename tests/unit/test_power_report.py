"""benchmarks/gpu/power_report.py's power curve: the smallest change a harness reads SLOWER in at least 95 % of runs,
per row size, from the dial's row-runs (issue 25 item 1: the curve of 2.7 and the new version is this table)."""

from __future__ import annotations


import pytest
from unit.helpers import gpu_script


@pytest.fixture(scope="module")
def report():
    return gpu_script("power_report")


def runs(size: str, level: str, base: float, extra: float, verdicts: str) -> list[dict]:
    """One row-run per letter of verdicts (S: SLOWER, =: SAME, F: FASTER), the candidate `extra` µs slower."""
    names = {"S": "SLOWER", "=": "SAME", "F": "FASTER"}
    return [{"run": str(i), "size": size, "level": level, "verdict": names[v], "baseline": base,
             "candidate": base + extra} for i, v in enumerate(verdicts)]


def test_a_rate_seen_every_time_has_the_clopper_pearson_lower_bound(report) -> None:
    assert report.lower_bound(14, 14) == pytest.approx(0.05 ** (1 / 14), abs=1e-6)  # 0.807
    assert report.lower_bound(24, 24) == pytest.approx(0.05 ** (1 / 24), abs=1e-6)
    assert report.lower_bound(0, 10) == 0.0
    assert report.lower_bound(12, 14) == pytest.approx(0.6146, abs=1e-3)  # scipy.stats.beta.ppf(0.05, 12, 3)


def test_the_curve_names_the_smallest_change_seen_in_95_percent_of_runs_with_every_larger_one(report) -> None:
    entries = [
        *runs("s4", "aa1", 6.9, 0.0, "=" * 13 + "F"),
        *runs("s4", "d2", 6.9, 0.19, "SSSSSSSSSS===="),      # +2.8 %: 10 of 14
        *runs("s4", "d5", 6.9, 0.32, "S" * 14),              # +4.6 %: every run
        *runs("s4", "d10", 6.9, 0.58, "S" * 13 + "="),        # +8.4 %: 13 of 14, under 95 %
        *runs("s4", "d20", 6.9, 1.20, "S" * 14),
        *runs("s15", "d2", 17.6, 0.2, "SSS" + "=" * 11),
        *runs("s15", "d5", 17.6, 0.6, "S" * 5 + "=" * 9),
        *runs("s200", "aa1", 228.3, 0.0, "=" * 14),
        *runs("s200", "d2", 228.3, 4.1, "S" * 14),
    ]
    lines = report.curve(entries)
    by_size = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert list(by_size) == ["s4", "s15", "s200"]  # by row time
    # d5 reads SLOWER every time but d10 above it does not: the curve starts where every larger change is seen too
    assert "| +17.4 % | 14 of 14 (81 %) | +2.8 %: 10 of 14, +4.6 %: 14 of 14, +8.4 %: 13 of 14 |" in by_size["s4"]
    assert by_size["s4"].endswith("| 13 of 14 SAME, 1 FASTER or SLOWER |")
    assert "| none up to +3.4 % |  | +1.1 %: 3 of 14, +3.4 %: 5 of 14 |" in by_size["s15"]
    assert "| +1.8 % | 14 of 14 (81 %) |  | 14 of 14 SAME, 0 FASTER or SLOWER |" in by_size["s200"]


def audited(level: str, base: tuple[float, float], cand: tuple[float, float]) -> dict:
    """A row-run whose audit read (harness µs, ncu µs) for each side."""
    sides = {side: {"harness_us": h, "ncu_us": n} for side, (h, n) in (("baseline", base), ("candidate", cand))}
    return {"run": "0", "size": "s4", "level": level, "verdict": "SAME", "baseline": base[0], "candidate": cand[0],
            "audit": {"agree": True, "sides": sides}}


def test_the_audit_table_gives_ncus_ratio_and_what_the_candidates_window_holds_beyond_its_kernels(report) -> None:
    entries = [audited("aa1", (7.04, 3.936), (7.10, 4.000)),   # ncu 1.6 % apart on one kernel
               audited("aa1", (7.00, 3.900), (7.00, 3.900)),
               audited("aa1", (7.20, 4.000), (6.70, 3.900)),   # the candidate's window 0.4 us shorter beyond its kernels
               audited("d5", (7.00, 3.900), (7.30, 4.150)),
               {"run": "1", "size": "s4", "level": "d5", "verdict": "SLOWER", "baseline": 7.0, "candidate": 7.3}]
    lines = report.audit_relations(entries)
    assert lines[2] == "| s4 | aa1 | 3 | 0.984, 1.000, 1.026 | -0.40, -0.00, +0.00 |"
    assert lines[3] == "| s4 | d5 | 1 | 0.940, 0.940, 0.940 | +0.05, +0.05, +0.05 |"
    assert report.audit_relations(entries[-1:]) == []  # no audited row, no table
