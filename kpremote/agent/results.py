"""The records of a run's results that cross the seam as JSON, each with to_json / from_json: a run's results
(`RunResults`, the summary's results.json, schema docs/schemas/results.json) with its rows (`RowResult`: `RowTiming`
with each side's `SideStats`, the judge's `RowVerdict`) and its `Headline`, and a row's speedup interval
(`row_interval`). Every key a row carries is a declared, typed field (record.py: from_json checks each; a newer
harness's undeclared keys are kept apart in `newer`). The runner makes each row's record once from the judge's answer
and report.build_results the run's; every client reader takes them from from_json. docs/schemas/results.json is drawn
from them (python -m kpremote.results.schemas), as docs/schemas/state.json is from a run's state.json (`RunState`,
which run/runstate.py checks every write against). A sync stream's header line (`SyncHeader`) is here too.

Standard library only: it is shipped with the agent and the client imports it too (the other rules both halves
agree on are protocol.py's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from .record import Record, RecordError, absent_fields, newer_fields, typed


@dataclass
class SideStats(Record):
    """One side's timing samples of a row, summarized once (stats.summarize, in the judge): µs per call."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["n"], "if": {"properties": {"n": {"minimum": 1}}},
                                        "then": {"required": ["median", "mean", "std", "min", "p10", "p90"]}}

    n: int = 0
    median: float | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p10: float | None = None
    p90: float | None = None
    rse: float | None = None  # relative standard error of the median
    dropped_clock: int | None = None  # samples dropped for a clock that moved (timing.SideSamples)
    dropped_late: int | None = None  # samples dropped and taken again: the window opened before the call was queued
    host_bound: bool | None = None  # its calls wait on the host: late samples kept from then on
    wall_s: float | None = None  # the side's wall time spent sampling
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


@dataclass
class RowTiming(Record):
    """How a row was timed: the mode, why sampling stopped, each side's statistics and median over median."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["mode", "baseline", "candidate", "speedup"]}

    mode: str | None = typed(enum=["cold", "graph", "smoke", "warm", "context", None])  # warm, context: a regime's
    calls_per_sample: int | None = None
    stop_reason: str | None = None
    clock_check: str | None = None
    head_start_us: float | None = None
    unit: str | None = typed(enum=["us", None])
    baseline: SideStats | None = None
    candidate: SideStats | None = None
    speedup: float | None = None
    process_pairs: list[dict[str, Any]] | None = None  # each process pair's medians, where several timed the row
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()

    def side(self, name: str) -> SideStats | None:
        """The side's statistics when it was timed (n > 0), else None."""
        stats = getattr(self, name)
        return stats if stats is not None and stats.n else None


@dataclass
class RowVerdict(Record):
    """The judge's word on one row (stats.row_verdict): speedup, its interval, the noise, FASTER/SAME/SLOWER."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["speedup", "low", "high", "level", "noise", "verdict"]}

    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    noise: float | None = None
    timer_quantum_us: float | None = None
    process_floor_us: float | None = None
    verdict: str | None = typed(enum=["FASTER", "SAME", "SLOWER", None])  # null on a smoke row (harness 2.17)
    pairs_pointing: int | None = None  # process pairs that read the change on their own (a change of several pairs)
    pairs_needed: int | None = None
    held: str | None = None  # the change the pooled samples alone called, where too few pairs read it so
    # Where the audit cannot see a forge of the candidate's window as large as 5 % (audit.FORGE_VISIBLE_PCT): the
    # largest share (%) a forge could take off and still pass the audit's floor. A FASTER row with it is unverified.
    forge_blind_spot_pct: float | None = None
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


HEADLINE_LEVEL = 0.95  # the level of the headline's interval (report.headline), where a record names none
UNVERIFIED_FASTER = "FASTER (unverified)"  # a FASTER row whose audit cannot see a 5 % forge (forge_blind_spot_pct)

COLD_REGIME = "cold"  # alone, the L2 flushed before every sample: every row, and the headline's regime
CONTEXT_REGIMES = ("warm", "context")  # a row that names a context is timed in these too (harness/regimes.py)
REGIME_WORDS = {"cold": "alone", "warm": "with its inputs warm", "context": "in its context"}


@dataclass
class RegimeResult(Record):
    """One of a row's context regimes (warm or context, harness 2.18): its timing, speedup and verdict, judged as the
    row's cold samples are (stats.row_verdict over the same process pairs)."""

    timing: RowTiming | None = None
    speedup: float | None = None
    verdict: RowVerdict | None = None
    gbps: dict[str, float | None] | None = None
    checks: dict[str, Any] | None = None  # the samples checked and the refreshes made in this regime
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()

    def side(self, name: str) -> SideStats | None:
        return self.timing.side(name) if self.timing else None


