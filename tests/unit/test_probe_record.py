"""The probe's GPU record is one record, protocol.ProbedGpu (GpuState and the lease's, idle and arch fields): the
agent writes it for each GPU and gpu-status reads it back with the same class, so a field renamed or added on one
side is one on the other; what gpu-status prints and documents is read from it."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, fields
from pathlib import Path

import jsonschema
from rich.console import Console
from unit.helpers import gpu

from kpremote.agent.protocol import GpuState, ProbedGpu
from kpremote.hosts.gpustatus import gpu_status_body, probe_host
from kpremote.views.gpus import GpuViewOptions, gpu_view


def test_the_client_reads_the_agents_gpu_record_with_the_agents_own_class(host, agent, gpus) -> None:
    gpus(gpu(0, temperature_c=41, power_w=120.5, sm_clock_mhz=1980, sm_clock_max_mhz=1980,
             clock_event_reasons=["gpu_idle"], processes=[{"pid": 7, "name": "python", "used_mib": 500}]))
    [sent] = agent.call_json("probe", "--idle", host.idle.to_json(), "--arch", host.arch)["gpus"]
    assert list(sent) == [f.name for f in fields(ProbedGpu)]  # what the agent sends is the record, in its order
    assert {f.name for f in fields(GpuState)} < set(sent) and sent["idle"] is False  # a process runs on it
    assert sent["reason"] == "1 compute process (pid 7 python)"
    [read] = probe_host(host, agent).gpus
    assert isinstance(read, ProbedGpu) and read.to_json() == sent
    [shown] = gpu_status_body([probe_host(host, agent)])["hosts"][0]["gpus"]
    assert shown == {key: value for key, value in asdict(read).items() if key != "l2_bytes"}


def test_a_gpu_record_with_a_field_the_class_lacks_is_refused() -> None:
    record = ProbedGpu(index=0, uuid="GPU-0", name="H200", cc=(9, 0), memory_used_mib=0, memory_total_mib=1,
                       util_pct=0, temperature_c=None, power_w=None, sm_clock_mhz=None, sm_clock_max_mhz=None,
                       clock_event_reasons=[], processes=[], idle=True).to_json()
    assert ProbedGpu.from_json(record).to_json() == record
    try:
        ProbedGpu.from_json({**record, "util": 3})
    except ValueError as exc:
        assert "unknown keys util" in str(exc)
    else:
        raise AssertionError("an unknown key was read")


def test_an_unreadable_gpu_crosses_the_seam_as_null_and_shows_as_unreadable(host, agent, gpus) -> None:
    gpus(gpu(0, util_pct=None), gpu(1, processes=None), gpu(2))
    report = probe_host(host, agent)
    assert report.ok, report.error
    no_util, no_processes, readable = report.gpus
    assert (no_util.util_pct, no_util.idle, no_util.reason) == (None, False, "utilization unreadable")
    assert (no_processes.processes, no_processes.idle, no_processes.reason) == (None, False, "process list unreadable")
    assert readable.idle
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "schemas" / "gpu-status.json").read_text())
    document = json.loads(json.dumps({"schema": "kpremote.gpu-status/1", **gpu_status_body([report])}))
    jsonschema.Draft202012Validator(schema).validate(document)  # null is allowed where a reading may be unreadable
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(gpu_view([report], GpuViewOptions(all=True), width=200))
    lines = console.file.getvalue().splitlines()
    assert "   ? % │" in lines[1] and "│ unreadable" in lines[1] and "busy: utilization unreadable" in lines[1]
    assert "│ unreadable" in lines[2] and "busy: process list unreadable" in lines[2]
    assert "│ idle" in lines[3]
