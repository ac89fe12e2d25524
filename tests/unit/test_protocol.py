"""The seam's rules: every side that checks a name agrees, the error tree in the docstring is the real one, and the
client's idle defaults are the agent's."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from kpremote.agent import protocol
from kpremote.agent.protocol import (
    AgentError,
    ExitCode,
    IdlePolicy,
    is_name,
    is_run_id,
    new_run_id,
)

NAMES = ["demo", "h200_rmsnorm", "a.b-c_9", "0", "A" * 100, "A" * 101]
NOT_NAMES = ["", ".", "..", "-x", "_x", ".hidden", "a/b", "../demo", "de mo", "a;b", "é", "a\nb", "a\0b"]


def accepted_by_every_side(name: str, tmp_path: Path) -> dict[str, bool]:
    """Whether each place that checks a task name accepts name (True) or refuses it (False)."""
    from kpremote.hosts import config
    from kpremote.runs import fetch
    from kpremote.task import scaffold, taskdir
    from kpremote.agent import sync as agent_sync
    from kpremote.agent.run import runpaths
    from kpremote.errors import KpremoteError

    def accepts(check, *refusals: type[BaseException]) -> bool:
        try:
            check()
        except refusals:
            return False
        return True

    try:  # a folder of that name, wherever one can be made: a refusal must come from the name rule
        (tmp_path / "kernels" / name).mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError):
        pass
    return {
        "protocol": is_name(name),
        "config": re.fullmatch(config.NAME_PATTERN, name) is not None,
        "sync": accepts(lambda: taskdir.find_task(tmp_path / "kernels", name), KpremoteError),
        "fetch": accepts(lambda: fetch.checked_name(name, "run id"), KpremoteError),
        "agent sync": accepts(lambda: agent_sync.check_task_name(name), agent_sync.SyncError),
        "agent runs": accepts(lambda: runpaths.validate_task_name(name), AgentError),
        "scaffold": accepts(lambda: scaffold.new_task(name, tmp_path / "new"), scaffold.ScaffoldError),
    }


@pytest.mark.parametrize("name", NAMES + NOT_NAMES)
def test_every_side_applies_the_one_name_rule(name, tmp_path):
    verdicts = accepted_by_every_side(name, tmp_path)
    scaffold_ok = verdicts.pop("scaffold")
    assert set(verdicts.values()) == {name in NAMES}, verdicts
    assert scaffold_ok == (name in NAMES and len(name) <= 100)  # new-task also caps the length


def test_run_ids_follow_their_rule_and_sort_by_time():
    from datetime import datetime, timezone

    early = new_run_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    assert is_run_id(early) and early.startswith("20260102-030405-")
    assert early < new_run_id() and not is_run_id("20260102-030405") and not is_run_id(None)


def agent_errors() -> list[type[AgentError]]:
    found, pending = [], [AgentError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending += cls.__subclasses__()
    return [cls for cls in found if cls.__module__ == protocol.__name__]


def test_the_error_tree_in_the_docstring_is_the_real_one():
    drawn = {m.group(1): (m.group(2), int(m.group(3))) for m in re.finditer(
        r"(\w+)\s+kind \"(\w+)\",\s+exit (\d+)", protocol.__doc__)}
    real = {cls.__name__: (cls.kind, int(cls.exit_code)) for cls in agent_errors()}
    assert drawn == real
    for cls in agent_errors():
        assert cls.exit_code in set(ExitCode)


def test_each_error_kind_is_distinct():
    kinds = [cls.kind for cls in agent_errors()]
    assert len(kinds) == len(set(kinds))


def test_the_clients_idle_defaults_are_the_agents():
    from kpremote.hosts.hostrules import IDLE_FIELDS

    defaults = {field: default for field, (_, default) in IDLE_FIELDS.items()}
    assert defaults == dataclasses.asdict(IdlePolicy())
    assert IdlePolicy.from_json(json.dumps(defaults)) == IdlePolicy()


@pytest.mark.parametrize("value, message", [
    ("[1]", "must be a JSON object"), ('{"max_util": 1}', "unknown keys max_util"),
    ('{"allow_processes": 1}', "allow_processes must be true or false"), ("{", "not a JSON object"),
])
def test_a_bad_idle_policy_is_a_bad_request(value, message):
    with pytest.raises(protocol.BadRequest, match=message):
        IdlePolicy.from_json(value)


def test_a_start_with_a_profile_request_is_a_profile_run_and_any_other_a_timing_run():
    request = protocol.ProfileRequest(side="candidate").to_json()
    assert protocol.RUNNERS[protocol.run_kind(request)] == "kpremote.agent.ncu.profile"
    assert protocol.RUNNERS[protocol.run_kind(None)] == "kpremote.agent.run.runner"


def test_the_manifest_digest_depends_on_names_and_contents_not_on_order():
    one = protocol.manifest_digest({"a": "1", "b/c": "2"})
    assert one == protocol.manifest_digest({"b/c": "2", "a": "1"})
    assert one != protocol.manifest_digest({"a": "1", "b/d": "2"}) != protocol.manifest_digest({"a": "1", "b/c": "3"})
