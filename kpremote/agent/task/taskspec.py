"""A task folder's contract (docs/task-contract.md): task.toml and bench/workloads.toml, read and validated into
the values the agent runs by (TaskSpec).

Everything that could make the two sides differ is refused here, before anything is built or run. Every
error names the file and the field and says what is allowed, e.g.
`kernels/x/task.toml: [build] kind = "rust" — allowed: "triton", "cuda", ...`. The build kinds' rules live in
buildrules.py; the checks of the folder's files (each side's, the adapter, the pinned upstream) in taskfiles.py.
Standard library only: the runner validates a task without importing torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..protocol import TIMING_MODES
from . import taskfiles
from .buildrules import check_packages, parse_build
from .taskrecords import (
    CONTRACTS,
    DEFAULT_CONTRACT,
    SIDES,  # noqa: F401 - its importers ask the task's sides of taskspec
    BaselineInfo,
    BuildSpec,
    TaskInfo,
    TaskSpec,
    TaskSpecError,
    TimingSettings,
    Workload,
    listed,
    shown,
    string_list,
    suggestion,
    toml_text,
)

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

ARCHES = ("b200", "h200", "h100", "any")
WORKLOAD_ID = re.compile(r"[A-Za-z0-9_.-]+")
PER_SIDE_TABLES = ("candidate", "solution", "baseline_build", "candidate_build")


# ------------------------------------------------------------------------------------------------ loading


def load_task(task_dir: Path, *, timing_mode: str | None = None, packages: bool = True) -> TaskSpec:
    """Read and validate the whole task folder; timing_mode (from the command line) overrides [timing] mode.

    packages=False leaves out whether this Python has the build kind's packages: the client checks a task it will
    run elsewhere, and a host that lacks them is a host problem, not the task's (state.start says so apart)."""
    root = Path(task_dir)
    if not root.is_dir():
        raise TaskSpecError(f"{shown(root)}: no such task folder")
    task_file = root / "task.toml"
    data = _read_toml(task_file)
    _check_tables(task_file, data, required=("task", "baseline", "build"), optional=("timing",))
    task = _task_info(task_file, data["task"], root)
    baseline = _baseline_info(task_file, data["baseline"])
    build = _build_spec(task_file, data["build"])
    if packages:
        check_packages(task_file, build)
    timing = _timing_settings(task_file, data.get("timing", {}))
    if timing_mode is not None:
        _check_choice(task_file, "timing", "mode", timing_mode, TIMING_MODES, origin="--mode")
        timing = replace(timing, mode=timing_mode)
    spec = TaskSpec(root, task, baseline, build, timing, tuple(load_workloads(root / "bench" / "workloads.toml")))
    taskfiles.check_no_bytecode(spec)
    taskfiles.check_sides_symmetric(spec)
    taskfiles.check_upstream_files(spec)
    taskfiles.check_adapter(spec.adapter_path)
    taskfiles.check_contexts(spec)
    return spec


