"""The seal on a side's machinery (kpremote/agent/harness/seal.py): what task code replaces after the seal is named."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest
import torch

from kpremote.agent.harness import channel, rowlog, seal


@pytest.fixture
def entries():
    return seal.take()


def test_an_untouched_process_keeps_its_seal(entries):
    assert seal.broken(entries) == []


def test_a_harness_function_replaced_on_its_module_is_named_and_its_return_heals(entries):
    original = rowlog.write_output_to_fd
    rowlog.write_output_to_fd = lambda fd: None
    try:
        assert seal.broken(entries) == ["kpremote.agent.harness.rowlog.write_output_to_fd"]
    finally:
        rowlog.write_output_to_fd = original
    assert seal.broken(entries) == []


def test_a_swapped_code_object_is_named(entries):
    function = rowlog.write_output_to_fd
    code = function.__code__
    function.__code__ = (lambda fd: None).__code__
    try:
        assert seal.broken(entries) == ["kpremote.agent.harness.rowlog.write_output_to_fd (its code)"]
    finally:
        function.__code__ = code


def test_a_method_set_on_a_class_is_named(entries):
    original = channel.Channel.send_reply
    channel.Channel.send_reply = lambda self, reply: None
    try:
        assert seal.broken(entries) == ["kpremote.agent.harness.channel.Channel.send_reply"]
    finally:
        channel.Channel.send_reply = original


def test_torchs_timer_replaced_is_named_once(entries):
    original = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 0.0
    try:
        assert seal.broken(entries) == ["torch.cuda.Event.elapsed_time"]
    finally:
        torch.cuda.Event.elapsed_time = original


def test_the_standard_library_that_carries_a_reply_is_watched(entries):
    dumps, clock = json.dumps, time.perf_counter
    json.dumps, time.perf_counter = (lambda *a, **k: "{}"), (lambda: 0.0)
    try:
        assert seal.broken(entries) == ["json.dumps", "time.perf_counter"]
    finally:
        json.dumps, time.perf_counter = dumps, clock


def test_a_deleted_name_is_named(entries):
    original = rowlog.write_output_to_fd
    del rowlog.write_output_to_fd
    try:
        assert seal.broken(entries) == ["kpremote.agent.harness.rowlog.write_output_to_fd (deleted)"]
    finally:
        rowlog.write_output_to_fd = original


def test_a_pinned_objects_callables_are_watched():
    holder = types.SimpleNamespace(now=time.perf_counter, count=3)
    entries = seal.take({"clock": holder})
    holder.count = 4  # data: not watched
    assert seal.broken(entries) == []
    holder.now = time.monotonic
    assert seal.broken(entries) == ["clock.now"]


def test_nothing_can_be_set_on_an_immutable_type_so_none_is_recorded(entries):
    labels = {label for *_, label in entries}
    assert "builtins.int" in labels and not any(label.startswith("builtins.int.") for label in labels)
    with pytest.raises(TypeError):
        int.__add__ = None


HOOK_PROBE = r'''
import sys, threading
from kpremote.agent.harness import seal
def sample():
    return {"us": 10.0}
watch = seal.HookWatch((sample.__code__,))
assert watch.set() == [], watch.set()
for name, install in (("settrace", lambda: sys.settrace(lambda *a: None)),
                      ("setprofile", lambda: sys.setprofile(lambda *a: None)),
                      ("cProfile", lambda: __import__("cProfile").Profile().enable())):  # the C API: the same event
    try:
        install()
        print(name, "installed")
    except seal.HookRefused:
        print(name, "refused")
print("trace", sys.gettrace(), "profile", sys.getprofile())
threading.settrace(lambda *a: None)
sys._getframe().f_trace = lambda *a: None
print(watch.set())
'''


def test_a_side_refuses_trace_and_profile_hooks_and_names_each_attempt_and_each_hook_in_place() -> None:
    """Run in a process of its own: the watch's audit hook cannot be removed once installed."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", HOOK_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[:4] == ["settrace refused", "setprofile refused", "cProfile refused", "trace None profile None"]
    named = eval(lines[4])  # noqa: S307 - the probe's own list of strings
    assert named[:2] == ["sys.settrace (refused)", "sys.setprofile (refused)"]
    assert "threading.settrace" in named and "a trace function on the harness's frame <module>()" in named


MONITORING_PROBE = r'''
import sys
from kpremote.agent.harness import seal
def sample():
    return {"us": 10.0}
watch = seal.HookWatch((sample.__code__,))
m = sys.monitoring
m.use_tool_id(4, "reply")
try:
    m.register_callback(4, m.events.PY_RETURN, lambda *a: None)
except seal.HookRefused:
    print("register_callback refused")
m.set_local_events(4, sample.__code__, m.events.PY_RETURN)
print(watch.set())
'''


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_on_python_with_sys_monitoring_a_callback_is_refused_and_a_tool_in_use_named(version: str) -> None:
    """sys.monitoring exists from Python 3.12 (the GPU hosts may run it); this host's CI Python is 3.11."""
    import os
    import shutil
    import subprocess

    pyenv = sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python"))
    found = [p for p in (shutil.which(f"python{version}"), *pyenv) if p]
    python = next((p for p in found if subprocess.run([p, "-c", "0"], capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip(f"no python{version} on this host")  # the 3.11 tests above still run
    root = str(Path(__file__).resolve().parents[2])
    probe = subprocess.run([python, "-c", MONITORING_PROBE], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": root})
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines() == ["register_callback refused",
                                         "['sys.monitoring.register_callback (refused)', 'sys.monitoring tool 4']"]
