"""`inv gpu-status` and `inv hosts`, end to end through the real command line and real SSH servers."""

from __future__ import annotations

import json

import pytest

from kpremote.hosts.agentclient import Agent, agent_bundle
from kpremote.hosts.config import load_inventory
from kpremote.hosts.connect import open_transport
from rig import busy_gpu, idle_gpu, run_inv


@pytest.fixture(scope="module")
def fleet(rig):
    a = rig.add_host("fleet-a", gpus=[idle_gpu(0), busy_gpu(1)])
    b = rig.add_host("fleet-b", gpus=[idle_gpu(0, name="NVIDIA B200", cc=[10, 0], memory_total_mib=183359),
                                      idle_gpu(1, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559)],
                     container="sglang_bbuf")
    down = rig.add_host("fleet-down")
    down.stop()
    return a, b, down


def test_gpu_status_shows_every_host_and_survives_one_down(rig, fleet, tmp_path):
    a, b, down = fleet
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [a, b, down], local=False)
    result = run_inv("gpu-status", "--hosts", str(hosts), "--json")
    assert result.returncode == 2, result.stderr  # one host did not answer: unreachable, as run and sync exit
    document = json.loads(result.stdout)
    assert document["schema"] == "kpremote.gpu-status/1"
    by_host = {h["host"]: h for h in document["hosts"]}
    assert [g["idle"] for g in by_host["fleet-a"]["gpus"]] == [True, False]
    assert by_host["fleet-a"]["gpus"][1]["processes"][0]["pid"] == 4242
    assert "memory" in by_host["fleet-a"]["gpus"][1]["reason"] or "process" in by_host["fleet-a"]["gpus"][1]["reason"]
    assert by_host["fleet-a"]["source"] == "fixture"
    # an h200 host entry with a B200 and an H100 on it (the H100 is compute capability 9.0 as the H200 is): the
    # verdict says the arch does not fit, and why
    b200, h100 = by_host["fleet-b"]["gpus"]
    assert (b200["arch_ok"], b200["arch_reason"]) == (False, "GPU 0 (NVIDIA B200) is not an H200")
    assert (h100["arch_ok"], h100["arch_reason"]) == (False, "GPU 1 (NVIDIA H100 80GB HBM3) is not an H200")
    assert by_host["fleet-down"]["ok"] is False
    assert by_host["fleet-down"]["error"].startswith("fleet-down: unreachable")

    table = run_inv("gpu-status", "--hosts", str(hosts), "--host", "fleet-a")
    assert table.returncode == 0, table.stderr
    assert "NVIDIA H200" in table.stdout and "idle" in table.stdout and "busy" in table.stdout


def test_group_selection_and_unknown_host(rig, fleet, tmp_path):
    a, b, _ = fleet
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [a, b], overrides={"fleet-a": {"groups": ["h200"]}})
    result = run_inv("gpu-status", "--hosts", str(hosts), "--host", "h200", "--json")
    assert result.returncode == 0, result.stderr
    assert [h["host"] for h in json.loads(result.stdout)["hosts"]] == ["fleet-a"]
    wrong = run_inv("gpu-status", "--hosts", str(hosts), "--host", "fleet-aa")
    assert wrong.returncode == 2
    assert "unknown host or group 'fleet-aa' — did you mean 'fleet-a'?" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_broken_hosts_file_is_one_clear_line(tmp_path):
    bad = tmp_path / "hosts.toml"
    bad.write_text('[hosts.x]\nssh = "x"\narch = "a100"\n')
    result = run_inv("gpu-status", "--hosts", str(bad))
    assert result.returncode == 2
    assert f"{bad}: [hosts.x] arch = 'a100': allowed:" in result.stderr and "Traceback" not in result.stderr


def test_agent_is_shipped_once_per_version(rig, tmp_path):
    fresh = rig.add_host("fresh")
    host = load_inventory(rig.write_hosts_toml(tmp_path / "hosts.toml", [fresh])).hosts["fresh"]
    digest, _ = agent_bundle()
    first = Agent(host, open_transport(host))
    first.call_json("probe", "--idle", "{}")
    assert first.shipped == 1 and (fresh.root / "agent" / digest / ".complete").exists()
    second = Agent(host, open_transport(host))
    second.call_json("probe", "--idle", "{}")
    assert second.shipped == 0 and second.transport.channels.opened == 1


def test_missing_remote_python_is_one_line(rig, fleet, tmp_path):
    a = fleet[0]
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [a], overrides={"fleet-a": {"python": "/no/such/python3"}})
    result = run_inv("gpu-status", "--hosts", str(hosts), "--host", "fleet-a", "--json")
    assert result.returncode == 2  # the host could not be asked, as `inv run` on it exits
    [report] = json.loads(result.stdout)["hosts"]
    assert report["error"].startswith("fleet-a: remote python '/no/such/python3' not found")


def test_hosts_check_reports_versions_in_parallel(rig, fleet, tmp_path):
    a, b, down = fleet
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [a, b, down])
    result = run_inv("hosts", "--hosts", str(hosts), "--check", "--json")
    assert result.returncode == 2  # fleet-down: unreachable
    rows = {row["name"]: row for row in json.loads(result.stdout)["hosts"]}
    assert rows["fleet-a"]["check"]["torch"] and rows["fleet-a"]["check"]["python"].startswith("3.")
    # the packages build kinds tvm-ffi and cutedsl need, as the host's python has them (None: not installed)
    assert rows["fleet-a"]["check"]["tvm_ffi"] == _installed("apache-tvm-ffi")
    assert "cutlass_dsl" in rows["fleet-a"]["check"] and rows["fleet-a"]["check"]["cutlass_dsl"] == _installed("nvidia-cutlass-dsl")
    assert rows["fleet-b"]["container"] == "sglang_bbuf" and rows["fleet-b"]["check"]["ok"]
    assert rows["fleet-down"]["check"]["ok"] is False
    assert rows["local"]["address"] == "(this machine)"


def _installed(distribution: str):
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