@dataclass
class RowRegimes(Record):
    """A row's context regimes: the context it names (bench/context.py), the regime the headline takes, and its warm
    and context regimes (its cold one is the row's own timing and verdict)."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["name", "warm", "context"]}

    name: str | None = None
    headline: str | None = typed(enum=["cold", None])
    warm: RegimeResult | None = None
    context: RegimeResult | None = None
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


@dataclass
class RowResult(Record):
    """One workload's row of results.json: its status, timing, verdict and speedup, and why it is in doubt."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["workload", "production", "status"]}

    workload: str = "?"
    production: bool = False  # counts in the headline
    params: dict[str, Any] | None = None
    tolerance_override: dict[str, float | None] | None = None  # the workload's own atol / rtol, where it sets them
    status: str = typed("?", enum=["PASSED", "INCORRECT", "ERROR", "TIMEOUT", "SKIPPED", "NOT CHECKED"])
    message: str | None = None
    where: str | None = None  # the step a row that did not pass stopped in: import, timing, worker, judge, ...
    mismatch: dict[str, Any] | None = None  # what differed, for a row refused while it was timed
    traceback: str | None = None  # a side's or the judge's traceback, where one ended the row
    correctness: dict[str, Any] | None = typed(ref="correctness")  # the gate's verdict: status, seeds checked,
    # errors, traceback, and numerics: the row's numerical contract (harness/numerics.py), its worst ratios
    seeds: dict[str, list[int]] | None = None  # the seeds of the row's cases: correctness, timing, refresh
    bytes_moved: float | None = None  # by one call (bench/adapter.py), the floors' and GB/s's numerator
    flops: float | None = None
    timing: RowTiming | None = None
    verdict: RowVerdict | None = None
    speedup: float | None = typed(exclusiveMinimum=0)  # set only for a PASSED row
    gbps: dict[str, float | None] | None = None  # bytes moved over each side's median
    checks: dict[str, Any] | None = None  # the timing's own checks: cases, checked samples, refreshes, pairs, ...
    side_threads: dict[str, Any] | None = None  # each side's threads before and after its timing
    side_threads_in_context: dict[str, Any] | None = None  # the same, of its context regimes
    invalid: str | None = None  # why the row's timing does not stand (a foreign process, a thread started, ...)
    implausible: str | None = None  # a side faster than the physical floor
    audit: dict[str, Any] | None = None  # Nsight Compute's reading of the row (GPU runs): agree, its times, outputs
    processes: dict[str, int] | None = None  # the pids that ran the row (the judge's and each side's)
    sandbox: dict[str, str] | None = None  # how each side was sandboxed
    smoke: bool = False
    label: str | None = None
    seconds: float | None = None  # the row's wall time, judge and sides together
    log: str | None = None  # the row's log under the run's folder (raw/workloads/<row>.log)
    log_dropped_bytes: int | None = typed(minimum=1)  # where the row's log passed its cap: at least this much dropped
    regimes: RowRegimes | None = None  # a row with a context (harness 2.18): its warm and context regimes
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()

    def regime(self, name: str) -> RegimeResult | None:
        """The row in one regime: cold is its own timing and verdict; warm and context its regimes' (None where the
        row was not timed so). A regime's speedup stands only where the row's does (a PASSED row, its timing valid)."""
        if name == COLD_REGIME:
            if self.timing is None:
                return None
            return RegimeResult(timing=self.timing, speedup=self.speedup, verdict=self.verdict, gbps=self.gbps)
        found = getattr(self.regimes, name, None) if self.regimes is not None and name in CONTEXT_REGIMES else None
        if found is None:
            return None
        return found if self.speedup else replace(found, speedup=None)

    def regime_word(self, name: str) -> str | None:
        """The row's verdict in one regime (cold: verdict_word, FASTER (unverified) included)."""
        if name == COLD_REGIME:
            return self.verdict_word
        found = self.regime(name)
        return found.verdict.verdict if found is not None and found.verdict is not None else None

    @property
    def context_note(self) -> str | None:
        """One plain line for a row FASTER alone but not in its context: "qwen_s19: FASTER alone (1.20x), SAME in its
        context (0.999x): the win does not reach the model"; None otherwise."""
        alone, there = self.regime_word(COLD_REGIME), self.regime_word("context")
        context = self.regime("context")
        if not alone or not alone.startswith("FASTER") or there not in ("SAME", "SLOWER") or not context \
                or not context.speedup or not self.speedup:
            return None
        return (f"{self.workload}: {alone} {REGIME_WORDS[COLD_REGIME]} ({self.speedup:.2f}x), {there} "
                f"{REGIME_WORDS['context']} ({context.speedup:.3f}x): the win does not reach the model")

    @property
    def interval(self) -> tuple[float, float] | None:
        """The speedup's interval, where the judge gave one (its verdict's low and high)."""
        return row_interval(self)

    def side(self, name: str) -> SideStats | None:
        """The statistics of one side's samples, when this row was timed."""
        return self.timing.side(name) if self.timing else None

    @property
    def verdict_word(self) -> str | None:
        """FASTER / SAME / SLOWER, or FASTER (unverified) where the audit could not have seen a forge of 5 %."""
        word = self.verdict.verdict if self.verdict else None
        return UNVERIFIED_FASTER if word == "FASTER" and self.verdict.forge_blind_spot_pct else word

    @property
    def unverified(self) -> str | None:
        """Why a FASTER row is unverified, in words (results.md and the run view say it so)."""
        if self.verdict_word != UNVERIFIED_FASTER:
            return None
        return (f"FASTER — unverified: the audit cannot see a forge under {self.verdict.forge_blind_spot_pct:.0f} % "
                f"on this row")


