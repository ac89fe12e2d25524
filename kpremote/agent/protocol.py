"""The seam between the client and the agent: every rule both halves must agree on, in one place.

Standard library only: it is shipped with the agent and the client imports it too. What lives here:

- exit codes: `ExitCode` (what an agent subcommand exits with) and `RunExit` (what the runner process exits with);
- the errors an agent subcommand reports as one JSON line `{"error": kind, "message": ...}`, drawn as a tree:

      AgentError                 kind "error",           exit 1   an expected failure: one line, no traceback
       ├── BadRequest            kind "bad_request",     exit 2   the request itself is wrong (name, flag, JSON)
       │    └── UsageError       kind "usage",           exit 2   the command line does not parse
       ├── NoIdleGpu             kind "no_idle_gpu",     exit 3   every fitting GPU is busy or leased
       │    └── GpuNotFound      kind "gpu_not_found",   exit 3   --gpu names no GPU of this host
       ├── ArchMismatch          kind "arch_mismatch",   exit 4   no GPU of the task's arch here
       ├── NotTerminal           kind "not_terminal",    exit 5   the run is not over yet
       ├── NotFound              kind "not_found",       exit 6   no such run, or no workspace
       ├── UnusablePython        kind "unusable_python", exit 1   no torch, or no CUDA build of it
       ├── TaskRefused           kind "task_refused",    exit 2   the synced task breaks its contract; no run record
       ├── StartCancelled        kind "cancelled",       exit 8   cancelled, or its client left, before the runner began
       ├── SummaryUnverified     kind "summary_unverified", exit 9  a summary its runner's sealed record does not vouch for
       └── SyncError             kind "sync",            exit 1   a refused or broken sync stream; nothing applied

  (A workspace that is not what the client remembered is not an error: `start --sync` answers the listing with
  exit 7, NEED_FULL_SYNC.)
- run states (`RUNNING`, the `TERMINAL` ones), and the timing modes a run may be asked for (`--mode`);
- a GPU's state (`GpuState`, in a host's `Snapshot`, as a run records it before and after; `ProbedGpu`, as `probe`
  answers for it), each with to_json / from_json (a run's results.json and its rows are results.py's records);
- the name rule (task, host and container names) and the run-id rule;
- the sync protocol's version and its tree digest;
- the idle policy a host's GPUs are judged by, with its defaults;
- the kinds of start request: a timing run (`start ... [--mode cold|graph]`), or a profile run
  (`start ... --profile JSON`, the JSON a `ProfileRequest`); the kind picks the runner `start` spawns.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from .record import RecordError, check_fields

if TYPE_CHECKING:
    from datetime import datetime

# hashlib, secrets and datetime are imported by the functions that use them: every agent call imports this module,
# and a `probe` (gpu-status, on every host at once) needs none of them (tests/unit/test_agent_imports.py).

# ------------------------------------------------------------------------------------------ exit codes


class ExitCode(IntEnum):
    """What `python -c BOOT ROOT HASH SUBCOMMAND ...` exits with."""

    OK = 0
    ERROR = 1
    BAD_REQUEST = 2
    NO_IDLE_GPU = 3
    ARCH_MISMATCH = 4
    NOT_TERMINAL = 5
    NOT_FOUND = 6
    NEED_FULL_SYNC = 7
    """`start --sync` found the workspace not as the client remembered: stdout lists what it holds."""
    CANCELLED_BEFORE_START = 8
    """`start` was cancelled (or its client went away) before its runner began: no run, no lease."""
    SUMMARY_UNVERIFIED = 9
    """`pack-summary` found a summary its runner's sealed record does not vouch for (agent/run/records.py): not sent."""
    AGENT_MISSING = 97
    """BOOT found no complete ROOT/agent/HASH: ship the agent, then call again."""
    NO_PYTHON = 127
    """The remote shell found no such interpreter (the shell's own "command not found")."""


class RunExit(IntEnum):
    """What the detached runner process (and a worker, for DISK_FULL) exits with."""

    PASSED = 0
    FAILED = 1
    REFUSED = 2
    INFRA = 3
    DISK_FULL = 28
    """No room left to write a result (28 = ENOSPC): the exit code is the one message that gets through."""
    CANCELLED = 130


