from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kpremote.agent.lease import (
    ArchMismatch,
    BadRequest,
    GpuNotFound,
    IdlePolicy,
    NoIdleGpu,
    acquire,
    adopt,
    arch_refusal,
    holders,
    idle_verdict,
    lock_path,
)
from kpremote.agent.nvml import GpuState, snapshot


def lease(root: Path, **kwargs):
    kwargs.setdefault("policy", IdlePolicy())
    kwargs.setdefault("arch", "any")
    kwargs.setdefault("run_id", "20250101-000000-aaaaaa")
    kwargs.setdefault("task", "t")
    return acquire(root, **kwargs)


def test_idle_policy_from_json():
    assert IdlePolicy.from_json(None) == IdlePolicy(2048, 5, False)
    assert IdlePolicy.from_json('{"max_memory_mib": 100, "allow_processes": true}') == IdlePolicy(100, 5, True)
    assert IdlePolicy.from_json({"max_util_pct": 9}) == IdlePolicy(2048, 9, False)
    for bad in ('{"max_mem": 1}', "[1]", "{oops", '{"allow_processes": "yes"}'):
        with pytest.raises(BadRequest):
            IdlePolicy.from_json(bad)


def test_idle_verdict_names_every_reason(make_gpu):
    gpu = GpuState.from_json(make_gpu(0, memory_used_mib=6600, util_pct=40, processes=[{"pid": 7, "name": "python"}]))
    idle, reason = idle_verdict(gpu, IdlePolicy())
    assert not idle
    assert reason == "1 compute process (pid 7 python); 6600 MiB used > 2048 MiB; util 40% > 5%"
    at_the_limit = GpuState.from_json(make_gpu(1, memory_used_mib=2048, util_pct=5))
    assert idle_verdict(at_the_limit, IdlePolicy()) == (True, "idle")
    with_process = GpuState.from_json(make_gpu(2, processes=[{"pid": 7}]))
    assert idle_verdict(with_process, IdlePolicy(allow_processes=True))[0]
    assert not idle_verdict(with_process, IdlePolicy())[0]


H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}  # as NVML reports an H100 SXM
B200 = {"name": "NVIDIA B200", "cc": [10, 0], "memory_total_mib": 183359}


def test_the_arch_gate_knows_the_model_not_only_the_compute_capability(make_gpu):
    h200, h100, b200 = (GpuState.from_json(make_gpu(i, **model)) for i, model in enumerate([{}, H100, B200]))
    assert arch_refusal("h200", h200) is None and arch_refusal("H100", h100) is None
    assert arch_refusal("b200", b200) is None
    assert h100.cc == h200.cc == (9, 0)  # what the gate alone used to look at
    assert arch_refusal("h200", h100) == "GPU 1 (NVIDIA H100 80GB HBM3) is not an H200"
    assert arch_refusal("h100", h200) == "GPU 0 (NVIDIA H200) is not an H100"
    assert arch_refusal("b200", h200) == "GPU 0 (NVIDIA H200) is not a B200"
    for name in ("NVIDIA GH200 480GB", "NVIDIA GB200"):  # other products that contain the name
        assert arch_refusal("h200", GpuState.from_json(make_gpu(0, name=name))) is not None
    assert arch_refusal("h200", GpuState.from_json(make_gpu(0, name="NVIDIA H200 NVL"))) is None
    # memory is the second signal, compute capability the third
    small = GpuState.from_json(make_gpu(0, memory_total_mib=81559))
    assert arch_refusal("h200", small) == "GPU 0 (NVIDIA H200) has 80 GiB of memory (an H200 has 130-150 GiB)"
    old_cc = GpuState.from_json(make_gpu(0, cc=[8, 0]))
    assert arch_refusal("h200", old_cc) == "GPU 0 (NVIDIA H200) has compute capability 8.0 (an H200 has 9.0)"
    assert arch_refusal("any", old_cc) is None and arch_refusal("auto", h100) is None
    with pytest.raises(BadRequest, match="unknown arch 'a100'"):
        arch_refusal("a100", h200)


