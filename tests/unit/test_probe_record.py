"""The probe's GPU record has two ends: the agent fills it from NVML (the seam's protocol.GpuState, plus the lease's
fields) and the client reads it into gpu-status's documented model (gpustatus.GpuReport, which adds the idle verdict
and the lease). They are declared apart on purpose (each side types the record for its own job), so this test keeps
them one record: every field the client reads is one the agent sends, under the same name."""

from __future__ import annotations

import io
import json
from dataclasses import fields
from pathlib import Path

import jsonschema
from rich.console import Console
from unit.helpers import gpu

from kpremote.agent.protocol import GpuState
from kpremote.hosts.gpustatus import GpuReport, gpu_status_body, probe_host
from kpremote.views.gpus import GpuViewOptions, gpu_view

AGENT_ONLY = {"l2_bytes"}  # sent, but gpu-status does not show it


def test_the_client_reads_each_field_of_the_agents_gpu_record_by_its_name(host, agent, gpus) -> None:
    gpus(gpu(0, temperature_c=41, power_w=120.5, sm_clock_mhz=1980, sm_clock_max_mhz=1980,
             clock_event_reasons=["gpu_idle"], processes=[{"pid": 7, "name": "python", "used_mib": 500}]))
    [sent] = agent.call_json("probe", "--idle", host.idle.to_json(), "--arch", host.arch)["gpus"]
    assert set(sent) - AGENT_ONLY == set(GpuReport.model_fields)  # what the agent sends is what the client reads
    assert {f.name for f in fields(GpuState)} <= set(sent)
    [read] = probe_host(host, agent).gpus
    shown = {k: v for k, v in sent.items() if k not in AGENT_ONLY | {"processes"}}
    assert read.model_dump(exclude={"processes"}) == {**shown, "cc": tuple(sent["cc"])}
    assert [p.model_dump() for p in read.processes] == sent["processes"]


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
