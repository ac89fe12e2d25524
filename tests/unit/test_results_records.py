"""The records that cross the seam as results.json (results.RunResults and its parts): the agent builds them, the
client reads them back, and what one side writes the other reads as it was written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kpremote.agent.run import report, resultsmd
from kpremote.agent.results import Headline, RowResult, RunResults, SideStats, row_interval

KEPT = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "results").glob("*.json"))


def judged_row(workload: str, speedup: float, production: bool = True) -> dict:
    """A row as the runner hands it to report.build_results (the judge's result, with the runner's fields)."""
    side = {"n": 3, "median": 10.0, "mean": 10.0, "std": 0.1, "min": 9.9, "p10": 9.9, "p90": 10.1, "rse": 0.01,
            "dropped_clock": 0}
    return {"workload": workload, "production": production, "params": {"id": workload}, "status": "PASSED",
            "timing": {"mode": "smoke", "baseline": side, "candidate": {**side, "median": 10.0 / speedup},
                       "speedup": speedup, "unit": "us"},
            "verdict": {"speedup": speedup, "low": speedup * 0.9, "high": speedup * 1.1, "level": 0.95,
                        "noise": 0.01, "verdict": "SAME"},
            "speedup": speedup, "seeds": {"timing": [1, 2]}, "log": f"raw/workloads/{workload}.log"}


def test_what_the_agent_builds_the_client_reads_back_field_for_field():
    built = report.build_results(provenance={"run_id": "r", "task": {"name": "t"}}, status="passed", exit_code=0,
                                 rows=[RowResult.from_json(judged_row("a", 2.0)),
                                       RowResult.from_json(judged_row("b", 0.5, production=False))], samples={},
                                 message=None, smoke=True)
    written = json.loads(json.dumps(built.to_json()))
    read = RunResults.from_json(written)
    assert read == built
    assert read.rows[0].seeds == {"timing": [1, 2]} and read.rows[0].log == "raw/workloads/a.log"  # declared
    assert read.rows[0].newer == {} and read.rows[0].side("baseline").dropped_clock == 0
    assert read.rows[0].side("candidate").median == 5.0 and read.rows[0].interval == (1.8, 2.2)
    assert (read.headline.geomean, read.headline.n, read.headline.of) == (2.0, 1, 1)
    assert "note" not in written["headline"] and written["headline"]["verdicts"] == {"SAME": 1}


def test_a_withheld_headline_says_why_and_has_no_method():
    failed = {**judged_row("a", 2.0), "status": "INCORRECT", "speedup": None}
    head = report.headline([RowResult.from_json(failed)], {}, smoke=False).to_json()
    assert head["geomean"] is None and head["note"] == "withheld: a INCORRECT" and "method" not in head


def test_every_kept_summary_reads_back_exactly_as_it_was_written():
    assert KEPT
    for path in KEPT:
        document = json.loads(path.read_text())
        assert RunResults.from_json(document).to_json() == document, path.name


def test_a_side_that_was_not_timed_has_no_statistics():
    row = RowResult.from_json({"workload": "a", "status": "ERROR", "timing": {"baseline": {"n": 0}}})
    assert row.side("baseline") is None and row.side("candidate") is None
    assert row.timing.to_json() == {"baseline": {"n": 0}}  # an untimed side stays {"n": 0}, nothing invented
    assert SideStats.from_json({"n": 2, "median": 1.0}).to_json() == {"n": 2, "median": 1.0}


def test_the_interval_is_the_verdicts_and_nothing_else():
    assert row_interval(RowResult.from_json({"verdict": {"low": 0.9, "high": 1.2}})) == (0.9, 1.2)
    for never_written in ({"speedup_interval": {"low": 0.9, "high": 1.2}}, {"speedup_low": 0.9, "speedup_high": 1.2},
                          {"timing": {"interval": [0.9, 1.2]}}):
        assert RowResult.from_json({"speedup": 1.1, **never_written}).interval is None, never_written
    with pytest.raises(ValueError, match="RowResult.verdict: expected a JSON object, got 'FASTER'"):
        RowResult.from_json({"speedup": 1.1, "verdict": "FASTER"})


def test_a_summary_of_another_shape_is_refused_naming_the_record_the_field_and_what_it_held():
    cases = [({"rows": [{"workload": "w", "speedup": "fast"}]}, "RunResults.rows[0].speedup: expected a number or null, "
                                                                  "got 'fast'"),
             ({"rows": 200}, "RunResults.rows: expected a list of an object (RowResult), got 200"),
             ({"rows": [1]}, "RunResults.rows[0]: expected a JSON object, got 1"),
             ({"headline": "withheld"}, "RunResults.headline: expected a JSON object, got 'withheld'"),
             ({"provenance": [3]}, "RunResults.provenance: expected an object of anything, got [3]"),
             ({"rows": [{"timing": {"baseline": {"n": 2.5}}}]}, "RunResults.rows[0].timing.baseline.n: expected an "
                                                               "integer, got 2.5"),
             ({"rows": [{"timing": {"baseline": {"n": True}}}]}, "baseline.n: expected an integer, got True"),
             ({"smoke": 1}, "RunResults.smoke: expected true or false, got 1"),
             ({"rows": [{"gbps": {"baseline": "x"}}]}, "RunResults.rows[0].gbps.baseline: expected a number or null"),
             ({"rows": [{"seeds": {"timing": [1, "2"]}}]}, "RunResults.rows[0].seeds.timing[1]: expected an integer")]
    for document, said in cases:
        with pytest.raises(ValueError, match=re.escape(said)):
            RunResults.from_json(document)
    assert RowResult.from_json({"speedup": 2, "timing": {"baseline": {"median": 3}}}).speedup == 2  # an int is a number


def test_a_summary_without_a_headline_reads_as_one_with_nothing_in_it_and_a_newer_key_is_kept_apart():
    bare = RunResults.from_json({"rows": [{"workload": "w", "from_2_99": {"x": 1}}]})
    assert bare.headline.geomean is None and bare.headline.to_json() == {} and not bare.is_summary
    assert RunResults.from_json({"schema": "kpremote.results/1"}).is_summary
    assert bare.rows[0].newer == {"from_2_99": {"x": 1}} and bare.rows[0].to_json()["from_2_99"] == {"x": 1}
    assert Headline.from_json({"geomean": 1.5, "n": 2}).to_json() == {"geomean": 1.5, "n": 2}


def test_a_field_set_after_the_record_was_read_is_written():
    row = RowResult.from_json({"workload": "w", "status": "PASSED"})
    row.invalid = "audit failed"
    assert row.to_json() == {"workload": "w", "status": "PASSED", "invalid": "audit failed"}


def test_a_file_that_is_not_results_is_refused_naming_the_file(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: .*expected a JSON object"):
        RunResults.read(bad)


def test_a_faster_row_the_audit_cannot_vouch_for_is_counted_and_shown_as_unverified():
    """A FASTER row whose cold window stands so far above the audit's floor that a forge over 5 % would pass keeps its
    speedup, but reads FASTER (unverified) in the headline's counts, the table and a note that says how far."""
    faster = {**judged_row("small", 1.3), "verdict": {**judged_row("small", 1.3)["verdict"], "verdict": "FASTER"}}
    blind = {**faster, "verdict": {**faster["verdict"], "forge_blind_spot_pct": 12.4}}
    built = report.build_results(provenance={"run_id": "r", "task": {"name": "t"}, "device": "cuda"},
                                 status="passed", exit_code=0, rows=[RowResult.from_json(blind),
                                       RowResult.from_json({**faster, "workload": "large"})],
                                 samples={}, message=None, smoke=False)
    read = RunResults.from_json(json.loads(json.dumps(built.to_json())))
    small, large = read.rows
    assert (small.verdict_word, small.speedup) == ("FASTER (unverified)", 1.3) and large.verdict_word == "FASTER"
    assert small.unverified == "FASTER — unverified: the audit cannot see a forge under 12 % on this row"
    assert large.unverified is None
    assert read.headline.verdicts == {"FASTER": 1, "FASTER (unverified)": 1} and read.headline.n == 2
    page = resultsmd.render_results_md(read)
    line = next(line for line in page.splitlines() if line.startswith("| `small`"))
    assert "| FASTER (unverified) |" in line
    assert "- `small`: FASTER — unverified: the audit cannot see a forge under 12 % on this row" in page
    assert "rows 1 FASTER, 1 FASTER (unverified)" in page
    # a SAME or SLOWER row is what it is: a forge could only have flattered the candidate
    same = RowResult.from_json({**judged_row("s", 1.0), "verdict": {"verdict": "SAME", "forge_blind_spot_pct": 9.0}})
    assert same.verdict_word == "SAME" and same.unverified is None


@pytest.mark.parametrize("smoke, why", [(True, "a CPU run takes the task's smoke rows"),
                                        (False, "no production row among the rows run")])
def test_a_run_without_a_production_row_says_why_not_that_none_was_selected(smoke: bool, why: str) -> None:
    # `inv check` selects every row; a CPU run then takes the smoke rows, none of them a production row
    head = report.headline([RowResult.from_json(judged_row("grid", 1.1, production=False))], {}, smoke=smoke)
    assert head.geomean is None and why in head.note and "selected" not in head.note
