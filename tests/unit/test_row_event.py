"""A row's event (raw/events.jsonl, streamed by `inv run --json-stream`) carries the row's verdict and its interval as
results.md shows them: a GPU row's FASTER / SAME / SLOWER, and none for a smoke row, whose timings mean nothing."""

from __future__ import annotations

from kpremote.agent.results import RowResult
from kpremote.agent.run import events


def _row_event(row: dict, number: int, total: int) -> dict:
    return events.row_event(RowResult.from_json(row), number, total)  # the runner holds each row as its record

TIMED = {"workload": "prod_r8_c256", "status": "PASSED", "production": True, "speedup": 1.21,
         "verdict": {"verdict": "FASTER", "speedup": 1.21, "low": 1.18, "high": 1.24, "process_floor_us": 0.3},
         "timing": {"mode": "cold", "baseline": {"n": 40, "median": 12.0}, "candidate": {"n": 40, "median": 9.9}}}


def test_a_gpu_rows_event_says_its_verdict_and_interval():
    event = _row_event({**TIMED, "smoke": False}, 1, 3)
    assert (event["verdict"], event["speedup_low"], event["speedup_high"]) == ("FASTER", 1.18, 1.24)
    assert (event["i"], event["n"], event["baseline_median_us"], event["candidate_n"]) == (1, 3, 12.0, 40)


def test_a_smoke_rows_event_and_an_untimed_rows_say_no_verdict():
    smoke = _row_event({**TIMED, "smoke": True, "label": "smoke: timings are not meaningful"}, 2, 3)
    untimed = _row_event({**TIMED, "status": "INCORRECT", "speedup": None, "verdict": None, "timing": None}, 3, 3)
    for event in (smoke, untimed):
        assert (event["verdict"], event["speedup_low"], event["speedup_high"]) == (None, None, None)


def test_the_runner_makes_each_row_its_record_once_and_a_judges_answer_of_another_shape_is_that_rows_error():
    from kpremote.agent.run.runner import _row_record

    row = _row_record({**TIMED, "smoke": False, "seconds": 1.5, "log": "raw/workloads/prod_r8_c256.log"})
    assert isinstance(row, RowResult) and row.speedup == 1.21 and row.seconds == 1.5 and not row.newer
    bad = _row_record({**TIMED, "speedup": "fast"})
    assert (bad.workload, bad.status, bad.where, bad.speedup) == ("prod_r8_c256", "ERROR", "judge", None)
    assert bad.message == ("judge: its answer is not a row: row prod_r8_c256.speedup: expected a number or null, "
                           "got 'fast'")
