"""A sync stream's header line is a record (results.SyncHeader): the client writes it through the record, the agent
reads it with from_json, so a field of another type is refused in one line naming it and nothing is applied; its
schema (docs/schemas/sync-header.json) is drawn from it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from kpremote.agent.protocol import SYNC_VERSION, SyncError
from kpremote.agent.results import SyncHeader
from kpremote.agent.sync import read_header
from kpremote.results import schemas

REPO = Path(__file__).resolve().parents[2]
HEADER = {"version": SYNC_VERSION, "base_digest": "b", "new_digest": "n", "changed": ["a.py"], "deleted": ["old.py"],
          "sizes": {"a.py": 3}, "full": False, "provenance": {"git_commit": "abc"}}


def _read(header: dict) -> SyncHeader:
    return read_header(io.BytesIO(json.dumps(header).encode() + b"\n"))


def test_a_well_typed_header_is_read_as_its_record_and_fits_its_schema():
    header = _read(HEADER)
    assert (header.changed, header.deleted, header.sizes, header.full) == (["a.py"], ["old.py"], {"a.py": 3}, False)
    assert header.to_json() == HEADER
    jsonschema.Draft202012Validator(json.loads((schemas.SCHEMAS / "sync-header.json").read_text())).validate(HEADER)


@pytest.mark.parametrize("change, said", [
    ({"sizes": {"a.py": "3"}}, "sync header.sizes.a.py: expected an integer, got '3'; nothing was applied"),
    ({"sizes": {"a.py": True}}, "sync header.sizes.a.py: expected an integer, got True; nothing was applied"),
    ({"changed": "a.py"}, "sync header.changed: expected a list of a string, got 'a.py'; nothing was applied"),
    ({"deleted": [3]}, "sync header.deleted[0]: expected a string, got 3; nothing was applied"),
    ({"full": "yes"}, "sync header.full: expected true or false, got 'yes'; nothing was applied"),
    ({"new_digest": None}, "sync header.new_digest: expected a string, got None; nothing was applied"),
    ({"provenance": []}, "sync header.provenance: expected an object of anything, got []; nothing was applied"),
    ({"sizes": {}}, "sync header has no valid size for every changed file"),
])
def test_a_mistyped_header_is_refused_naming_its_field(change, said):
    with pytest.raises(SyncError) as caught:
        _read({**HEADER, **change})
    assert str(caught.value) == said
    assert not jsonschema.Draft202012Validator(
        json.loads((schemas.SCHEMAS / "sync-header.json").read_text())).is_valid({**HEADER, **change}) \
        or change == {"sizes": {}}  # a size for every changed file: read_header's own rule, not the schema's


def test_a_header_that_lacks_a_field_says_which():
    with pytest.raises(SyncError, match=r"^sync header lacks deleted, new_digest; nothing was applied$"):
        _read({key: value for key, value in HEADER.items() if key not in ("deleted", "new_digest")})


def test_the_agent_answers_a_mistyped_header_in_one_json_line_and_applies_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kpremote.agent.sync", "--task", "t", "--root", str(tmp_path)],
                          input=json.dumps({**HEADER, "changed": [], "sizes": {"a.py": "3"}}).encode() + b"\n",
                          capture_output=True, cwd=REPO, timeout=60)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert json.loads(done.stdout)["message"] == "sync header.sizes.a.py: expected an integer, got '3'; nothing was applied"
    assert not (tmp_path / "tasks" / "t" / "workspace" / ".kpremote").exists()
