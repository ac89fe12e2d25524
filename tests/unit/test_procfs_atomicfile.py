"""The agent's small helpers: what /proc says about processes (and the kills built on it), the one atomic write,
and the disk reserve a run keeps for its final record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import suppress

import pytest

from kpremote.agent import procfs
from kpremote.agent.atomicfile import write_atomically, write_json_atomically
from kpremote.agent.run.guards import RESERVE_BYTES, DiskReserve


@pytest.fixture
def family():
    """A child in its own process group that starts a grandchild; both killed afterwards."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while not procfs.descendants(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield child
    with suppress(ProcessLookupError):  # kill_tree's test has killed it already
        os.killpg(child.pid, 9)
    child.wait()


def test_descendants_and_group_members_find_the_child_and_grandchild(family):
    grandchildren = procfs.descendants(family.pid)
    assert len(grandchildren) == 1
    assert family.pid in procfs.descendants(os.getpid())
    assert sorted(procfs.group_members(family.pid)) == sorted([family.pid, *grandchildren])


def test_a_zombie_is_not_alive_and_a_reaped_pid_does_not_exist():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while procfs.proc_stat(child.pid).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert procfs.pid_exists(child.pid) and not procfs.is_alive(child.pid)
    child.wait()
    assert not procfs.pid_exists(child.pid) and procfs.proc_stat(child.pid) is None
    assert procfs.command_line(child.pid) is None


def test_the_start_time_names_this_process_and_its_command_line_is_readable():
    me = procfs.proc_stat(os.getpid())
    assert me.ppid == os.getppid() and me.pgrp == os.getpgrp() and me.alive
    assert procfs.start_ticks(os.getpid()) == me.start_ticks > 0
    assert sys.executable.rsplit("/", 1)[-1] in procfs.command_line(os.getpid())


def test_an_odd_command_name_does_not_confuse_the_fields():
    line = "42 (a) b (c) ) S 7 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0"
    stat = procfs._parse(42, line)
    assert (stat.state, stat.ppid, stat.pgrp, stat.start_ticks) == ("S", 7, 42, 12345)


def test_kill_tree_takes_the_child_and_what_it_started_and_reaps_the_child(family):
    grandchildren = procfs.descendants(family.pid)
    procfs.kill_tree(family)
    assert family.returncode == -9
    deadline = time.monotonic() + 10
    while any(procfs.is_alive(pid) for pid in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(procfs.is_alive(pid) for pid in grandchildren)


KILL_STRAYS_IN_A_GROUP = """
import json, subprocess, sys
from kpremote.agent import procfs
mate = subprocess.Popen(["sleep", "30"])  # in this group
apart = subprocess.Popen(["sleep", "30"], start_new_session=True)  # in a group of its own
follower = subprocess.run([sys.executable, "-c", "from kpremote.agent import procfs; print(procfs.kill_strays())"],
                          capture_output=True, text=True)  # a member of this group that does not lead it
mate_after_follower = procfs.is_alive(mate.pid)
killed = procfs.kill_strays()  # this process leads its group
mate.wait()
print(json.dumps({"follower": follower.stdout.strip(), "mate_after_follower": mate_after_follower,
                  "killed": killed, "mate": mate.pid, "mate_rc": mate.returncode,
                  "apart_alive": procfs.is_alive(apart.pid)}))
apart.kill()
"""


def test_kill_strays_kills_only_in_a_group_it_leads_and_only_that_group():
    done = subprocess.run([sys.executable, "-c", KILL_STRAYS_IN_A_GROUP], capture_output=True, text=True,
                          timeout=60, start_new_session=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["follower"] == "[]" and seen["mate_after_follower"]  # not its group to clear: nothing killed
    assert seen["killed"] == [seen["mate"]] and seen["mate_rc"] == -9  # its own group: the mate, not itself
    assert seen["apart_alive"]  # another group is left alone


def test_a_disk_reserve_holds_its_room_until_given_back(tmp_path):
    reserve = DiskReserve(tmp_path / ".disk-reserve")
    reserve.claim()
    assert reserve.path.stat().st_size == RESERVE_BYTES
    reserve.give_back()
    reserve.give_back()  # twice is harmless: the run gives it back once more on its way out
    assert not reserve.path.exists()


def test_an_atomic_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deep" / "state.json"
    write_json_atomically(path, {"a": 1})
    write_json_atomically(path, {"b": [1, 2]}, indent=1)
    assert json.loads(path.read_text()) == {"b": [1, 2]} and path.read_text().startswith("{\n")
    write_atomically(path, b"\0bytes")
    assert path.read_bytes() == b"\0bytes" and os.listdir(path.parent) == ["state.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = write_atomically(tmp_path / "results.md", "old")
    with pytest.raises(TypeError):
        write_atomically(path, 3)  # type: ignore[arg-type] - fails inside the write, after the temporary exists
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["results.md"]
