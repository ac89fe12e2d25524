"""What a task folder says, as values: TaskSpec and its parts, TaskSpecError, and the few helpers every check of a
task writes its messages with (shown, listed, toml_text, suggestion, string_list).

taskspec.py reads task.toml into these; buildrules.py and taskfiles.py check them; none of them is imported back
here, so the three import each other without a cycle. Standard library only.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SIDES = ("baseline", "candidate")
SIDE_FOLDERS = {"baseline": "baseline", "candidate": "solution"}


class TaskSpecError(ValueError):
    """The task folder breaks its contract; the message is complete (file, field, what is allowed)."""


@dataclass(frozen=True)
class TaskInfo:
    name: str
    arch: str  # one arch, or several comma-separated ("h200,b200") where task.toml names a list
    family: str
    gpu_only: str | None = None  # [task] gpu_only: why no side of it can be checked without a GPU (rows NOT CHECKED)

    @property
    def arches(self) -> tuple[str, ...]:
        return tuple(self.arch.split(","))


@dataclass(frozen=True)
class BaselineInfo:
    repo: str
    ref: str
    commit: str
    files: tuple[str, ...]
    follows: str | None = None
    release: str | None = None  # a release pin: "sglang 0.5.23", its wheel's file name and sha256
    wheel: str | None = None
    wheel_sha256: str | None = None
    sha256: tuple[tuple[str, str], ...] = ()  # [baseline.sha256]: (path under baseline/upstream/, sha256)


@dataclass(frozen=True)
class BuildSpec:
    kind: str  # both sides' kind, or "<baseline>+<candidate>" where the rule sheet lets them differ
    flags: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    entry: str = "kernel"
    kinds: tuple[str, ...] = ()  # (baseline kind, candidate kind); empty: both are `kind`
    exports: tuple[tuple[str, str], ...] = ()  # tvm-ffi: (export name, C++ callable with {args})
    include_dirs: tuple[str, ...] = ()  # compiled sides: header folders, relative to each side's folder


@dataclass(frozen=True)
class TimingSettings:
    mode: str = "cold"
    min_samples: int = 10
    min_time_s: float = 0.5
    max_time_s: float = 20.0
    target_rse: float = 0.005
    max_samples: int = 2000
    warmup_s: float = 0.1
    timeout_s: float = 600.0
    seeds: int = 3

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "TimingSettings":
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


# A row's numerical contract, as workloads.toml names it (`contract`); harness/numerics.py judges a row by it.
CLOSE = "close"
EXACT = "exact"
CONTRACTS = (CLOSE, EXACT)
DEFAULT_CONTRACT = CLOSE


@dataclass(frozen=True)
class Workload:
    id: str
    production: bool
    params: dict[str, Any]  # the row merged over [defaults]: what the adapter receives
    atol: float | None = None  # per-row override of the adapter's Case tolerance
    rtol: float | None = None
    mutates: tuple[str, ...] = ()  # inputs a call rewrites in place (the row's `mutates`)
    contract: str = DEFAULT_CONTRACT  # the row's numerical contract (harness/numerics.py): CLOSE or EXACT
    context: str | None = None  # the row's context: a name in bench/context.py's CONTEXTS (timed in it too)


@dataclass(frozen=True)
class TaskSpec:
    root: Path
    task: TaskInfo
    baseline: BaselineInfo
    build: BuildSpec
    timing: TimingSettings
    workloads: tuple[Workload, ...] = field(default_factory=tuple)

    def side_dir(self, side: str) -> Path:
        return self.root / SIDE_FOLDERS[side]

    @property
    def adapter_path(self) -> Path:
        return self.root / "bench" / "adapter.py"

    @property
    def context_path(self) -> Path:
        """bench/context.py: the contexts a row may name (its `context` key); trusted and pinned, like the adapter."""
        return self.root / "bench" / "context.py"

    def smoke_rows(self) -> list[Workload]:
        """Rows marked `smoke = true`, or all when none is: what a CPU run takes when no row is named.

        Production shapes through Triton's interpreter take minutes a call; the marked rows keep a smoke run
        about the contract and correctness, in seconds.
        """
        marked = [w for w in self.workloads if w.params.get("smoke") is True]
        return marked or list(self.workloads)

    def select(self, ids: list[str] | None) -> list[Workload]:
        """The rows named by ids (in file order), or all rows; an unknown id is an error."""
        if not ids:
            return list(self.workloads)
        known = {w.id for w in self.workloads}
        unknown = [i for i in ids if i not in known]
        if unknown:
            where = shown(self.root / "bench" / "workloads.toml")
            raise TaskSpecError(
                f"{where}: no workload {', '.join(map(repr, unknown))}{suggestion(unknown[0], known)}"
                f" — known: {', '.join(sorted(known))}"
            )
        wanted = set(ids)
        return [w for w in self.workloads if w.id in wanted]


def string_list(path: Path, table: str, key: str, value: Any) -> list[str]:
    """[table] key as a list of non-empty strings, or the refusal that names it."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TaskSpecError(f"{shown(path)}: [{table}] {key} = {value!r} — allowed: a list of non-empty strings")
    return list(value)


def toml_text(value: Any) -> str:
    """A value as a message quotes it: a string as TOML writes it, anything else as Python shows it."""
    if not isinstance(value, str):
        return repr(value)
    return f'"{value}"' if value.isprintable() else json.dumps(value)  # a message stays one line, escapes inert


def listed(allowed: tuple[str, ...] | list[str]) -> str:
    """Allowed values as a message lists them: "a", "b", "c"."""
    return ", ".join(f'"{a}"' for a in allowed)


def suggestion(word: str, known: Any) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def shown(path: Path) -> str:
    """The path as the user knows it: relative to the working folder where possible."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
