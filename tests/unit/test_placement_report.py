"""benchmarks/gpu/placement_report.py: an A/A row-run's samples split by timing case and process pair (the warm
regime's offset, harness 2.20-2.21), lined up as the sampler takes them; a row whose samples cannot be lined up is
left out and counted, never split wrongly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unit.helpers import gpu_script


@pytest.fixture(scope="module")
def report():
    return gpu_script("placement_report")


def write_run(folder: Path, counts: list[int], slow_case: int, dropped: int = 0) -> None:
    """One A/A row-run, warm regime: the baseline 2 % slower on timing case slow_case only, in every pair."""
    times = {"baseline": [], "candidate": []}
    for count in counts:
        for k in range(count):
            times["candidate"].append(10.0)
            times["baseline"].append(10.2 if k % 4 == slow_case else 10.0)
    side = {"dropped_clock": dropped}
    row = {"workload": "s15_ctx_aa1", "status": "PASSED", "checks": {},
           "timing": {"process_pairs": []},
           "regimes": {"warm": {"timing": {"baseline": side, "candidate": side,
                                           "process_pairs": [{"n": n} for n in counts]}}}}
    (folder / "summary").mkdir(parents=True)
    (folder / "raw").mkdir()
    (folder / "summary" / "results.json").write_text(json.dumps({"rows": [row]}))
    (folder / "raw" / "samples.jsonl").write_text("".join(
        json.dumps({"workload": "s15_ctx_aa1", "side": s, "regime": "warm", "times": t}) + "\n"
        for s, t in times.items()))


def test_each_sample_goes_to_its_case_within_its_pairs_share(report) -> None:
    split = report.split_by_case({"baseline": [2, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 2],
                                  "candidate": [1] * 13}, [8, 5])
    assert split[(0, 0)] == 2.0 and split[(1, 0)] == 2.0  # the first sample of each pair's share is case 0
    assert split[(0, 1)] == split[(1, 1)] == split[(0, 3)] == 1.0 and (1, 4) not in split


def test_the_table_shows_the_case_that_reads_slower_and_leaves_out_what_cannot_line_up(report, tmp_path, capsys) -> None:
    write_run(tmp_path / "runs" / "one", [12, 13, 12, 12], slow_case=2)
    write_run(tmp_path / "runs" / "two", [12, 12, 12, 12], slow_case=2)
    write_run(tmp_path / "runs" / "dropped", [12, 12, 12, 12], slow_case=0, dropped=1)
    assert report.main(["--rows", "s15", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 row-run(s), 1 left out" in out
    assert "| case 2 | baseline | 2 | 1.0200 | 1.00 |" in out and "| case 0 | baseline | 2 | 1.0000 | 0.00 |" in out
    assert "| pair 2 | candidate | 2 | 1.0050 | 1.00 |" in out  # each pair: one case of four 2 % slower
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert "no such folder or tgz" in capsys.readouterr().err
