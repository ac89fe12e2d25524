"""A side has nothing to run while the other side's samples are taken: the judge reads the CPU time of every process
of the idle side (each process pair's, not only the active one's) right before and after each of the other side's
samples (sampling.Sampler), and guard.idle_interference voids a row whose idle side used more than its share."""

from __future__ import annotations

from kpremote.agent.harness import guard, sampling
from kpremote.agent.task.taskspec import SIDES

PIDS = {"baseline": [11, 12], "candidate": [21, 22]}  # two process pairs; 22 is the second pair's candidate


class Side:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def request(self, command: dict, fds: tuple = ()) -> dict:
        return {"ok": True, "us": 5.0}


class Judge:
    device = "cpu"
    job: dict = {}
    sides = {side: Side(PIDS[side][0]) for side in SIDES}  # the active pair: the first

    def pids_of(self, side: str) -> list[int]:
        return PIDS[side]


class Case:
    id = 0
    outputs: dict = {side: {} for side in SIDES}

    def restore(self, side: str) -> None:
        pass


def test_an_idle_pairs_process_spinning_beside_the_timed_one_is_counted(monkeypatch) -> None:
    reads = {pid: 0 for pids in PIDS.values() for pid in pids}

    def cpu_s(pid: int) -> float:
        reads[pid] += 1
        return 0.002 * reads[pid] if pid == 22 else 1.0  # the second pair's candidate: 2 ms more at every read

    monkeypatch.setattr(guard, "cpu_s", cpu_s)
    sampler = sampling.Sampler(Judge(), [Case()], "cold")
    for _ in range(3):
        sampler._timed_once("baseline", Case(), graph=False)
    sampler._timed_once("candidate", Case(), graph=False)
    assert round(sampler.idle_cpu_s["candidate"], 6) == 0.006 and sampler.idle_cpu_s["baseline"] == 0.0
    assert sampler.idle_s["candidate"] > 0 and sampler.idle_s["baseline"] > 0
    # read around the other side's samples only: four samples, two reads each, of the idle side's processes
    assert reads == {11: 2, 12: 2, 21: 6, 22: 6}


def test_a_process_gone_mid_sample_leaves_that_sample_uncounted(monkeypatch) -> None:
    monkeypatch.setattr(guard, "cpu_s", lambda pid: None if pid == 22 else 1.0)
    sampler = sampling.Sampler(Judge(), [Case()], "cold")
    sampler._timed_once("baseline", Case(), graph=False)
    assert sampler.idle_cpu_s["candidate"] == 0.0 and sampler.idle_s["candidate"] == 0.0