@dataclass
class Headline(Record):
    """The run's one number: equal-weight geometric mean of the production rows' speedups with its interval, or
    none and the note saying why (report.headline)."""

    SCHEMA: ClassVar[dict[str, Any]] = {
        "required": ["geomean", "low", "high", "level", "n", "of", "label", "unsandboxed"],
        "if": {"properties": {"geomean": {"type": "number"}}},
        "then": {"properties": {"low": {"type": "number"}, "high": {"type": "number"}}},
        "else": {"required": ["note"], "properties": {"note": {"type": "string"}}}}

    geomean: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    n: int = typed(0, minimum=0)  # production rows counted
    of: int = typed(0, minimum=0)  # production rows selected
    label: str | None = None
    unsandboxed: str | None = None
    note: str | None = None  # why there is no geomean
    verdicts: dict[str, int] | None = None
    method: str | None = None
    regime: str | None = None  # which regime the geomean is computed from (harness 2.18 on: "cold")
    # the same geomean in each context regime, over the production rows that name a context (harness 2.18 on):
    # {"warm": {"geomean", "low", "high", "n", "of", "verdicts"}, "context": {...}}
    regimes: dict[str, Any] | None = None
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()


RESULTS_SCHEMA = "kpremote.results/1"


TASK_STATES = ("pinned", "edited", "unpinned")
TASK_LABELS = {"edited": "TASK EDITED", "unpinned": "TASK UNPINNED"}
"""How every view names a run that did not measure the pinned task (docs/trust.md, "The sealed task")."""


