from __future__ import annotations

import json
import sys

import pytest

from kpremote.agent import nvml
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
