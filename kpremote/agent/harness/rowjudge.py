"""What the parts of a row's timing read and keep of the judge that drives them (judge.Judge): the sampler
(sampling.py) and a row's context regimes (regimes.py). Judge imports both and has every field and method here; they
type their judge by this, and never import judge.py back."""

from __future__ import annotations

import random
from typing import Any, Protocol

from .cases import SharedCase, Sharing
from .correctness import CaseView
from .sideprocess import SideProcess
from ..task.taskspec import Workload


class RowBench(Protocol):
    """What of the judge's Bench (bench.py) a row's parts reach through it: every side process."""

    def every_process(self) -> list[SideProcess]: ...


class RowJudge(Protocol):
    """The row's job, device and sides, the run's secret and the row's seeds, the checks and refreshes counted so far."""

    job: dict[str, Any]
    secret: bytes
    workload: Workload
    params: dict[str, Any]
    device: str
    adapter: Any
    seeds: dict[str, list[int]]
    rng: random.Random
    checked: dict[str, int]
    refreshes: int
    regime_refreshes: dict[str, int]
    bench: RowBench

    @property
    def sides(self) -> dict[str, SideProcess]: ...

    @property
    def sharing(self) -> Sharing: ...

    def pids_of(self, side: str) -> list[int]: ...

    def view(self, shared: SharedCase) -> CaseView: ...