def test_a_task_may_name_several_arches(make_gpu):
    h200, h100, b200 = (GpuState.from_json(make_gpu(i, **model)) for i, model in enumerate([{}, H100, B200]))
    for arch in ("h200,b200", ["h200", "b200"], ("B200", "H200")):
        assert arch_refusal(arch, h200) is None and arch_refusal(arch, b200) is None
    assert arch_refusal("h200,b200", h100) == "GPU 1 (NVIDIA H100 80GB HBM3) is not an H200 and is not a B200"
    with pytest.raises(BadRequest, match="unknown arch 'a100'"):
        arch_refusal("h200,a100", h200)


def test_acquire_picks_least_memory_then_highest_index(tmp_path, nvml_fixture, make_gpu):
    nvml_fixture(
        make_gpu(0, memory_used_mib=10),
        make_gpu(1, memory_used_mib=3),
        make_gpu(2, memory_used_mib=3),
        make_gpu(3, memory_used_mib=9000),
    )
    first = lease(tmp_path)
    second = lease(tmp_path, run_id="20250101-000000-bbbbbb")
    third = lease(tmp_path, run_id="20250101-000000-cccccc")
    assert [first.gpu.index, second.gpu.index, third.gpu.index] == [2, 1, 0]
    with pytest.raises(NoIdleGpu) as error:
        lease(tmp_path)
    table = str(error.value)
    assert table.startswith("no idle GPU on ")
    assert "run 20250101-000000-bbbbbb (t, pid" in table and "9000 MiB used > 2048 MiB" in table
    assert holders(tmp_path)["GPU-00000002-test"]["run_id"] == "20250101-000000-aaaaaa"
    second.release()
    assert set(holders(tmp_path)) == {"GPU-00000000-test", "GPU-00000002-test"}
    assert lease(tmp_path).gpu.index == 1


def test_gpu_can_be_chosen_by_index_or_uuid_but_must_be_free(tmp_path, nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0), make_gpu(1, util_pct=90))
    assert lease(tmp_path, gpu="GPU-00000000-test").gpu.index == 0
    with pytest.raises(NoIdleGpu, match="leased: run"):
        lease(tmp_path, gpu="0")
    with pytest.raises(NoIdleGpu, match=r"GPU 1 on .* is not free\n.*util 90% > 5%"):
        lease(tmp_path, gpu="1")
    with pytest.raises(GpuNotFound, match="no GPU '5'"):
        lease(tmp_path, gpu="5")


def test_gpu_that_got_busy_after_locking_is_let_go(tmp_path, nvml_fixture, make_gpu):
    # GPU 1 is the first choice (least memory), but a foreign job lands on it between our look and our lock.
    before = [make_gpu(0, memory_used_mib=1), make_gpu(1)]
    after = [make_gpu(0, memory_used_mib=1), make_gpu(1, memory_used_mib=7000)]
    snapshots = iter([before])

    def snapshot_that_changes():
        nvml_fixture(*next(snapshots, after))
        return snapshot()

    got = lease(tmp_path, snapshot_fn=snapshot_that_changes)

    assert got.gpu.index == 0
    assert set(holders(tmp_path)) == {"GPU-00000000-test"}


def test_arch_mismatch_says_which_gpu_was_refused_and_why(tmp_path, nvml_fixture, make_gpu):
    nvml_fixture(make_gpu(0, **H100))
    with pytest.raises(ArchMismatch) as error:
        lease(tmp_path, arch="h200")  # an H100 is compute capability 9.0 as well: the model tells them apart
    assert str(error.value) == "task arch h200 needs an H200: GPU 0 (NVIDIA H100 80GB HBM3) is not an H200"
    nvml_fixture(make_gpu(0), make_gpu(1), make_gpu(2, **H100))
    with pytest.raises(ArchMismatch) as error:
        lease(tmp_path, arch="b200")
    assert str(error.value) == ("task arch b200 needs a B200: GPUs 0,1 (NVIDIA H200) are not a B200; "
                                "GPU 2 (NVIDIA H100 80GB HBM3) is not a B200")
    with pytest.raises(ArchMismatch, match=r"^task arch h200 needs an H200: GPU 2 \(NVIDIA H100 80GB HBM3\) is not"):
        lease(tmp_path, arch="h200", gpu="2")  # the GPU asked for is refused by name
    assert lease(tmp_path, arch="h200,b200").gpu.index == 1  # an H200 among them: the H100 is never a candidate
    assert lease(tmp_path, arch="h100").gpu.index == 2


