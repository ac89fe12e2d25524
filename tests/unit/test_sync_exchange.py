"""sync.exchange, the one owner of the sync conversation: the first request over the channel it is given, the
need-full retry over `resend`, and the tree remembered only once the agent holds it."""

from __future__ import annotations

import json

import pytest
from unit.helpers import TASK

from kpremote.errors import HostError
from kpremote.runs.sync import exchange, over_sync_apply, remembered_tree
from kpremote.task.taskdir import find_task
from kpremote.task.taskscan import scan_task


def header_of(request: bytes) -> dict:
    return json.loads(request.split(b"\n", 1)[0])


def applied(request: bytes) -> dict:
    """What the agent answers once it has applied the request."""
    return {"need_full": False, "manifest_digest": header_of(request)["new_digest"]}


def test_a_need_full_answer_is_retried_once_over_resend_with_the_exact_difference(host, kernels):
    tree = scan_task(find_task(kernels, TASK))
    first: list[bytes] = []
    again: list[bytes] = []

    def start_with_sync(request: bytes) -> dict:
        first.append(request)
        return {"need_full": True, "have": {"task.toml": tree.hashes["task.toml"], "stale.txt": "0" * 64}}

    done = exchange(host, tree, start_with_sync, resend=lambda request: again.append(request) or applied(request))
    assert len(first) == 1 and header_of(first[0])["full"] is False
    [retry] = [header_of(request) for request in again]
    assert retry["full"] is True and retry["deleted"] == ["stale.txt"]
    assert "task.toml" not in retry["changed"] and done.files_sent == len(tree.files) - 1
    assert done.bytes_sent == len(first[0]) + len(again[0])
    assert remembered_tree(host, TASK) == tree.hashes


def test_over_sync_apply_a_sync_the_agent_takes_is_one_call(agent, kernels):
    done = exchange(agent.host, scan_task(find_task(kernels, TASK)), over_sync_apply(agent, TASK))
    assert [call[0] for call in agent.transport.calls] == ["sync-apply"] and done.answer["received_files"] == 5


def need_full_every_time(tries: list[bytes]):
    def answer(request: bytes) -> dict:
        tries.append(request)
        return {"need_full": True, "have": {}}

    return answer


def test_sync_apply_gets_two_tries_and_then_the_sync_is_an_error_with_nothing_remembered(host, kernels):
    tree = scan_task(find_task(kernels, TASK))
    tries: list[bytes] = []
    with pytest.raises(HostError, match=f"the workspace of {TASK} changed while syncing"):
        exchange(host, tree, need_full_every_time(tries))
    assert len(tries) == 2 and header_of(tries[1])["full"] is True
    assert remembered_tree(host, TASK) == {}


def test_a_runs_own_channel_carries_one_try_before_sync_applys_two(host, kernels):
    """Several runs of one task at once: each start may find the workspace changed by another, twice."""
    tree = scan_task(find_task(kernels, TASK))
    started: list[bytes] = []
    applied_tries: list[bytes] = []
    with pytest.raises(HostError, match="changed while syncing"):
        exchange(host, tree, need_full_every_time(started), resend=need_full_every_time(applied_tries))
    assert (len(started), len(applied_tries)) == (1, 2)

    answers = iter([{"need_full": True, "have": {}}, None])
    done = exchange(host, tree, need_full_every_time([]),
                    resend=lambda request: next(answers) or applied(request))
    assert done.plan.full and remembered_tree(host, TASK) == tree.hashes


def test_an_answer_for_another_tree_is_refused_and_not_remembered(host, kernels):
    tree = scan_task(find_task(kernels, TASK))
    with pytest.raises(HostError, match="reports tree"):
        exchange(host, tree, lambda request: {"need_full": False, "manifest_digest": "other"})
    assert remembered_tree(host, TASK) == {}
