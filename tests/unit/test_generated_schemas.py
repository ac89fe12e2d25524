"""docs/schemas/results.json is drawn from the records (kpremote.results.schemas): the committed file is what the
records draw today, a record that changes is seen, and what the schema refuses from_json refuses too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest

from kpremote.agent.record import Record, absent_fields, json_schema, newer_fields, typed
from kpremote.agent.results import RunResults
from kpremote.results import schemas


def test_every_generated_schema_is_what_its_records_draw_today():
    for name in schemas.GENERATED:
        committed = (schemas.SCHEMAS / f"{name}.json").read_text(encoding="utf-8")
        assert committed == schemas.draw(name), f"docs/schemas/{name}.json: run python -m kpremote.results.schemas"
    assert schemas.main(["--check"]) == 0


def test_a_record_that_gains_a_field_no_longer_matches_its_committed_schema(monkeypatch, capsys):
    @dataclass
    class Wider(RunResults):
        added_in_a_branch: int | None = None

    monkeypatch.setattr(schemas, "RunResults", Wider)
    assert schemas.main(["--check"]) == 1
    assert "results.json: differs from its records" in capsys.readouterr().out
    assert "added_in_a_branch" in schemas.draw("results")


@dataclass
class Part(Record):
    """A nested record."""

    n: int = 0
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


@dataclass
class Whole(Record):
    """A record of every kind of field."""

    SCHEMA = {"required": ["name"]}

    name: str = typed("?", enum=["a", "b"])
    # above a field with no comment of its own: that field's
    flag: bool = False
    ratio: float | None = None  # a ratio, said on its line
    # and on the line below
    parts: list[Part] = typed(factory=list)  # its own
    counts: dict[str, int] | None = None
    part: Part | None = None
    anything: Any = None
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


def test_the_schema_of_a_record_follows_its_fields_and_types():
    drawn = json_schema(Whole, {})
    assert drawn["additionalProperties"] is False and drawn["required"] == ["name"]
    assert drawn["description"] == "A record of every kind of field."
    assert drawn["properties"] == {
        "name": {"type": "string", "enum": ["a", "b"]},
        "ratio": {"type": ["number", "null"], "description": "a ratio, said on its line and on the line below"},
        "flag": {"type": "boolean", "description": "above a field with no comment of its own: that field's"}, "parts": {"type": "array", "items": {"$ref": "#/$defs/Part"}, "description": "its own"},
        "counts": {"anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "null"}]},
        "part": {"anyOf": [{"$ref": "#/$defs/Part"}, {"type": "null"}]}, "anything": {}}
    assert drawn["$defs"]["Part"]["properties"] == {"n": {"type": "integer"}}
    assert drawn["$defs"]["Part"]["additionalProperties"] is False


@pytest.mark.parametrize("document, fits", [
    ({"name": "a", "ratio": 2, "parts": [{"n": 1}], "counts": {"x": 3}, "anything": [1]}, True),
    ({"name": "a", "ratio": "fast"}, False),
    ({"name": "a", "flag": 1}, False),
    ({"name": "a", "parts": [{"n": True}]}, False),
    ({"name": "a", "parts": [{"n": 1.5}]}, False),
    ({"name": "a", "counts": {"x": None}}, False),
    ({"name": "a", "part": "p"}, False),
])
def test_the_schema_and_from_json_agree_on_what_is_of_the_right_type(document, fits):
    validator = jsonschema.Draft202012Validator(json_schema(Whole, {}))
    assert validator.is_valid(document) is fits
    if fits:
        assert Whole.from_json(document).to_json() == document
    else:
        with pytest.raises(ValueError, match=r"^Whole\.\w+.*: expected "):
            Whole.from_json(document)


def test_a_key_no_record_declares_is_refused_by_the_schema_and_kept_apart_by_the_reader():
    validator = jsonschema.Draft202012Validator(json_schema(Whole, {}))
    assert not validator.is_valid({"name": "a", "from_a_newer_harness": 1})
    assert Whole.from_json({"name": "a", "from_a_newer_harness": 1}).newer == {"from_a_newer_harness": 1}
    committed = json.loads((schemas.SCHEMAS / "results.json").read_text())
    assert committed["additionalProperties"] is False
    assert all(d["additionalProperties"] is False for name, d in committed["$defs"].items() if name[0].isupper())