# ------------------------------------------------------------------------------------------ errors


class AgentError(Exception):
    """An expected failure: the agent prints it as one line of JSON and exits with exit_code."""

    kind = "error"
    exit_code: int = ExitCode.ERROR


class BadRequest(AgentError):
    kind = "bad_request"
    exit_code = ExitCode.BAD_REQUEST


class UsageError(BadRequest):
    kind = "usage"


class NoIdleGpu(AgentError):
    kind = "no_idle_gpu"
    exit_code = ExitCode.NO_IDLE_GPU


class GpuNotFound(NoIdleGpu):
    kind = "gpu_not_found"


class ArchMismatch(AgentError):
    kind = "arch_mismatch"
    exit_code = ExitCode.ARCH_MISMATCH


class NotTerminal(AgentError):
    kind = "not_terminal"
    exit_code = ExitCode.NOT_TERMINAL


class NotFound(AgentError):
    kind = "not_found"
    exit_code = ExitCode.NOT_FOUND


class UnusablePython(AgentError):
    kind = "unusable_python"


class TaskRefused(AgentError):
    """The synced task breaks its contract: refused before any run record exists."""

    kind = "task_refused"
    exit_code = ExitCode.BAD_REQUEST


class StartCancelled(AgentError):
    """The start was stopped before its runner began: cancelled, or its client went away while it waited."""

    kind = "cancelled"
    exit_code = ExitCode.CANCELLED_BEFORE_START


class SummaryUnverified(AgentError):
    """A run's summary that this host's sealed record (the MAC in state.json and the index) does not vouch for."""

    kind = "summary_unverified"
    exit_code = ExitCode.SUMMARY_UNVERIFIED


class SyncError(AgentError):
    """A refused or broken sync stream; the workspace and its manifest are as they were."""

    kind = "sync"


# ------------------------------------------------------------------------------------------ run states

RUNNING = "running"
PASSED, FAILED, ERROR, CANCELLED = "passed", "failed", "error", "cancelled"
TERMINAL = frozenset({PASSED, FAILED, ERROR, CANCELLED})
"""Statuses after which nothing about a run changes any more."""
TIMING_MODES = ("cold", "graph")
"""What a timing run's --mode (or task.toml's [timing] mode) may name: L2 flushed per call, or CUDA graphs."""

# ------------------------------------------------------------------------------------------ names and run ids

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
"""Task, host and container names: never "-x" (a word that reads as an option), never "." or "..", no "/"."""
NAME_RULE = "letters, digits, '.', '_' and '-' only, starting with a letter or digit"
RUN_ID_PATTERN = r"\d{8}-\d{6}-[0-9a-f]{6}"
RUN_ID_RULE = "YYYYMMDD-HHMMSS-xxxxxx"
_NAME = re.compile(NAME_PATTERN)
_RUN_ID = re.compile(RUN_ID_PATTERN)


def is_name(value: Any) -> bool:
    """Whether value is a name that may become one folder name on either side."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def is_run_id(value: Any) -> bool:
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def new_run_id(now: datetime | None = None) -> str:
    """UTC start time to the second plus 24 random bits: sortable, and distinct for runs started together."""
    import secrets
    from datetime import datetime, timezone

    return f"{now or datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


# ------------------------------------------------------------------------------------------ sync

SYNC_VERSION = 1
"""The sync header's "version": a client and an agent that disagree refuse each other's streams."""


def manifest_digest(hashes: Mapping[str, str]) -> str:
    """One hash naming a whole tree ({relative POSIX path: sha256 of the content}); both sides compute it."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(hashes):
        digest.update(path.encode("utf-8", "surrogateescape") + b"\0" + hashes[path].encode() + b"\n")
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------ idle policy