def load_workloads(path: Path) -> list[Workload]:
    data = _read_toml(path)
    _check_tables(path, data, required=("workload",), optional=("defaults",))
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise TaskSpecError(f"{shown(path)}: [defaults] must be a table")
    rows = data["workload"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise TaskSpecError(f"{shown(path)}: needs at least one [[workload]] table")
    if "id" in defaults:
        raise TaskSpecError(f"{shown(path)}: [defaults] id — not allowed: each row sets its own")
    workloads: list[Workload] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        workload = _workload(path, number, {**defaults, **row})
        if workload.id in seen:
            raise TaskSpecError(f"{shown(path)}: [[workload]] #{number} id = {workload.id!r} — ids must be unique")
        seen.add(workload.id)
        workloads.append(workload)
    return workloads


def _workload(path: Path, number: int, merged: dict[str, Any]) -> Workload:
    where = f"{shown(path)}: [[workload]] #{number}"
    wid = merged.get("id")
    if not isinstance(wid, str) or not WORKLOAD_ID.fullmatch(wid):
        raise TaskSpecError(f"{where} id = {wid!r} — allowed: a string of letters, digits, '_', '.', '-'")
    production = merged.get("production", False)
    if not isinstance(production, bool):
        raise TaskSpecError(f"{where} ({wid}) production = {production!r} — allowed: true, false")
    tolerances = {}
    for key in ("atol", "rtol"):
        value = merged.get(key)
        if value is not None and (not _finite_number(value) or value < 0):
            raise TaskSpecError(f"{where} ({wid}) {key} = {value!r} — allowed: a number >= 0")
        tolerances[key] = float(value) if value is not None else None
    mutates = merged.get("mutates", [])
    if (not isinstance(mutates, list) or not all(isinstance(m, str) and m for m in mutates)
            or len(set(mutates)) != len(mutates)):
        raise TaskSpecError(f"{where} ({wid}) mutates = {mutates!r} — allowed: a list of distinct input names "
                            f"(strings), the inputs a call rewrites in place")
    contract = merged.get("contract", DEFAULT_CONTRACT)
    if contract not in CONTRACTS:
        raise TaskSpecError(f"{where} ({wid}) contract = {toml_text(contract)} — allowed: {listed(CONTRACTS)} "
                            f"(\"exact\": bitwise equal to the baseline, where upstream's contract is exact; "
                            f"\"close\": SGLang's float64 error test, docs/task-contract.md)")
    context = merged.get("context")
    if context is not None and (not isinstance(context, str) or not WORKLOAD_ID.fullmatch(context)):
        raise TaskSpecError(f"{where} ({wid}) context = {toml_text(context)} — allowed: the name of a context in "
                            f"bench/context.py's CONTEXTS (letters, digits, '_', '.', '-')")
    return Workload(id=wid, production=production, params={**merged, "production": production},
                    mutates=tuple(mutates), contract=contract, context=context, **tolerances)


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise TaskSpecError(f"{shown(path)}: reading TOML needs Python >= 3.11 (tomllib) or the tomli package")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TaskSpecError(f"{shown(path)}: missing (see docs/task-contract.md)") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskSpecError(f"{shown(path)}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskSpecError(f"{shown(path)}: not UTF-8 text (byte {exc.start}), so not TOML") from None


def _check_tables(path: Path, data: dict[str, Any], *, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    allowed = (*required, *optional)
    for key in data:
        if key in PER_SIDE_TABLES:
            raise TaskSpecError(
                f"{shown(path)}: [{_named(key)}] — per-side settings are refused: both sides are built by the same builder "
                f"with the one [build] flags list (docs/task-contract.md)"
            )
        if key not in allowed:
            raise TaskSpecError(
                f"{shown(path)}: [{_named(key)}] — unknown table{suggestion(key, allowed)}; allowed: {listed(allowed)}"
            )
    for key in required:
        if key not in data:
            raise TaskSpecError(f"{shown(path)}: [{key}] is missing")


def _check_keys(path: Path, table: str, values: dict[str, Any], allowed: tuple[str, ...]) -> None:
    if not isinstance(values, dict):
        raise TaskSpecError(f"{shown(path)}: [{table}] must be a table")
    for key in values:
        if key in allowed:
            continue
        if table in ("build", "baseline") and _is_per_side(key, values[key]):
            raise TaskSpecError(
                f"{shown(path)}: [{table}] {_named(key)} — per-side build settings are refused: both sides are built by "
                f"the same builder with the one [build] flags list (docs/task-contract.md)"
            )
        raise TaskSpecError(
            f"{shown(path)}: [{table}] {_named(key)} — unknown key{suggestion(key, allowed)}; allowed: {listed(allowed)}"
        )


def _is_per_side(key: str, value: Any) -> bool:
    side_words = ("baseline", "candidate", "solution")
    build_words = ("flag", "cflag", "source", "builder", "option", "arch", "define", "include", "ldflag")
    lowered = key.lower()
    return (
        any(word in lowered for word in side_words)
        or isinstance(value, dict)
        or any(word in lowered for word in build_words)
    )


def _task_info(path: Path, values: dict[str, Any], root: Path) -> TaskInfo:
    _check_keys(path, "task", values, ("name", "arch", "family", "gpu_only"))
    name = _string(path, "task", "name", values)
    # On a host the task lives in tasks/<name>/workspace; locally in kernels/<name>.
    folder = root.resolve()
    if name not in (folder.name, folder.parent.name):
        raise TaskSpecError(f"{shown(path)}: [task] name = {name!r} — must equal the folder name {folder.name!r}")
    gpu_only = _string(path, "task", "gpu_only", values) if "gpu_only" in values else None
    return TaskInfo(name=name, arch=_task_arch(path, values), family=_string(path, "task", "family", values),
                    gpu_only=gpu_only)


def _task_arch(path: Path, values: dict[str, Any]) -> str:
    """[task] arch: one arch, or the list of arches one task folder serves (arch = ["h200", "b200"])."""
    value = values.get("arch")
    if value is None:
        raise TaskSpecError(f"{shown(path)}: [task] arch is missing")
    names = value if isinstance(value, list) else [value]
    where = f"{shown(path)}: [task] arch = {toml_text(value) if not isinstance(value, list) else json.dumps(value)}"
    allowed = f'allowed: {listed(ARCHES)}, or a list of them, e.g. arch = ["h200", "b200"]'
    unknown = [name for name in names if name not in ARCHES]
    if not names or (unknown and not isinstance(value, list)):
        raise TaskSpecError(f"{where} — {allowed}")
    if unknown:
        raise TaskSpecError(f"{where} — {toml_text(unknown[0])} is not an arch; {allowed}")
    if len(set(names)) < len(names):
        raise TaskSpecError(f"{where} — name each arch once")
    if "any" in names and len(names) > 1:
        raise TaskSpecError(f'{where} — "any" already means every arch: write arch = "any" alone')
    return ",".join(names)


def _baseline_info(path: Path, values: dict[str, Any]) -> BaselineInfo:
    _check_keys(path, "baseline", values,
                ("repo", "ref", "commit", "files", "follows", "release", "wheel", "wheel_sha256", "sha256"))
    files = string_list(path, "baseline", "files", values.get("files", []))
    for key in ("follows", "release", "wheel", "wheel_sha256"):
        if values.get(key) is not None and not isinstance(values[key], str):
            raise TaskSpecError(f"{shown(path)}: [baseline] {key} = {values[key]!r} — allowed: a string")
    return BaselineInfo(
        repo=_string(path, "baseline", "repo", values),
        ref=str(values.get("ref", "")),
        commit=str(values.get("commit", "unresolved")),
        files=tuple(files),
        follows=values.get("follows"),
        release=values.get("release"),
        wheel=values.get("wheel"),
        wheel_sha256=values.get("wheel_sha256"),
        sha256=_pinned_digests(path, values.get("sha256", {})),
    )


def _pinned_digests(path: Path, table: Any) -> tuple[tuple[str, str], ...]:
    """[baseline.sha256]: relative paths (nothing outside baseline/upstream/) to 64-hex sha256s."""
    if not isinstance(table, dict):
        raise TaskSpecError(f"{shown(path)}: [baseline] sha256 must be a table: [baseline.sha256] \"path\" = \"<sha256>\"")
    for rel, digest in table.items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
            raise TaskSpecError(f"{shown(path)}: [baseline.sha256] {json.dumps(rel)} — allowed: a path relative to "
                                "baseline/upstream/ (no '..', no leading '/')")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise TaskSpecError(f"{shown(path)}: [baseline.sha256] {json.dumps(rel)} = {digest!r} — allowed: a sha256 "
                                "(64 lowercase hex digits)")
    return tuple(sorted(table.items()))


def _build_spec(path: Path, values: dict[str, Any]) -> BuildSpec:
    _check_keys(path, "build", values, ("kind", "flags", "sources", "include_dirs", "entry", "exports"))
    return parse_build(path, values)


def _timing_settings(path: Path, values: dict[str, Any]) -> TimingSettings:
    defaults = TimingSettings()
    allowed = tuple(f.name for f in fields(TimingSettings))
    _check_keys(path, "timing", values, allowed)
    settled: dict[str, Any] = {}
    for f in fields(TimingSettings):
        if f.name not in values:
            continue
        value = values[f.name]
        if f.name == "mode":
            _check_choice(path, "timing", "mode", value, TIMING_MODES)
        elif not _finite_number(value) or value <= 0:
            raise TaskSpecError(f"{shown(path)}: [timing] {f.name} = {value!r} — allowed: a number > 0")
        elif isinstance(getattr(defaults, f.name), int) and not isinstance(value, int):
            raise TaskSpecError(f"{shown(path)}: [timing] {f.name} = {value!r} — allowed: a whole number > 0")
        settled[f.name] = value
    timing = replace(defaults, **settled)
    if timing.target_rse >= 1:
        raise TaskSpecError(f"{shown(path)}: [timing] target_rse = {timing.target_rse} — allowed: 0 < x < 1")
    if timing.max_samples < timing.min_samples:
        raise TaskSpecError(f"{shown(path)}: [timing] max_samples = {timing.max_samples} — must be >= min_samples")
    if timing.max_time_s < timing.min_time_s:
        raise TaskSpecError(f"{shown(path)}: [timing] max_time_s = {timing.max_time_s} — must be >= min_time_s")
    return timing


# ---------------------------------------------------- message helpers (shown, listed, string_list, toml_text: shared)


def _finite_number(value: Any) -> bool:
    """An int or float (not a bool) that a float can hold: TOML gives nan and inf, and integers of any size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _string(path: Path, table: str, key: str, values: dict[str, Any]) -> str:
    value = values.get(key)
    if value is None:
        raise TaskSpecError(f"{shown(path)}: [{table}] {key} is missing")
    if not isinstance(value, str) or not value.strip():
        raise TaskSpecError(f"{shown(path)}: [{table}] {key} = {value!r} — allowed: a non-empty string")
    return value


def _check_choice(path: Path, table: str, key: str, value: Any, allowed: tuple[str, ...], origin: str = "") -> None:
    if value not in allowed:
        where = origin or f"{shown(path)}: [{table}] {key}"
        raise TaskSpecError(f"{where} = {toml_text(value)} — allowed: {listed(allowed)}")


def _named(key: str) -> str:
    """A key from the file as a message shows it: as written, or quoted when it holds a newline, an escape, ..."""
    return key if key.isprintable() and key.strip() == key and key else json.dumps(key)
