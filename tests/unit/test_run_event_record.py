"""A run's events are records (run/events.py RunEvent): the agent writes only lines that fit their declared types, the
client reads each followed line with RunEvent.from_json (a mistyped field is one line naming the host, run and field,
a KpremoteError: exit 2), and the client's own stream lines fit StreamEvent (docs/schemas/run-event.json)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import jsonschema
import pytest

from kpremote.agent.record import RecordError
from kpremote.agent.results import RowResult
from kpremote.agent.run.events import EventLog, RunEvent, read_events, row_event
from kpremote.errors import KpremoteError
from kpremote.results import schemas
from kpremote.runs.eventstream import EventStream
from kpremote.runs.remote import follow_run
from kpremote.runs.session import RunSession

ROW = {"workload": "w1", "status": "PASSED", "production": True, "speedup": 1.2, "smoke": False,
       "verdict": {"verdict": "FASTER", "low": 1.1, "high": 1.3},
       "timing": {"mode": "cold", "baseline": {"n": 9, "median": 2.0}, "candidate": {"n": 9, "median": 1.6}},
       "regimes": {"name": "ctx", "warm": {"speedup": 1.1}, "context": {"speedup": 1.0}}}


def test_the_agent_writes_events_that_fit_their_record_and_refuses_a_mistyped_field(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.emit("phase", phase="workload", workload="w1", i=1, n=2)
    log.emit("row", **row_event(RowResult.from_json(ROW), 1, 2))
    with pytest.raises(RecordError, match=r"^phase event\.i: expected an integer or null, got 'one'$"):
        log.emit("phase", phase="workload", i="one")
    log.close()
    written, _ = read_events(tmp_path / "events.jsonl")
    assert [event["event"] for event in written] == ["phase", "row"]  # the refused line was not written
    row = RunEvent.from_json(written[1])
    assert not row.newer, "every key of a row's event is a declared field"
    assert (row.verdict, row.speedup_low, row.baseline_median_us, row.regimes["warm"]["speedup"]) == \
        ("FASTER", 1.1, 2.0, 1.1)


class _Agent:
    """An agent whose follow prints the given lines."""

    def __init__(self, lines: list[bytes]) -> None:
        self.host = SimpleNamespace(name="h1", connect_timeout=5.0, is_cluster=False)
        self.lines = lines

    def call(self, *args, on_stdout, **kwargs):
        for line in self.lines:
            on_stdout(line + b"\n")
        return SimpleNamespace(ok=True)


def _follow(lines: list[bytes]) -> tuple[list[dict], dict]:
    seen: list[dict] = []
    final = follow_run(RunSession(agent=_Agent(lines)), "t", "r1", seen.append)  # type: ignore[arg-type]
    return seen, final


def test_the_client_reads_each_followed_line_as_its_record():
    seen, final = _follow([b'{"t": 1.5, "event": "phase", "phase": "build"}', b'{"event": "heartbeat"}',
                           b'{"t": 2, "event": "provenance", "gpu": {"name": "x"}}',
                           b'{"event": "end", "state": {"status": "passed"}, "offset": 9}'])
    assert seen == [{"t": 1.5, "event": "phase", "phase": "build"}, {"t": 2, "event": "provenance", "gpu": {"name": "x"}}]
    assert final == {"status": "passed"}


@pytest.mark.parametrize("line, said", [
    (b'{"t": 1, "event": "row", "workload": "w1", "speedup": "fast"}',
     "h1: run r1: a malformed event line from the agent: event.speedup: expected a number or null, got 'fast'"),
    (b'{"event": "end", "state": "done"}',
     "h1: run r1: a malformed event line from the agent: event.state: expected an object of anything, "
     "got 'done'"),
    (b'{"event": "row"', "h1: run r1: a malformed event line from the agent: Expecting ',' delimiter"),
])
def test_a_mistyped_event_from_the_host_is_one_line_naming_the_host_run_and_field(line, said):
    with pytest.raises(KpremoteError) as caught:  # the CLI's error contract: one line on stderr, exit 2
        _follow([line])
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_the_client_stream_lines_fit_the_generated_schema_and_a_mistyped_one_is_refused():
    out = io.StringIO()
    stream = EventStream(out)
    stream.emit("h1", "t", None, {"event": "syncing", "files": 3, "bytes": 100})
    stream.emit("h1", "t", "r1", {"t": 2.0, "event": "row", **row_event(RowResult.from_json(ROW), 1, 1)})
    stream.end("h1", "t", "r1", ended=True, status="passed", exit_code=0, headline=None, error=None)
    with pytest.raises(RecordError, match=r"^StreamEvent\.files: expected an integer or null"):
        stream.emit("h1", "t", None, {"event": "syncing", "files": "3", "bytes": 100})
    validator = jsonschema.Draft202012Validator(json.loads((schemas.SCHEMAS / "run-event.json").read_text()))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["syncing", "row", "end"]
    for line in lines:
        validator.validate(line)
    assert not validator.is_valid({**lines[0], "files": "3"})
    assert not validator.is_valid({**lines[2], "ended": "yes"})
    assert not validator.is_valid({**lines[1], "regimes": {"warm": {"speedup": "x"}}})  # a row kind's own rule


def test_inv_check_shows_the_local_runs_events_read_as_records_and_skips_a_line_of_another_shape(tmp_path):
    from kpremote.runs.check import follow_events

    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 1, "event": "phase", "phase": "build"}\n{"t": 2, "event": "row", "i": "one"}\nnot json\n'
                    '{"t": 3, "event": "warning", "message": "m"}\n')
    seen: list[dict] = []
    follow_events(path, lambda: 0, seen.append)
    assert seen == [{"t": 1, "event": "phase", "phase": "build"}, {"t": 3, "event": "warning", "message": "m"}]