@dataclass
class IdlePolicy:
    """When a GPU counts as idle (defaults from the users' incident write-up); travels as JSON in `--idle`."""

    max_memory_mib: int = 2048
    max_util_pct: int = 5
    allow_processes: bool = False

    @classmethod
    def from_json(cls, value: str | dict | None) -> "IdlePolicy":
        if value is None or value == "":
            return cls()
        try:
            record = json.loads(value) if isinstance(value, str) else dict(value)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"idle policy is not a JSON object: {exc}") from None
        if not isinstance(record, dict):
            raise BadRequest(f"idle policy must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise BadRequest(f"idle policy has unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        try:
            return cls(
                max_memory_mib=int(record.get("max_memory_mib", cls.max_memory_mib)),
                max_util_pct=int(record.get("max_util_pct", cls.max_util_pct)),
                allow_processes=_strict_bool(record.get("allow_processes", cls.allow_processes)),
            )
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"idle policy: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def _strict_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"allow_processes must be true or false, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ start requests

TIMING, PROFILE = "timing", "profile"
RUNNERS = {TIMING: "kpremote.agent.run.runner", PROFILE: "kpremote.agent.run.profile"}
"""The module `start` spawns for each kind of run (a test may put a stand-in in its place)."""
PROFILE_MODE_PREFIX = "profile:"
"""A profile run's record (state.json) names its mode "profile:" + its request as JSON."""
PROFILE_SIDES = ("baseline", "candidate")
PROFILE_SIDE_CHOICES = (*PROFILE_SIDES, "both")
SECTION_SETS = ("basic", "full")


def run_kind(profile: str | None) -> str:
    """The kind of run a start asks for: a profile run when it carries a profile request, else a timing run."""
    return TIMING if profile is None else PROFILE


@dataclass(frozen=True)
class ProfileRequest:
    """What `inv profile` asks for; travels to the host as JSON in `start --profile` (to_json / from_json)."""

    side: str = "both"
    section_set: str = "basic"
    kernel: str | None = None  # a regular expression on kernel function names
    warmup: int = 3  # untimed, unprofiled calls first: JIT compilation and first-touch effects stay outside
    calls: int = 3  # profiled calls per side

    @property
    def sides(self) -> tuple[str, ...]:
        return PROFILE_SIDES if self.side == "both" else (self.side,)

    def problems(self) -> list[str]:
        found = []
        if self.side not in PROFILE_SIDE_CHOICES:
            found.append(f"--side {self.side!r}: allowed: {', '.join(PROFILE_SIDE_CHOICES)}")
        if self.section_set not in SECTION_SETS:
            found.append(f"--set {self.section_set!r}: allowed: {', '.join(SECTION_SETS)}")
        if self.kernel is not None:
            try:
                re.compile(self.kernel)
            except re.error as exc:
                found.append(f"--kernel {self.kernel!r} is not a regular expression: {exc}")
        for name in ("warmup", "calls"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (1 if name == "calls" else 0) or value > 100:
                found.append(f"{name} = {value!r}: a whole number from {1 if name == 'calls' else 0} to 100")
        return found

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ProfileRequest":
        """The request in a `--profile` value; ValueError (saying what is wrong) for anything else."""
        try:
            values = json.loads(text)
        except ValueError:
            values = None
        if not isinstance(values, dict):
            raise ValueError(f"--profile {text!r} is not a profile request (expected a JSON object)")
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"--profile: unknown profile request keys {sorted(unknown)}")
        return replace(cls(), **values)


# ------------------------------------------------------------------------------------------ GPU state


@dataclass
class GpuState:
    """One GPU as NVML reads it (or the fixture stands in for it): what `probe` lists, what a run records before and
    after (results.json provenance gpu_before / gpu_after). A reading NVML could not give is None."""

    index: int
    uuid: str
    name: str
    cc: tuple[int, int]
    memory_used_mib: int
    memory_total_mib: int
    util_pct: int | None  # None: NVML could not read it
    temperature_c: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    clock_event_reasons: list[str]
    processes: list[dict] | None  # None: NVML could not read the list
    l2_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["cc"] = list(self.cc)
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "GpuState":
        """The inverse of to_json; optional fields may be left out (see docs/nvml-fixture.md)."""
        required = ("index", "uuid", "name", "cc", "memory_used_mib", "memory_total_mib")
        missing = [key for key in required if key not in record]
        if missing:
            raise ValueError(f"GPU record {record.get('index', '?')} lacks {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(f"GPU record {record['index']} has unknown keys {', '.join(unknown)}")
        check_fields(GpuState, record, f"GPU record {record['index']}", cc=list[int])  # RecordError: a ValueError
        major, minor = record["cc"]
        return cls(
            index=int(record["index"]),
            uuid=str(record["uuid"]),
            name=str(record["name"]),
            cc=(int(major), int(minor)),
            memory_used_mib=int(record["memory_used_mib"]),
            memory_total_mib=int(record["memory_total_mib"]),
            util_pct=_optional_int(record.get("util_pct", 0)),
            temperature_c=record.get("temperature_c"),
            power_w=record.get("power_w"),
            sm_clock_mhz=record.get("sm_clock_mhz"),
            sm_clock_max_mhz=record.get("sm_clock_max_mhz"),
            clock_event_reasons=list(record.get("clock_event_reasons", [])),
            processes=_process_records(record.get("processes", [])),
            l2_bytes=record.get("l2_bytes"),
        )


@dataclass
class ProbedGpu(GpuState):
    """One GPU as `probe` answers for it (gpu-status reads it as it is): its state, then whether a run would lease
    it now and why not, its lease's holder record, and whether the host's arch runs on it."""

    lease: dict[str, Any] | None = None  # the holder record of the lease on it (lease.py), if any
    idle: bool = False  # a run would lease it now: idle by the host's policy and nobody's lease on it
    reason: str | None = None  # "idle", or why it is not
    arch_ok: bool = True
    arch_reason: str | None = None  # why the host's arch does not run on this GPU

    PROBE_FIELDS: ClassVar[tuple[str, ...]] = ("lease", "idle", "reason", "arch_ok", "arch_reason")

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "ProbedGpu":
        """GpuState.from_json's reading of the state, and the probe's own fields as they came."""
        state = GpuState.from_json({key: value for key, value in record.items() if key not in cls.PROBE_FIELDS})
        check_fields(cls, {key: record[key] for key in cls.PROBE_FIELDS if key in record}, f"GPU record {state.index}")
        return cls(**vars(state), **{key: record[key] for key in cls.PROBE_FIELDS if key in record})


@dataclass
class Snapshot:
    """A host's GPUs at one moment (nvml.snapshot): where the readings came from, and why there are none."""

    hostname: str
    driver: str | None
    source: str  # "nvml" | "fixture" | "none"
    gpus: list[GpuState] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "driver": self.driver, "source": self.source,
                "gpus": [gpu.to_json() for gpu in self.gpus], "error": self.error}

    @classmethod
    def from_json(cls, record: Any, gpu: type[GpuState] = GpuState) -> "Snapshot":
        """The inverse of to_json (`probe` answers it with each GPU a ProbedGpu: gpu), every field of its type;
        RecordError (a ValueError) naming the field where one is not."""
        if not isinstance(record, Mapping):
            raise RecordError(f"probe answer: expected a JSON object, got {str(record)[:60]!r}")
        check_fields(cls, record, "probe answer", gpus=list[dict[str, Any]])
        return cls(hostname=record.get("hostname") or "?", driver=record.get("driver"), source=record.get("source")
                   or "none", gpus=[gpu.from_json(one) for one in record.get("gpus", [])], error=record.get("error"))

    def find(self, key: str) -> GpuState | None:
        """The GPU named by its index ("0") or its UUID."""
        key = str(key).strip()
        for gpu in self.gpus:
            if key == str(gpu.index) or key.lower() == gpu.uuid.lower():
                return gpu
        return None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _process_records(processes: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The fixture's process list; null says NVML could not read it."""
    return None if processes is None else [_process_record(p) for p in processes]


def _process_record(process: dict[str, Any]) -> dict[str, Any]:
    return {"pid": process.get("pid"), "name": process.get("name"), "used_mib": process.get("used_mib")}