@dataclass
class RunResults(Record):
    """A run's summary/results.json (schema kpremote.results/1, docs/schemas/results.json): provenance, one row per
    workload, the headline. report.build_results makes it; every client reader takes it from from_json."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["schema", "status", "exit_code", "message", "smoke", "label",
                                                      "provenance", "rows", "unsandboxed", "headline"]}

    schema: str = RESULTS_SCHEMA
    status: str = typed("?", enum=["passed", "failed", "error", "cancelled"])  # how the run ended (protocol.TERMINAL)
    exit_code: int | None = None  # the runner's exit code (protocol.RunExit): 0 passed, 1 failed, 2 refused, ...
    message: str | None = None  # why the run did not pass, in one line
    ended_by: str | None = None  # the scheduler's state when it ended the run (Slurm TIMEOUT, PREEMPTED, ...)
    smoke: bool = False  # a CPU run (Triton interpreter): its timings mean nothing
    label: str | None = None
    provenance: dict[str, Any] = typed(factory=dict, ref="provenance")
    rows: list[RowResult] = field(default_factory=list)
    unsandboxed: str | None = None  # why the sides ran without the whole sandbox; null when they did not
    headline: Headline = field(default_factory=Headline)
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()

    @classmethod
    def from_json(cls, value: Any, where: str | None = None) -> "RunResults":
        """The results of a results.json's object (RecordError, a ValueError, where a part is of another shape: a
        stand-in's "rows": 200); one without a headline has a headline with nothing in it."""
        results = super().from_json(value, where)
        if "headline" in results.absent:
            results.headline = Headline(absent=frozenset(f.name for f in fields(Headline)))
        return results

    @classmethod
    def read(cls, path: Any) -> "RunResults":
        """The JSON object at path as results; ValueError (naming the file) when it cannot be read as one. Whether
        it is a harness's summary at all: is_summary."""
        try:
            with open(path, encoding="utf-8") as file:
                return cls.from_json(json.load(file))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable results.json: {exc}") from None

    @property
    def is_summary(self) -> bool:
        """Whether a harness wrote it (its schema is kpremote.results/N), not a stand-in or a foreign file."""
        return isinstance(self.schema, str) and self.schema.startswith("kpremote.results/") \
            and "schema" not in self.absent

    def part(self, *keys: str) -> dict[str, Any]:
        """A provenance part as an object ({} where missing or of another shape): part("source"), part("gpu")."""
        value: Any = self.provenance
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, dict) else {}

    @property
    def run_id(self) -> str | None:
        return self.provenance.get("run_id")

    @property
    def task_state(self) -> str | None:
        """Whether the run measured the pinned task: "pinned", "edited" or "unpinned" (provenance.task_pin_record);
        None for a run made before tasks had a pin."""
        state = self.part("task_pin").get("state")
        return state if state in TASK_STATES else None

    @property
    def task_digest(self) -> str | None:
        digest = self.part("task_pin").get("digest")
        return digest if isinstance(digest, str) else None

    @property
    def started(self) -> str:
        return str(self.provenance.get("started") or "")

    @property
    def task_name(self) -> str:
        task = self.part("task")
        return task.get("name") or (str(task["dir"]).rstrip("/").rsplit("/", 1)[-1] if task.get("dir") else "?")

    def by_workload(self) -> dict[str, RowResult]:
        return {row.workload: row for row in self.rows}


def row_interval(row: RowResult) -> tuple[float, float] | None:
    """A row's speedup interval, where the judge gave one: its verdict's low and high (the only shape any harness
    version has written; every committed results.json has it)."""
    verdict = row.verdict
    if verdict is not None and verdict.low and verdict.high:
        return float(verdict.low), float(verdict.high)
    return None