def test_wait_polls_until_a_gpu_frees_up(tmp_path, nvml_fixture, make_gpu, monkeypatch):
    monkeypatch.setattr("kpremote.agent.lease.POLL_S", 0.05)
    held = lease(tmp_path)
    threading.Timer(0.3, held.release).start()
    started = time.monotonic()
    assert lease(tmp_path, wait_s=5).gpu.index == 0
    assert 0.25 < time.monotonic() - started < 2
    with pytest.raises(NoIdleGpu):
        lease(tmp_path, wait_s=0.2)


def test_no_gpus_at_all_is_no_idle_gpu(tmp_path, nvml_fixture):
    nvml_fixture()
    with pytest.raises(NoIdleGpu, match="no GPUs visible"):
        lease(tmp_path)


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from kpremote.agent.lease import IdlePolicy, NoIdleGpu, acquire
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        acquire(Path(sys.argv[1]), policy=IdlePolicy(), arch="any", run_id=sys.argv[2], task="t")
        print("won", flush=True)
    except NoIdleGpu:
        print("lost", flush=True)
    sys.stdin.readline()
    """
)


def spawn_holder(root: Path, run_id: str, env: dict[str, str], python: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [python, "-c", HOLDER, str(root), run_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_two_processes_racing_for_one_gpu_exactly_one_wins(tmp_path, agent_env, python):
    racers = [spawn_holder(tmp_path, f"20250101-000000-00000{n}", agent_env, python) for n in range(3)]
    for proc in racers:
        proc.stdin.write("go\n")
    for proc in racers:
        proc.stdin.flush()
    try:
        outcomes = sorted(proc.stdout.readline().strip() for proc in racers)
        assert outcomes == ["lost", "lost", "won"]
        assert len(holders(tmp_path)) == 1
    finally:
        for proc in racers:
            proc.stdin.close()
            proc.wait(timeout=10)


def test_lease_of_a_killed_holder_is_reclaimed(tmp_path, agent_env, python):
    holder = spawn_holder(tmp_path, "20250101-000000-dead00", agent_env, python)
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline() == "won\n"
    record = holders(tmp_path)["GPU-00000000-test"]
    assert (record["pid"], record["run_id"]) == (holder.pid, "20250101-000000-dead00")
    with pytest.raises(NoIdleGpu):
        lease(tmp_path)

    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)

    assert "dead00" in lock_path(tmp_path, "GPU-00000000-test").read_text()  # stale record left behind ...
    assert holders(tmp_path) == {}  # ... but nobody holds the lock
    reclaimed = lease(tmp_path, run_id="20250101-000000-a1a1a1")
    assert holders(tmp_path)["GPU-00000000-test"]["run_id"] == "20250101-000000-a1a1a1"
    reclaimed.release()


def test_adopt_takes_over_an_inherited_lease_and_names_the_new_holder(tmp_path, nvml_fixture):
    original = lease(tmp_path)
    inherited = os.dup(original.fd)  # what a child sees of the fd `start` passed to it
    original.hand_over()

    adopted = adopt(inherited, original.gpu, original.path)

    assert holders(tmp_path)["GPU-00000000-test"]["pid"] == os.getpid()
    with pytest.raises(NoIdleGpu):
        lease(tmp_path)
    with adopted:
        pass
    assert holders(tmp_path) == {}
