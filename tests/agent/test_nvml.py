"""The GPU state reader: the NVML fixture, and the real NVML reader against a stand-in pynvml module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kpremote.agent import nvml
from kpremote.agent.run.guards import ForeignWatch
from kpremote.agent.lease import IdlePolicy, NoIdleGpu, acquire, idle_verdict
from kpremote.agent.nvml import GpuState, decode_clock_event_reasons, sm_clock_mhz, snapshot


def test_fixture_gives_every_field_and_defaults_the_optional_ones(nvml_fixture, make_gpu):
    full = make_gpu(
        1,
        util_pct=7,
        temperature_c=40,
        power_w=120.5,
        sm_clock_mhz=1755,
        sm_clock_max_mhz=1980,
        clock_event_reasons=["sw_power_cap"],
        processes=[{"pid": 99, "name": "python", "used_mib": 6600}],
        l2_bytes=52428800,
    )
    nvml_fixture(make_gpu(0), full, driver="570.86.15", hostname="ion-h200-8")

    snap = snapshot()

    assert (snap.source, snap.driver, snap.hostname, snap.error) == ("fixture", "570.86.15", "ion-h200-8", None)
    bare, busy = snap.gpus
    assert bare.cc == (9, 0) and bare.util_pct == 0 and bare.processes == [] and bare.clock_event_reasons == []
    assert bare.temperature_c is None and bare.sm_clock_mhz is None and bare.l2_bytes is None
    assert busy.processes == [{"pid": 99, "name": "python", "used_mib": 6600}]
    assert busy.clock_event_reasons == ["sw_power_cap"] and busy.power_w == 120.5 and busy.l2_bytes == 52428800
    assert GpuState.from_json(busy.to_json()) == busy
    assert json.loads(json.dumps(snap.to_json()))["gpus"][1]["cc"] == [9, 0]


def test_find_by_index_or_uuid(nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0), make_gpu(3))
    snap = snapshot()
    assert snap.find("3").index == 3
    assert snap.find("gpu-00000003-TEST").index == 3
    assert snap.find("1") is None and snap.find("GPU-nope") is None


def test_fixture_is_reread_on_every_call(nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0, sm_clock_mhz=1980))
    assert snapshot().gpus[0].memory_used_mib == 0
    assert sm_clock_mhz("GPU-00000000-test") == 1980

    nvml_fixture(make_gpu(0, memory_used_mib=6600, sm_clock_mhz=1410), make_gpu(1))

    assert [g.memory_used_mib for g in snapshot().gpus] == [6600, 0]
    assert sm_clock_mhz("GPU-00000000-test") == 1410
    assert sm_clock_mhz("GPU-unknown") is None


def test_a_process_decides_once_where_its_readings_come_from(nvml_fixture, make_gpu, monkeypatch, tmp_path):
    """The variable is read at the first reading only (nvml.reader(), the fixture's one seam); the file it named
    stays the source, re-read on every call, whatever the variable says later."""
    nvml_fixture(make_gpu(0))
    assert snapshot().source == "fixture"
    monkeypatch.setenv(nvml.FIXTURE_ENV, str(tmp_path / "elsewhere.json"))
    nvml_fixture(make_gpu(0), make_gpu(1))
    assert (snapshot().error, len(snapshot().gpus)) == (None, 2)
    monkeypatch.delenv(nvml.FIXTURE_ENV)
    assert snapshot().source == "fixture" and nvml.reader() == nvml.FixtureReader(tmp_path / "nvml.json")


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("{not json", "nvml.json"),
        (json.dumps({"gpus": [{"index": 0, "uuid": "GPU-x", "name": "H200", "cc": [9, 0]}]}), "memory_used_mib"),
        (
            json.dumps({"gpus": [{"index": 0, "uuid": "x", "name": "n", "cc": [9, 0], "memory_used_mib": 0,
                                  "memory_total_mib": 1, "memroy": 5}]}),
            "memroy",
        ),
    ],
)
def test_broken_fixture_is_an_error_snapshot_not_an_exception(nvml_fixture, content, complaint):
    path = nvml_fixture()
    path.write_text(content)
    snap = snapshot()
    assert snap.source == "fixture" and snap.gpus == []
    assert complaint in snap.error and "\n" not in snap.error


def test_without_pynvml_the_host_has_no_gpus_and_says_why(monkeypatch):
    monkeypatch.delenv("KPREMOTE_NVML_FIXTURE", raising=False)
    monkeypatch.setattr(nvml, "_nvml_module", None)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now fails

    snap = snapshot()

    assert (snap.source, snap.gpus) == ("none", [])
    assert "nvidia-ml-py" in snap.error
    assert sm_clock_mhz("GPU-anything") is None


def test_clock_event_reason_bits_decode_to_names():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x4 | 0x8) == ["sw_power_cap", "hw_slowdown"]
    assert decode_clock_event_reasons(0x40 | 0x1000) == ["hw_thermal_slowdown", "other_0x1000"]


# ------------------------------------------------------------------ unreadable readings: the lease fails closed


def test_a_null_in_the_fixture_is_an_unreadable_reading_not_a_broken_host(nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0, util_pct=None), make_gpu(1, processes=None), make_gpu(2))

    snap = snapshot()

    assert snap.error is None and [g.index for g in snap.gpus] == [0, 1, 2]
    no_util, no_processes, readable = snap.gpus
    assert (no_util.util_pct, no_util.processes) == (None, [])
    assert (no_processes.util_pct, no_processes.processes) == (0, None)
    assert GpuState.from_json(no_util.to_json()) == no_util and no_processes.to_json()["processes"] is None
    assert idle_verdict(no_util, IdlePolicy()) == (False, "utilization unreadable")
    assert idle_verdict(no_processes, IdlePolicy()) == (False, "process list unreadable")
    assert idle_verdict(no_processes, IdlePolicy(allow_processes=True)) == (True, "idle")  # processes don't matter
    assert idle_verdict(readable, IdlePolicy()) == (True, "idle")


def test_a_process_list_that_turns_unreadable_mid_run_marks_the_row(nvml_fixture, make_gpu):
    watch = ForeignWatch("GPU-00000000-test", set(), 0, 2048)
    nvml_fixture(make_gpu(0))
    assert watch.row_ended() is None
    nvml_fixture(make_gpu(0, processes=None))
    assert watch.row_ended() == "the GPU's process list was unreadable during the run"


# A stand-in for pynvml (the package nvidia-ml-py), so that the real NVML reader runs on a host without a GPU:
# FAKE_NVML_GPUS H100s; FAKE_NVML_FAILS names the readings that raise NVMLError ("1:util,2:processes");
# FAKE_NVML_PIDS the compute processes ("1:4242").
FAKE_PYNVML = '''
import os
from types import SimpleNamespace

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class NVMLError(Exception):
    pass


def _reading(handle, what, value):
    if f"{handle}:{what}" in os.environ.get("FAKE_NVML_FAILS", "").split(","):
        raise NVMLError("Unknown Error")
    return value


def _pids(handle):
    pairs = [entry.split(":") for entry in os.environ.get("FAKE_NVML_PIDS", "").split(",") if entry]
    return [SimpleNamespace(pid=int(pid), usedGpuMemory=500 * 2**20) for index, pid in pairs if int(index) == handle]


def nvmlInit(): pass
def nvmlSystemGetDriverVersion(): return b"570.86.15"
def nvmlDeviceGetCount(): return int(os.environ.get("FAKE_NVML_GPUS", "3"))
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetMemoryInfo(handle): return SimpleNamespace(used=615 * 2**20, total=81559 * 2**20)
def nvmlDeviceGetUtilizationRates(handle): return _reading(handle, "util", SimpleNamespace(gpu=3, memory=0))
def nvmlDeviceGetComputeRunningProcesses(handle): return _reading(handle, "processes", _pids(handle))
def nvmlDeviceGetUUID(handle): return f"GPU-fake-{handle}"
def nvmlDeviceGetName(handle): return b"NVIDIA H100 80GB HBM3"
def nvmlDeviceGetCudaComputeCapability(handle): return (9, 0)
def nvmlDeviceGetTemperature(handle, sensor): return 31
def nvmlDeviceGetPowerUsage(handle): return 74512
def nvmlDeviceGetClockInfo(handle, clock): return 1755
def nvmlDeviceGetMaxClockInfo(handle, clock): return 1980
def nvmlDeviceGetCurrentClocksEventReasons(handle): return _reading(handle, "reasons", 0x4)
def nvmlDeviceGetCurrentClocksThrottleReasons(handle): return _reading(handle, "reasons", 0x4)
'''


@pytest.fixture
def fake_pynvml(tmp_path, monkeypatch) -> Path:
    """The stand-in above, imported as pynvml in this process; its folder, for subprocesses' PYTHONPATH."""
    folder = tmp_path / "fake-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(FAKE_PYNVML)
    spec = importlib.util.spec_from_file_location("pynvml", folder / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_nvml_module", None)
    monkeypatch.delenv(nvml.FIXTURE_ENV, raising=False)
    return folder


def test_the_nvml_reader_turns_nvmls_answers_into_gpu_state(fake_pynvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_PIDS", f"1:{os.getpid()}")

    snap = snapshot()

    assert (snap.source, snap.driver, snap.error, len(snap.gpus)) == ("nvml", "570.86.15", None, 3)
    gpu = snap.gpus[0]
    assert (gpu.index, gpu.uuid, gpu.name, gpu.cc) == (0, "GPU-fake-0", "NVIDIA H100 80GB HBM3", (9, 0))
    assert (gpu.memory_used_mib, gpu.memory_total_mib, gpu.util_pct, gpu.processes) == (615, 81559, 3, [])
    assert (gpu.temperature_c, gpu.power_w, gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (31, 74.5, 1755, 1980)
    assert gpu.clock_event_reasons == ["sw_power_cap"] and gpu.l2_bytes is None
    own_name = Path("/proc/self/comm").read_text().strip()
    assert snap.gpus[1].processes == [{"pid": os.getpid(), "name": own_name, "used_mib": 500}]
    assert sm_clock_mhz("GPU-fake-2") is None  # the stand-in has no handle by UUID: a failed read is None, no raise


def test_the_nvml_reader_fails_closed_when_nvml_cannot_read_utilization_or_processes(fake_pynvml, monkeypatch,
                                                                                     tmp_path):
    monkeypatch.setenv("FAKE_NVML_FAILS", "1:util,2:processes,0:reasons")

    snap = snapshot()

    readable, no_util, no_processes = snap.gpus
    assert (no_util.util_pct, no_processes.processes) == (None, None)
    assert readable.clock_event_reasons == []  # a reading that decides nothing may still default
    assert idle_verdict(no_util, IdlePolicy()) == (False, "utilization unreadable")
    assert idle_verdict(no_processes, IdlePolicy()) == (False, "process list unreadable")
    # The lease prefers the highest index; only GPU 0 can be known to be idle.
    lease = acquire(tmp_path, policy=IdlePolicy(), arch="h100", run_id="20250101-000000-aaaaaa", task="t")
    assert lease.gpu.index == 0
    with pytest.raises(NoIdleGpu) as refused:
        acquire(tmp_path, policy=IdlePolicy(), arch="h100", run_id="20250101-000000-bbbbbb", task="t")
    lease.release()
    table = str(refused.value)
    assert "util   ?%  busy: utilization unreadable" in table and "busy: process list unreadable" in table


def test_an_empty_variable_means_nvml_itself(fake_pynvml, monkeypatch):
    monkeypatch.setenv(nvml.FIXTURE_ENV, "")
    assert isinstance(nvml.reader(), nvml.NvmlReader) and snapshot().source == "nvml"


def test_probe_says_why_an_unreadable_gpu_is_not_idle(fake_pynvml, agent_env, python, tmp_path):
    env = {**agent_env, "FAKE_NVML_FAILS": "0:util,1:processes", "FAKE_NVML_GPUS": "2"}
    env.pop(nvml.FIXTURE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(fake_pynvml), env["PYTHONPATH"]])

    done = subprocess.run([python, "-m", "kpremote.agent", "probe", "--root", str(tmp_path), "--arch", "h100"],
                          env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["source"] == "nvml"
    no_util, no_processes = report["gpus"]
    assert (no_util["util_pct"], no_util["idle"], no_util["reason"]) == (None, False, "utilization unreadable")
    assert (no_processes["processes"], no_processes["idle"], no_processes["reason"]) == (
        None, False, "process list unreadable")