@dataclass
class RunState(Record):
    """A run's state.json (run/runstate.py): where the run is and how it ended, written by the start, the runner, a
    Slurm job's step and whoever settles a run; every key a writer may set is declared here, and update_state checks
    each one written against it."""

    run_id: str | None = None
    task: str | None = None
    status: str | None = None  # waiting, starting, pending, running, then one of protocol.TERMINAL
    phase: str | None = None  # the step it is in: validate, lease, build, workload, audit, report, done, ...
    scheduler: str | None = None  # "slurm" for a run submitted as a Slurm job
    pid: int | None = None
    pgid: int | None = None
    created: str | None = None  # UTC, ISO 8601, as every time below
    submitted: str | None = None
    started: str | None = None
    finished: str | None = None
    host_alias: str | None = None
    hostname: str | None = None
    node: str | None = None
    device: str | None = None  # cuda or cpu
    gpu: dict[str, Any] | None = None  # the leased GPU's state (protocol.GpuState)
    waiting_for: list[dict[str, Any]] | None = None  # the GPUs a waiting start watches, and why each is not free
    workloads: str | None = None  # the rows asked for, comma-separated (StartRequest.workloads)
    mode: str | None = None
    request: dict[str, Any] | None = None  # a Slurm run's start request, as submitted
    settings: dict[str, Any] | None = None  # its Slurm settings
    workload: dict[str, Any] | None = None  # the row being run: {"i", "n", "id"}
    exit_code: int | None = None
    headline: dict[str, Any] | None = None  # the summary's headline (Headline.to_json())
    message: str | None = None
    error: str | None = None  # why a run that never ran its rows ended (cancelled while waiting, died)
    summary_sha256: str | None = None  # the seal of summary/results.json (run/records.py)
    summary_mac: str | None = None
    ended_by: str | None = None  # the scheduler's state that ended the run (Slurm TIMEOUT, PREEMPTED, ...)
    cancel_requested: bool | None = None
    job_id: str | None = None
    slurm: dict[str, Any] | None = None  # what Slurm said of the job: job_id, state, node, exit_code, reason, ...
    slurm_settled: bool | None = None
    slurm_ended_seen: float | None = None  # when Slurm was first seen to have ended the job (time.time())
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()

    @classmethod
    def check_written(cls, fields: dict[str, Any]) -> None:
        """RecordError unless every field a writer sets is declared here and of its declared type."""
        unknown = sorted(set(fields) - {name for name in cls.__dataclass_fields__ if name not in ("newer", "absent")})
        if unknown:
            raise RecordError(f"state.json: {', '.join(unknown)}: not a field of RunState (kpremote/agent/results.py)")
        cls.from_json(fields, "state.json")


@dataclass
class SyncHeader(Record):
    """The first line of a sync stream: the client's build_sync_request makes it, the agent's sync.read_header reads
    it with from_json (then checks each path and that every changed file has its size); the tar after it carries
    exactly the changed files."""

    SCHEMA: ClassVar[dict[str, Any]] = {"required": ["version", "base_digest", "new_digest", "changed", "deleted",
                                                      "sizes", "provenance"]}

    version: int = 0  # protocol.SYNC_VERSION: client and agent agree on it or nothing is applied
    base_digest: str = ""  # the manifest digest the client believes the workspace holds
    new_digest: str = ""  # the manifest digest the workspace holds once this stream is applied
    changed: list[str] = field(default_factory=list)  # the files the tar carries, relative to the task folder
    deleted: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # each changed file's size in bytes
    full: bool = False  # compare with the files themselves, not the manifest (the client's answer to need_full)
    provenance: dict[str, Any] | None = None  # the task tree's provenance, kept beside the workspace's manifest
    newer: dict[str, Any] = newer_fields()
    absent: frozenset[str] = absent_fields()
