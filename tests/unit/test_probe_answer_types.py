"""The GPU probe's answer (protocol.Snapshot, each GPU a ProbedGpu) is read with typed from_json on the client: a field
of another type is one line naming the GPU and field, and the host counts as not asked (gpu-status exits 2)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kpremote.agent.protocol import GpuState, ProbedGpu, Snapshot
from kpremote.agent.record import RecordError
from kpremote.hosts.gpustatus import probe_host

GPU = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "cc": [9, 0], "memory_used_mib": 1, "memory_total_mib": 2,
       "util_pct": 0, "temperature_c": 30, "power_w": 70.5, "sm_clock_mhz": 345, "sm_clock_max_mhz": 1980,
       "clock_event_reasons": [], "processes": [], "l2_bytes": None, "lease": None, "idle": True, "reason": "idle",
       "arch_ok": True, "arch_reason": None}
ANSWER = {"hostname": "h", "driver": "570", "source": "nvml", "gpus": [GPU], "error": None}


def test_a_well_typed_answer_reads_back_as_it_was_written():
    snapshot = Snapshot.from_json(ANSWER, ProbedGpu)
    assert snapshot.to_json() == ANSWER and isinstance(snapshot.gpus[0], ProbedGpu)


@pytest.mark.parametrize("answer, said", [
    ({**ANSWER, "gpus": [{**GPU, "memory_used_mib": "1"}]},
     "GPU record 0.memory_used_mib: expected an integer, got '1'"),
    ({**ANSWER, "gpus": [{**GPU, "cc": "9.0"}]}, "GPU record 0.cc: expected a list of an integer, got '9.0'"),
    ({**ANSWER, "gpus": [{**GPU, "power_w": "high"}]}, "GPU record 0.power_w: expected a number or null, got 'high'"),
    ({**ANSWER, "gpus": [{**GPU, "idle": "yes"}]}, "GPU record 0.idle: expected true or false, got 'yes'"),
    ({**ANSWER, "gpus": [{**GPU, "processes": {"pid": 1}}]}, "GPU record 0.processes: expected a list of"),
    ({**ANSWER, "driver": 570}, "probe answer.driver: expected a string or null, got 570"),
    ({**ANSWER, "gpus": {"0": GPU}}, "probe answer.gpus: expected a list of an object of anything"),
    ([ANSWER], "probe answer: expected a JSON object"),
])
def test_a_mistyped_field_is_refused_naming_it(answer, said):
    with pytest.raises(RecordError) as caught:
        Snapshot.from_json(answer, ProbedGpu)
    assert str(caught.value).startswith(said)


def test_the_agent_reads_its_gpu_records_typed_too():
    with pytest.raises(ValueError, match=r"^GPU record 0\.util_pct: expected an integer or null, got 'busy'$"):
        GpuState.from_json({key: value for key, value in GPU.items() if key not in ProbedGpu.PROBE_FIELDS}
                           | {"util_pct": "busy"})


def test_gpu_status_says_a_mistyped_answer_in_one_line_and_counts_the_host_as_not_asked():
    host = SimpleNamespace(name="h1", is_cluster=False, transport="ssh", arch="h200",
                           idle=SimpleNamespace(to_json=lambda: "{}"))
    agent = SimpleNamespace(call_json=lambda *args: {**ANSWER, "gpus": [{**GPU, "idle": "yes"}]})
    report = probe_host(host, agent)  # type: ignore[arg-type]
    assert (report.ok, report.answered, report.gpus) == (False, False, [])  # answered False: exit 2 (finish_asking)
    assert report.error == "a malformed probe answer: GPU record 0.idle: expected true or false, got 'yes'"
    good = probe_host(host, SimpleNamespace(call_json=lambda *args: ANSWER))  # type: ignore[arg-type]
    assert (good.ok, good.answered, good.gpus[0].idle) == (True, True, True)
