"""The records of a run's results that cross the seam as JSON, each with to_json / from_json: a run's results
(`RunResults`, the summary's results.json, schema docs/schemas/results.json) with its rows (`RowResult`: `RowTiming`
with each side's `SideStats`, the judge's `RowVerdict`) and its `Headline`, and a row's speedup interval
(`row_interval`). The agent's report.build_results makes them; every client reader takes them from from_json.

Standard library only: it is shipped with the agent and the client imports it too (the other rules both halves
agree on are protocol.py's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Mapping


class Record:
    """A typed record that crosses the seam as a JSON object (the base of every one below).

    from_json reads the declared fields and keeps whatever else the object held in `extra`, and which declared
    fields it lacked in `absent`; to_json writes them back, so a results.json of an older or newer harness reads
    back as it was written. A field named in NESTED holds another record (or a list of them, or None).
    """

    NESTED: ClassVar[dict[str, type["Record"]]] = {}
    LISTS: ClassVar[dict[str, type["Record"]]] = {}
    BOOKKEEPING = ("extra", "absent")

    @classmethod
    def from_json(cls, value: Any) -> Any:
        """The record in a JSON object; ValueError for anything else. A nested part of another shape reads as None
        (a list of records: as empty), so a stand-in's or a foreign summary costs its reader nothing."""
        if not isinstance(value, Mapping):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(value).__name__}")
        declared = [f.name for f in fields(cls) if f.name not in cls.BOOKKEEPING]  # type: ignore[arg-type]
        known = {name: value[name] for name in declared if name in value}
        for name, kind in cls.NESTED.items():
            if isinstance(known.get(name), Mapping):
                known[name] = kind.from_json(known[name])
            elif name in known:
                known[name] = None  # null, or a part of another shape: nothing to read
        for name, kind in cls.LISTS.items():
            items = known.get(name)
            known[name] = [kind.from_json(i) for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []
        return cls(**known, extra={k: v for k, v in value.items() if k not in declared},  # type: ignore[call-arg]
                   absent=frozenset(name for name in declared if name not in value))

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the declared fields the record has, in order, then what it kept."""
        record: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in self.BOOKKEEPING or f.name in self.absent:  # type: ignore[attr-defined]
                continue
            value = getattr(self, f.name)
            if isinstance(value, Record):
                value = value.to_json()
            elif isinstance(value, list) and f.name in self.LISTS:
                value = [item.to_json() for item in value]
            record[f.name] = value
        return {**record, **self.extra}  # type: ignore[attr-defined]


def _kept_fields() -> Any:
    """A record's `extra`: the keys of its JSON object that it does not declare."""
    return field(default_factory=dict, repr=False)


def _absent_fields() -> Any:
    """A record's `absent`: the declared fields its JSON object lacked (none, for a record built in code)."""
    return field(default=frozenset(), repr=False, compare=False)


@dataclass
class SideStats(Record):
    """One side's timing samples of a row, summarized once (stats.summarize, in the judge): µs per call."""

    n: int = 0
    median: float | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p10: float | None = None
    p90: float | None = None
    rse: float | None = None  # relative standard error of the median
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()


@dataclass
class RowTiming(Record):
    """How a row was timed: the mode, why sampling stopped, each side's statistics and median over median."""

    mode: str | None = None
    stop_reason: str | None = None
    baseline: SideStats | None = None
    candidate: SideStats | None = None
    speedup: float | None = None
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()
    NESTED: ClassVar[dict[str, type[Record]]] = {"baseline": SideStats, "candidate": SideStats}

    def side(self, name: str) -> SideStats | None:
        """The side's statistics when it was timed (n > 0), else None."""
        stats = getattr(self, name)
        return stats if stats is not None and stats.n else None


@dataclass
class RowVerdict(Record):
    """The judge's word on one row (stats.row_verdict): speedup, its interval, the noise, FASTER/SAME/SLOWER."""

    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    noise: float | None = None
    process_floor_us: float | None = None
    verdict: str | None = None
    pairs_pointing: int | None = None  # process pairs that read the change on their own (a change of several pairs)
    pairs_needed: int | None = None
    held: str | None = None  # the change the pooled samples alone called, where too few pairs read it so
    # Where the audit cannot see a forge of the candidate's window as large as 5 % (audit.FORGE_VISIBLE_PCT): the
    # largest share (%) a forge could take off and still pass the audit's floor. A FASTER row with it is unverified.
    forge_blind_spot_pct: float | None = None
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()


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
    checks: dict[str, Any] | None = None
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()
    NESTED: ClassVar[dict[str, type[Record]]] = {"timing": RowTiming, "verdict": RowVerdict}

    def side(self, name: str) -> SideStats | None:
        return self.timing.side(name) if self.timing else None


@dataclass
class RowRegimes(Record):
    """A row's context regimes: the context it names (bench/context.py), the regime the headline takes, and its warm
    and context regimes (its cold one is the row's own timing and verdict)."""

    name: str | None = None
    headline: str | None = None
    warm: RegimeResult | None = None
    context: RegimeResult | None = None
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()
    NESTED: ClassVar[dict[str, type[Record]]] = {"warm": RegimeResult, "context": RegimeResult}


@dataclass
class RowResult(Record):
    """One workload's row of results.json: its status, timing, verdict and speedup, and why it is in doubt."""

    workload: str = "?"
    production: bool = False
    params: dict[str, Any] | None = None
    status: str = "?"
    message: str | None = None
    correctness: dict[str, Any] | None = None  # the gate's verdict: status, seeds checked, errors, traceback, and
    # numerics: the row's numerical contract (harness/numerics.py), its worst ratios or why it was not checked
    timing: RowTiming | None = None
    verdict: RowVerdict | None = None
    speedup: float | None = None  # set only for a PASSED row
    gbps: dict[str, float | None] | None = None  # bytes moved over each side's median
    invalid: str | None = None
    implausible: str | None = None
    audit: dict[str, Any] | None = None
    smoke: bool = False
    label: str | None = None
    regimes: RowRegimes | None = None  # a row with a context (harness 2.18): its warm and context regimes
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()
    NESTED: ClassVar[dict[str, type[Record]]] = {"timing": RowTiming, "verdict": RowVerdict, "regimes": RowRegimes}

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

    geomean: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    n: int = 0
    of: int = 0
    label: str | None = None
    unsandboxed: str | None = None
    note: str | None = None
    verdicts: dict[str, int] | None = None
    method: str | None = None
    regime: str | None = None  # which regime the geomean is computed from (harness 2.18 on: "cold")
    # the same geomean in each context regime, over the production rows that name a context (harness 2.18 on):
    # {"warm": {"geomean", "low", "high", "n", "of", "verdicts"}, "context": {...}}
    regimes: dict[str, Any] | None = None
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()


RESULTS_SCHEMA = "kpremote.results/1"


TASK_STATES = ("pinned", "edited", "unpinned")
TASK_LABELS = {"edited": "TASK EDITED", "unpinned": "TASK UNPINNED"}
"""How every view names a run that did not measure the pinned task (docs/trust.md, "The sealed task")."""


@dataclass
class RunResults(Record):
    """A run's summary/results.json (schema kpremote.results/1, docs/schemas/results.json): provenance, one row per
    workload, the headline. report.build_results makes it; every client reader takes it from from_json."""

    schema: str = RESULTS_SCHEMA
    status: str = "?"
    exit_code: int | None = None
    message: str | None = None
    ended_by: str | None = None
    smoke: bool = False
    label: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    rows: list[RowResult] = field(default_factory=list)
    unsandboxed: str | None = None
    headline: Headline = field(default_factory=Headline)
    extra: dict[str, Any] = _kept_fields()
    absent: frozenset[str] = _absent_fields()
    NESTED: ClassVar[dict[str, type[Record]]] = {"headline": Headline}
    LISTS: ClassVar[dict[str, type[Record]]] = {"rows": RowResult}

    @classmethod
    def from_json(cls, value: Any) -> "RunResults":
        """The results of a results.json's object; a part of another shape (a stand-in's "rows": 200, a provenance
        that is not an object) reads as empty rather than failing."""
        results = super().from_json(value)
        if not isinstance(results.provenance, dict):
            results.provenance = {}
        if results.headline is None:  # none written, or not an object: a headline with nothing in it
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
