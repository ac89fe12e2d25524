"""The judge's side of the boundary: replies are JSON or nothing, seeds need the secret, tensors really are shared.

The whole judge runs in test_runner.py and test_adversarial.py (a real run with real side processes); here are
the pieces a regression would quietly break.
"""

from __future__ import annotations

import array
import os
import pickle
import socket
from pathlib import Path

import pytest
import torch

from kpremote.agent.harness import channel, guard
from kpremote.agent.harness.cases import SEED_BITS, derive_seed
from kpremote.agent.harness.channel import HEADER, MAX_REPLY_BYTES, BadReply, Channel


def pair() -> tuple[Channel, Channel]:
    judge_end, side_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel(judge_end), Channel(side_end)


class Boom:
    """A forged pickle: unpickling it creates the file `mark` (this test's own, so concurrent runs cannot mix)."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self):  # what a forged pickle would run in the judge if it were ever unpickled
        return (self.mark.touch, ())


def test_a_side_reply_is_json_or_refused_never_unpickled(tmp_path: Path) -> None:
    judge, side = pair()
    side.send_reply({"ok": True, "us": 12.5})
    assert judge.recv_reply() == {"ok": True, "us": 12.5}
    armed = tmp_path / "armed"
    pickle.loads(pickle.dumps(Boom(armed)))
    assert armed.exists()  # the payload works: its absence below means it was never unpickled
    mark = tmp_path / "unpickled"
    side._send_frame(pickle.dumps(Boom(mark)), [])
    with pytest.raises(BadReply, match="not JSON"):
        judge.recv_reply()
    assert not mark.exists()
    side._send_frame(b"[1, 2]", [])
    with pytest.raises(BadReply, match="not an object"):
        judge.recv_reply()


def test_an_oversized_reply_is_refused_before_it_is_read() -> None:
    judge, side = pair()
    side.sock.sendall(HEADER.pack(MAX_REPLY_BYTES + 1, 0))
    with pytest.raises(BadReply, match=f"at most {MAX_REPLY_BYTES}"):
        judge.recv_reply()


def test_descriptors_a_side_attaches_are_closed_unread() -> None:
    judge, side = pair()
    read_end, write_end = os.pipe()
    before = len(os.listdir("/proc/self/fd"))
    payload = b'{"ok": true}'
    side.sock.sendmsg([HEADER.pack(len(payload), 1)],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end]))])
    side.sock.sendall(payload)
    assert judge.recv_reply() == {"ok": True}
    assert len(os.listdir("/proc/self/fd")) == before  # the received copy was closed
    os.close(read_end)
    os.close(write_end)


def test_commands_carry_shared_cpu_tensors_with_their_layout() -> None:
    judge, side = pair()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[:, 1:4]  # a strided view with an offset: the side must see the same layout
    shared, handle = channel.share_cpu_tensor(view)
    keep, fds = [(shared, handle)], []
    judge.send_command({"op": "case", "inputs": channel.encode_values({"x": shared, "eps": 1e-6}, fds, keep)}, fds)
    command, received = side.recv_command()
    seen = channel.decode_values(command["inputs"], received)
    assert seen["eps"] == 1e-6 and torch.equal(seen["x"], view) and seen["x"].stride() == view.stride()
    seen["x"].fill_(-1.0)  # the side writes; the judge's view is the same memory
    assert bool((shared == -1.0).all())
    for fd in received:
        os.close(fd)
    os.close(handle.fd)


def test_seeds_need_the_secret() -> None:
    one, other = os.urandom(32), os.urandom(32)
    seed = derive_seed(one, "row", "timing", 0)
    assert seed == derive_seed(one, "row", "timing", 0) and 0 <= seed < 2**SEED_BITS
    assert len({derive_seed(one, "row", "timing", k) for k in range(8)}) == 8
    assert seed not in {derive_seed(other, "row", "timing", 0), derive_seed(one, "row", "correctness", 0),
                        derive_seed(one, "row2", "timing", 0)}


def test_the_thread_count_is_read_from_outside() -> None:
    assert guard.thread_count(os.getpid()) == len(os.listdir("/proc/self/task"))
    assert guard.thread_count(2**22 + 12345) is None


def run_one_row(job: dict, announce_ready) -> dict:
    from kpremote.agent.harness import judge
    from kpremote.agent.harness.bench import Bench

    bench = Bench(job)
    try:
        return judge.run_row(bench, job, os.urandom(32), announce_ready)
    finally:
        bench.stop()


def test_every_sample_checked_and_refreshed_inputs_still_pass_an_honest_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.test_runner import REPO, copy_fixture
    from kpremote.agent.harness import judge, sampling

    monkeypatch.setattr(sampling, "CHECK_FRACTION", 1.0)
    monkeypatch.setattr(sampling, "REFRESH_CHANCE", 1.0)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    task = copy_fixture(tmp_path)
    job = {"task_dir": str(task), "run_dir": str(tmp_path), "device": "cpu", "workload": "grid_r1_c33", "mode": None}
    ready: list[bool] = []
    result = run_one_row(job, lambda: ready.append(True))
    assert ready == [True] and result["status"] == "PASSED", result.get("message")
    checks = result["checks"]
    assert checks["refreshes"] == sampling.MAX_REFRESHES and len(result["seeds"]["refresh"]) == sampling.MAX_REFRESHES
    samples = len(result["samples"]["candidate"])
    assert checks["checked_samples"] == {"baseline": samples, "candidate": samples}


CACHES_BY_ADDRESS = '''
from .honest import rmsnorm as honest_rmsnorm

_cache = {}


def rmsnorm(x, weight, out, eps):
    """Computes once per input address, then replays its cached result."""
    if x.data_ptr() not in _cache:
        honest_rmsnorm(x, weight, out, eps)
        _cache[x.data_ptr()] = out.clone()
    else:
        out.copy_(_cache[x.data_ptr()])
'''


def test_an_output_cache_keyed_by_address_goes_stale_on_a_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.test_runner import REPO, copy_fixture
    from kpremote.agent.harness import judge, sampling

    monkeypatch.setattr(sampling, "CHECK_FRACTION", 1.0)
    monkeypatch.setattr(sampling, "REFRESH_CHANCE", 1.0)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    task = copy_fixture(tmp_path)
    (task / "solution" / "kernel.py").rename(task / "solution" / "honest.py")
    (task / "solution" / "kernel.py").write_text(CACHES_BY_ADDRESS)
    job = {"task_dir": str(task), "run_dir": str(tmp_path), "device": "cpu", "workload": "grid_r1_c33", "mode": None}
    result = run_one_row(job, lambda: None)
    assert result["status"] == "INCORRECT" and "candidate" in result["message"], result["message"]


def test_the_sides_copies_of_a_case_are_allocated_first_in_turn() -> None:
    """Where a case's memory sits decides how much of it stays in the L2 (the warm regime): the side whose copies
    are made first alternates from one case to the next, and the copies come back keyed in the sides' order."""
    import types

    from kpremote.agent.harness.cases import Sharing, per_side

    case = types.SimpleNamespace(inputs={"x": torch.arange(4.0)}, outputs_baseline={"out": torch.zeros(4)},
                                 outputs_candidate={"out": torch.zeros(4)})
    sharing = Sharing("cpu")
    firsts = []
    for index in range(4):
        shared = sharing.share(case, index, f"case {index}", 0, index)
        first = shared.keep[0][0].data_ptr()  # the memfd copies are kept in the order they were made
        firsts.append(next(side for side in ("baseline", "candidate")
                           if shared.inputs[side]["x"].data_ptr() == first))
        assert list(shared.inputs) == list(shared.outputs) == ["baseline", "candidate"]
        assert shared.outputs["candidate"]["out"].data_ptr() != shared.outputs["baseline"]["out"].data_ptr()
        shared.close()
    assert firsts == ["baseline", "candidate", "baseline", "candidate"]
    made: list[str] = []
    assert list(per_side(1, lambda side: made.append(side) or side)) == ["baseline", "candidate"]
    assert made == ["candidate", "baseline"]  # a context's state copies and a pair's processes take the same turn


def test_each_process_pair_takes_the_sides_in_its_own_turn() -> None:
    """A pair's first samples (where its processes allocate what the call and the context's before() need) and its
    graphs go side by side in the pair's turn: the baseline first in pairs 1 and 3, the candidate in 2 and 4."""
    import types

    from kpremote.agent.harness import sampling

    order: list[tuple[int, str]] = []
    for active in range(4):
        sampler = sampling.Sampler.__new__(sampling.Sampler)
        sampler.judge = types.SimpleNamespace(bench=types.SimpleNamespace(active=active))
        sampler.cases = ["case 0", "case 1"]
        sampler._timed_once = lambda side, case, graph, k=active: order.append((k, side))
        sampler.prime()
    firsts = [next(side for k, side in order if k == active) for active in range(4)]
    assert firsts == ["baseline", "candidate", "baseline", "candidate"]
    assert [side for k, side in order if k == 1] == ["candidate", "candidate", "baseline", "baseline"]
