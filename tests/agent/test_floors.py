"""floors: the physical floor a timing must respect (bytes_moved at 1.1 x the copy bandwidth), which copy bandwidth
a row is held to, and how that bandwidth is counted."""

from __future__ import annotations

import pytest

from kpremote.agent.harness import floors


def test_bandwidth_beyond_the_copy_roofline_is_implausible() -> None:
    # 4 MB moved in 1 us is 4000 GB/s: possible on a 4300 GB/s GPU, not on a 2000 GB/s one.
    assert floors.achieved_gbps(4_000_000, 1.0) == pytest.approx(4000.0)
    assert floors.floor_check(4_000_000, 1.0, 4300.0) is None
    reason = floors.floor_check(4_000_000, 1.0, 2000.0)
    assert reason is not None and reason.startswith(floors.IMPLAUSIBLE_PREFIX)
    assert floors.floor_check(None, 1.0, 2000.0) is None and floors.floor_check(4_000_000, 1.0, None) is None


def test_the_floor_is_one_point_one_times_the_copy_bandwidth() -> None:
    # 1 MB moved at a 1000 GB/s copy bandwidth: the floor is 1e6 / 1.1e12 s = 0.909 us.
    assert floors.floor_check(1_000_000, 0.95, 1000.0) is None
    reason = floors.floor_check(1_000_000, 0.85, 1000.0)
    assert reason is not None and reason.startswith("implausible: 0.85 us is under the physical floor of 0.909 us")
    assert "L2" in (floors.floor_check(1_000_000, 0.5, 1000.0, "L2-resident copy bandwidth") or "")


def test_copy_bandwidth_counts_bytes_read_and_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # A clock whose three copies take 300, 100 and 110 us: the median is 110 us (the mean would be 170), and the
    # 32 MiB buffer is read once and written once, 2 x 33554432 bytes in 110 us = 610.1 GB/s; the fastest copy
    # (100 us) read 671.1 GB/s and the slowest (300 us) 223.7, kept for the record.
    readings = iter([0.0, 300e-6, 1.0, 1.0 + 100e-6, 2.0, 2.0 + 110e-6])
    monkeypatch.setattr(floors.time, "perf_counter", lambda: next(readings))
    measured = floors.measure_copy_bandwidth("cpu", repeats=3)
    assert measured == {"gbps": 610.1, "bytes": 33554432, "median_us": 110.0, "repeats": 3, "best_gbps": 671.1,
                        "worst_gbps": 223.7, "device": "cpu"}


def test_copy_bandwidth_on_the_cpu_is_a_real_measurement() -> None:
    measured = floors.measure_copy_bandwidth("cpu", repeats=3)
    assert measured["bytes"] == 32 * 1024 * 1024 and measured["repeats"] == 3
    assert measured["median_us"] > 0 and measured["gbps"] > 0


def test_only_a_graph_mode_working_set_that_fits_in_the_l2_is_held_to_the_l2_copy_bandwidth() -> None:
    l2, dram, warm = 50_000_000, 4000.0, 9000.0
    assert floors.floor_bandwidth("graph", 1_000_000, l2, dram, warm) == (warm, floors.L2_COPY)
    assert floors.floor_bandwidth("graph", 60_000_000, l2, dram, warm) == (dram, floors.DRAM_COPY)
    assert floors.floor_bandwidth("cold", 1_000_000, l2, dram, warm) == (dram, floors.DRAM_COPY)
    assert floors.floor_bandwidth("graph", 1_000_000, l2, dram, 3000.0) == (dram, floors.DRAM_COPY)  # only if faster
    assert floors.floor_bandwidth("graph", 1_000_000, l2, dram, None) == (dram, floors.DRAM_COPY)
    assert floors.floor_bandwidth("graph", 1_000_000, 0, None, warm) == (None, floors.DRAM_COPY)


def test_a_row_is_held_to_the_fastest_copy_the_probe_made() -> None:
    # A four-GPU H200's low probe (2.15): median 4009 GB/s, fastest repeat 4047; the dial's honest fused copy of
    # 1006632960 bytes in 228.2 us moves 4411 GB/s: over 1.1 x the median (4410), under 1.1 x the fastest (4452).
    probe = {"gbps": 4009.0, "best_gbps": 4047.0, "worst_gbps": 3921.0}
    assert floors.reachable_gbps(probe) == 4047.0
    assert floors.floor_check(1_006_632_960, 228.2, floors.reachable_gbps(probe)) is None
    assert floors.floor_check(1_006_632_960, 228.2, probe["gbps"]) is not None
    assert floors.reachable_gbps({"gbps": 4100.0}) == 4100.0  # a record from before 2.15 has no repeats
    assert floors.reachable_gbps(None) is None and floors.reachable_gbps({}) is None
