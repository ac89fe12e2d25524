"""The outside cross-check of a run's timings: production rows re-measured by Nsight Compute, against the harness.

    report = audit_rows(task_dir, run_dir, "candidate", [AuditRow("w1", harness_us=12.3), ...], env=worker_env)
    answer = audit_row({"task_dir": ..., "run_dir": ..., "workload": "w1", "harness_us": {"baseline": 20.1,
                        "candidate": 12.3}, "env": worker_env, "mode": "cold"})     (the runner's per-row hook)
    report.status    "audited" | "partly audited: K of N rows (why)" | "unaudited: ncu not found" | "unaudited: why"
    report.rows      one RowAudit per row; to_json(): workload, ncu_us, harness_us, agree, tolerance (µs),
                     tolerance_rule, note, kernels_per_call, report (the .ncu-rep, which stays on the host)
    answer           agree, side, harness_us, ncu_us, tolerance, tolerance_rule, note (of the side that decides),
                     status and sides (each side's RowAudit), cache_control, outputs ({side: ok, status,
                     message}: what the audited calls wrote, judged by auditcases.check)

The runner calls audit_row after all rows, once per timed production row, with both sides' harness medians per
call (µs), its worker environment (CUDA_VISIBLE_DEVICES, TRITON_CACHE_DIR, PYTHONPATH) and, for CUDA tasks, the
built modules (default: read from raw/prepare.json); audit_rows is the same per side over a list of rows. agree
False is what makes a row INVALID there, showing both numbers; agree None means the row could not be audited, and
note says why. ncu runs with `--cache-control none`: in cold mode the audited process reads 2 x L2 before each call
(outside the profiled range), so a call starts cold and its kernels share the L2 as in the harness's samples; a
graph-mode row is audited warm, as its replays run.

Each row runs in a process of its own, started under
    ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum
        --export raw/audit/<side>-<row>.ncu-rep --force-overwrite
        python -m kpremote.agent.harness.side --fd 0 --side <side> --run-dir <run>   < raw/audit/<side>-<row>.job.json
so the audited side's code never runs in the caller's process, and one row's kernels can never be taken for
another's. It starts as a timed side does (side.py's command line, the run folder, the side's environment and
scratch), its job on standard input. That process imports the audited side and the adapter only (the other side
is bound as None), makes `warmup` calls outside the profiled region and `calls` calls each inside
cudaProfilerStart/Stop, each on a case of its own made from a secret drawn here (auditcases.py: the audited process
never sees it) with its outputs poisoned before it; what each call wrote is judged after the row like a timed
call's (auditcases.check: `outputs` in the answer; the runner makes a candidate whose audited calls computed
something else INCORRECT). The candidate's process runs before the baseline's. Its report is read back with
`ncu --import R --csv --page raw` (ncu.import_report), never from the profiled process's stdout, which the side
controls. The region's kernels, in launch order, are cut into `calls` equal groups (one call each), each group
summed, and the median over the groups is ncu_us; a kernel count that is not a multiple of the calls falls back to
the mean per call and says so.

ncu serialises kernels, so a call of several kernels is measured without the gaps between its launches: the tolerance (TOLERANCES, by the length ncu measured) allows for that and for the launch inside the harness's
event pair: 2.5 µs + 8 % below 20 µs, 2.5 µs + 5 % from 20 µs (measured on the H200: docs/trust.md).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import AGENT_HOME, sandbox
from . import ncu
from ..procfs import kill_tree
from .profiledcall import bound_adapter, job_task, profiled, synchronize, warm_up
from ..protocol import PROFILE_SIDES

# (below this length in µs, absolute µs, relative): the first band the ncu length falls in gives the tolerance.
# The absolute part is the launch the harness's event pair holds and ncu's gpu__time_duration does not: on the H200
# honest rows read 1.2-2.2 µs above ncu at every length (docs/trust.md, "Audit tolerance").
TOLERANCES = ((20.0, 2.5, 0.08), (math.inf, 2.5, 0.05))
# Cold rows: a timed window holds its kernels and the event pair's own cost, which the device probe measures in
# each run before any task code runs (timing.empty_window: what an empty call's event pair reads on this GPU now;
# 1.22-1.31 us on the H100 and H200). Since harness 2.11 a cold window must be at least ncu's length + that empty
# window - EMPTY_MARGIN_US - EMPTY_RELATIVE x ncu; less, and the window lost work (forged event times, work on
# another stream or before the start event). The margin is what honest kernels showed: a window around a kernel
# holds its kernel and 0.43 us less to 0.8 us more than the empty pair (how far its launch overlaps the start event
# differs by kernel: the red team's baseline on the H100, 0.85-1.06 us above ncu with an empty window of 1.22-1.28 us;
# the H200's production rows, 1.18-2.08 us above with 1.28-1.31 us), and ncu's own length varies by up to ~1 % from
# one process to the next. A run whose probe has no empty window falls back to harness 2.8's fixed WINDOW_FLOOR.
EMPTY_MARGIN_US = 0.7
EMPTY_RELATIVE = 0.01
WINDOW_FLOOR = (0.5, 0.005)  # (us above ncu, less this share of ncu): the fallback without an empty window
# A forge of the candidate's window this large (%) must be visible to the audit; where the window stands further
# above its floor than that, a FASTER verdict is unverified (forge_blind_spot_pct; issue 44).
FORGE_VISIBLE_PCT = 5.0
WARMUP_CALLS = 3
AUDIT_CALLS = 5
# The candidate's audited process runs first: while it runs, no results of the baseline's (the same cases' expected
# outputs, where the adapter has no reference) lie in any scratch folder.
AUDIT_ORDER = ("candidate", "baseline")
ROW_LIMIT_S = 600.0
NCU_NOT_FOUND = "unaudited: ncu not found"
# Failures that no other row would escape either: the whole side is unaudited.
WHOLE_SIDE = ("ncu_missing", "counter_permission")


@dataclass(frozen=True)
class AuditRow:
    """A production row to audit and the harness's median per call for this side, in µs."""

    workload: str
    harness_us: float


@dataclass
class RowAudit:
    workload: str
    ncu_us: float | None
    harness_us: float
    agree: bool | None
    tolerance: float | None  # µs, for the length ncu measured
    tolerance_rule: str | None
    note: str
    kernels_per_call: float | None = None
    report: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditReport:
    side: str
    status: str
    rows: list[RowAudit] = field(default_factory=list)
    ncu: str | None = None
    ncu_version: str | None = None
    cache_control: str = "all"
    warmup: int = WARMUP_CALLS
    calls: int = AUDIT_CALLS

    @property
    def disagreements(self) -> list[RowAudit]:
        return [row for row in self.rows if row.agree is False]

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [r.to_json() for r in self.rows]}


# --------------------------------------------------------------------------------------------- judging


def tolerance_us(length_us: float) -> tuple[float, str]:
    """How far the harness may be from ncu for a call ncu measured at length_us, and the rule that says so."""
    for below, absolute, relative in TOLERANCES:
        if length_us < below:
            parts = ([f"{absolute:g} µs"] if absolute else []) + ([f"{relative:.0%}"] if relative else [])
            where = f"below {below:g} µs" if math.isfinite(below) else f"from {TOLERANCES[-2][0]:g} µs"
            return absolute + relative * length_us, f"{' + '.join(parts)} {where}"
    raise AssertionError("TOLERANCES must end with an infinite band")


def per_call_us(durations_us: list[float], calls: int) -> tuple[float, float, str]:
    """(µs per call, kernels per call, note): the median over equal groups of launches, else the mean."""
    if not durations_us:
        return 0.0, 0.0, "ncu saw no kernel launched by the audited calls"
    per_call, rest = divmod(len(durations_us), calls)
    if rest:
        return (sum(durations_us) / calls, len(durations_us) / calls,
                f"{len(durations_us)} kernels over {calls} calls is not a whole number per call: mean per call")
    sums = [sum(durations_us[i * per_call:(i + 1) * per_call]) for i in range(calls)]
    return statistics.median(sums), float(per_call), f"median over {calls} calls of {per_call} kernel(s) each"


def window_floor_us(length_us: float, empty_us: float | None = None) -> tuple[float, str]:
    """How far above ncu's length (us; below it, when negative) a cold window must be, and the rule: derived from
    this run's empty window when the probe measured one (empty_us), else the fixed WINDOW_FLOOR."""
    if empty_us is not None and empty_us > 0:
        return (empty_us - EMPTY_MARGIN_US - EMPTY_RELATIVE * length_us,
                f"a window holds its kernels + this run's empty window ({empty_us:.2f} µs) - {EMPTY_MARGIN_US:g} µs "
                f"- {EMPTY_RELATIVE:.0%}")
    absolute, relative = WINDOW_FLOOR
    return (absolute - relative * length_us,
            f"a window holds its kernels + {absolute:g} µs - {relative:.1%} (fixed: no empty window in this run's probe)")


def judge_row(row: AuditRow, ncu_us: float, kernels_per_call: float, note: str, report: str | None,
              one_sided: bool = False, empty_us: float | None = None) -> RowAudit:
    """Agreement of the harness's median with ncu's length. one_sided (cold rows): the window may be longer than
    the kernels by any amount (a neighbour's load lengthens both sides alike; a side's own excess only hurts it,
    and audit_row compares the two sides' excesses), never shorter than the kernels and the floor above them
    (window_floor_us, from this run's empty window empty_us)."""
    if one_sided:
        allowed, rule = window_floor_us(ncu_us, empty_us)
        agree = row.harness_us >= ncu_us + allowed
        verdict = "agree" if agree else "DISAGREE (the timed window is shorter than the kernels in it)"
        text = (f"{verdict}: ncu {ncu_us:.2f} µs, harness {row.harness_us:.2f} µs, at least {ncu_us + allowed:.2f} "
                f"µs ({rule}); {note}")
        return RowAudit(row.workload, round(ncu_us, 4), row.harness_us, agree, round(allowed, 4), rule, text,
                        kernels_per_call, report)
    allowed, rule = tolerance_us(ncu_us)
    agree = abs(ncu_us - row.harness_us) <= allowed
    verdict = "agree" if agree else "DISAGREE"
    text = (f"{verdict}: ncu {ncu_us:.2f} µs, harness {row.harness_us:.2f} µs, allowed ±{allowed:.2f} µs "
            f"({rule}); {note}")
    return RowAudit(row.workload, round(ncu_us, 4), row.harness_us, agree, round(allowed, 4), rule, text,
                    kernels_per_call, report)


def _unaudited(row: AuditRow, why: str) -> RowAudit:
    return RowAudit(row.workload, None, row.harness_us, None, None, None, f"not audited: {why}")


# --------------------------------------------------------------------------------------------- the audit


def audit_rows(task_dir: Path, run_dir: Path, side: str, rows: list[AuditRow], env: dict[str, str] | None = None,
               *, device: str = "cuda", modules: dict[str, str | None] | None = None, warmup: int = WARMUP_CALLS,
               calls: int = AUDIT_CALLS, cache_control: str = "all", row_limit_s: float = ROW_LIMIT_S,
               raw_dir: Path | str | None = None, empty_window_us: float | None = None,
               secrets_by_row: dict[str, bytes] | None = None) -> AuditReport:
    """Re-measure each row of one side under ncu (a process per row) and compare with the harness's medians. Each
    row's cases come from its secret (secrets_by_row, else one drawn here): auditcases.make writes them into the
    side's scratch folder before the row's process starts, and its results file is left there for
    auditcases.check (audit_row runs it)."""
    if side not in PROFILE_SIDES:
        raise ValueError(f"side {side!r}: allowed: {', '.join(PROFILE_SIDES)}")
    env = _target_env(env)
    found = ncu.find_ncu(env)
    if found is None:
        return AuditReport(side, NCU_NOT_FOUND, [_unaudited(r, "ncu not found") for r in rows],
                           cache_control=cache_control, warmup=warmup, calls=calls)
    scratch = sandbox.make_scratch(sandbox.side_scratch(Path(run_dir), side))
    env = {**env, **sandbox.scratch_env(scratch),  # the audited calls run sandboxed (profiledcall.py)
           **sandbox.side_reads(Path(run_dir), side, Path(task_dir))}
    report = AuditReport(side, "audited", [], found, ncu.ncu_version(found), cache_control, warmup, calls)
    folder = Path(raw_dir) if raw_dir else Path(run_dir) / "raw" / "audit"
    folder.mkdir(parents=True, exist_ok=True)
    modules = modules if modules is not None else _built_modules(Path(run_dir))
    whole_side: str | None = None
    for row in rows:
        if whole_side:
            report.rows.append(_unaudited(row, whole_side))
            continue
        paths = call_files(run_dir, side, row.workload)
        job = {"task_dir": str(task_dir), "device": device, "side": side, "workload": row.workload,
               "warmup": warmup, "calls": calls, "modules": modules, "flush_per_call": cache_control == "call",
               "inputs": str(paths["inputs"]), "results": str(paths["results"]), "done": str(paths["done"])}
        secret = (secrets_by_row or {}).get(row.workload) or secrets.token_bytes(32)
        try:
            run_cases("make", {"task_dir": str(task_dir), "workload": row.workload, "device": device,
                               "secret": secret.hex(), "count": calls + 1, "inputs": {side: job["inputs"]}},
                      env, Path(run_dir), row_limit_s)
            report.rows.append(_audit_one(found, folder, row, job, env, cache_control, row_limit_s, scratch,
                                          empty_window_us, Path(run_dir)))
        except ncu.NcuError as exc:
            if exc.kind in WHOLE_SIDE:
                whole_side = str(exc)
            report.rows.append(_unaudited(row, str(exc)))
    report.status = _status(report.rows, whole_side)
    return report


def audit_row(request: dict[str, Any]) -> dict[str, Any]:
    """The runner's per-row hook: both sides of one timed row, as audit_rows judges them, folded into one answer.

    request: task_dir, run_dir, workload, harness_us {side: median µs per call}, and optionally raw_dir, mode
    ("graph": caches left warm, as graph replays run), modules, env, device, empty_window_us (what this run's device
    probe read for an empty call: a cold window's floor starts from it). The answer: agree (False if a side
    disagrees, None if a side could not be audited and none disagrees), and harness_us / ncu_us / tolerance / note
    of the side that decides it (the candidate when both agree), plus every side's RowAudit under "sides".
    """
    # Cold mode: the audited process flushes the L2 itself before each call and ncu leaves the caches alone, so the
    # kernels of one call share the L2 as they do in the harness (ncu's own per-kernel flush measured a two-kernel
    # call of SGLang's rotary 1.3-1.9x slower than the harness on the H200). Graph mode: warm, as replays run.
    cache_control = "none" if request.get("mode") == "graph" else "call"
    sides: dict[str, RowAudit] = {}
    status: dict[str, str] = {}
    secret = secrets.token_bytes(32)  # the row's cases, the same for both sides; never in the audited processes
    for side in AUDIT_ORDER:
        harness = (request.get("harness_us") or {}).get(side)
        if harness is None:
            continue
        report = audit_rows(Path(request["task_dir"]), Path(request["run_dir"]), side,
                            [AuditRow(request["workload"], float(harness))], request.get("env"),
                            device=request.get("device", "cuda"), modules=request.get("modules"),
                            cache_control=cache_control, raw_dir=request.get("raw_dir"),
                            empty_window_us=request.get("empty_window_us"),
                            secrets_by_row={request["workload"]: secret})
        sides[side], status[side] = report.rows[0], report.status
    if not sides:
        return {"agree": None, "note": "no harness median to audit", "sides": {}}
    outputs = check_outputs(request, list(sides), secret)
    sides = {side: sides[side] for side in PROFILE_SIDES if side in sides}
    if cache_control == "call":
        _baseline_no_longer_than_the_candidate(sides)
    deciding = (next((r for r in sides.values() if r.agree is False), None)
                or next((r for r in sides.values() if r.agree is None), None)
                or sides.get("candidate") or next(iter(sides.values())))
    agree = False if any(r.agree is False for r in sides.values()) else (
        None if any(r.agree is None for r in sides.values()) else True)
    side = next(name for name, row in sides.items() if row is deciding)
    return {"agree": agree, "side": side, "harness_us": deciding.harness_us, "ncu_us": deciding.ncu_us,
            "tolerance": deciding.tolerance, "tolerance_rule": deciding.tolerance_rule, "note": deciding.note,
            "status": status, "cache_control": cache_control, "sides": {k: v.to_json() for k, v in sides.items()},
            "outputs": outputs, "forge_blind_spot_pct": _blind_spot(sides.get("candidate"), cache_control)}


def forge_blind_spot_pct(harness_us: float, ncu_us: float, allowed_us: float) -> float:
    """The largest share (%) a forge could take off a cold window of harness_us and still pass the audit's floor
    (ncu's length + allowed_us, window_floor_us): (median - floor) / median, none below 0."""
    if harness_us <= 0:
        return 0.0
    return max(0.0, 100.0 * (harness_us - (ncu_us + allowed_us)) / harness_us)


def unverified_share(answer: dict[str, Any] | None) -> float | None:
    """The row's blind spot where it is too large for the audit to vouch for a FASTER (over FORGE_VISIBLE_PCT)."""
    share = (answer or {}).get("forge_blind_spot_pct")
    return share if isinstance(share, (int, float)) and share > FORGE_VISIBLE_PCT else None


def _blind_spot(candidate: RowAudit | None, cache_control: str) -> float | None:
    """For a cold row whose candidate window passed the floor; None where there is no floor to measure from."""
    if cache_control != "call" or candidate is None or candidate.agree is not True or not candidate.ncu_us \
            or candidate.tolerance is None:
        return None
    return round(forge_blind_spot_pct(candidate.harness_us, candidate.ncu_us, candidate.tolerance), 1)


def check_outputs(request: dict[str, Any], sides: list[str], secret: bytes) -> dict[str, dict[str, Any]]:
    """What each side's audited calls wrote, judged by auditcases.check against the row's cases made again from
    its secret: {side: {"ok": True | False | None, "status", "message"}}. The row's files leave the scratch
    folders after it, whatever happened."""
    run_dir = Path(request["run_dir"])
    files = {side: call_files(run_dir, side, request["workload"]) for side in sides}
    try:
        return run_cases("check", {"task_dir": request["task_dir"], "workload": request["workload"],
                                   "device": request.get("device", "cuda"), "secret": secret.hex(),
                                   "count": AUDIT_CALLS + 1,
                                   "results": {side: str(paths["results"]) for side, paths in files.items()},
                                   "inputs": {side: str(paths["inputs"]) for side, paths in files.items()}},
                         _target_env(request.get("env")), run_dir, ROW_LIMIT_S)
    except ncu.NcuError as exc:
        return {side: {"ok": None, "status": None, "message": f"not checked: {exc}"} for side in sides}
    finally:
        for paths in files.values():
            for path in paths.values():
                path.unlink(missing_ok=True)


def _baseline_no_longer_than_the_candidate(sides: dict[str, RowAudit]) -> None:
    """Cold rows: the baseline's window may exceed its kernels by no more than the candidate's does, within the
    two-sided tolerance: time in the baseline's windows that the candidate's do not hold flatters the candidate.
    (A neighbour that lengthens every window, or a second kernel's launch gap, is within it.)"""
    base, cand = sides.get("baseline"), sides.get("candidate")
    if not base or not cand or base.agree is not True or cand.agree is None or base.ncu_us is None:
        return
    extra = (base.harness_us - base.ncu_us) - (cand.harness_us - (cand.ncu_us or 0.0))
    allowed, rule = tolerance_us(base.ncu_us)
    if extra > allowed:
        base.agree = False
        base.tolerance, base.tolerance_rule = round(allowed, 4), rule
        base.note = (f"DISAGREE (the baseline's window holds {extra:.2f} µs more beyond its kernels than the "
                     f"candidate's, allowed {allowed:.2f} µs: {rule}): " + base.note)


def _status(rows: list[RowAudit], whole_side: str | None) -> str:
    audited = [r for r in rows if r.agree is not None]
    if len(audited) == len(rows):
        return "audited"
    why = whole_side or next(r.note for r in rows if r.agree is None).removeprefix("not audited: ")
    if not audited:
        return f"unaudited: {why}"
    return f"partly audited: {len(audited)} of {len(rows)} rows ({why})"


def _audit_one(found: str, folder: Path, row: AuditRow, job: dict[str, Any], env: dict[str, str],
               cache_control: str, limit_s: float, scratch: Path, empty_us: float | None = None,
               run_dir: Path | None = None) -> RowAudit:
    stem = f"{job['side']}-{row.workload}"
    report, done = folder / f"{stem}.ncu-rep", Path(job["done"])  # the sandboxed target writes only its scratch
    job_path, log_path = folder / f"{stem}.job.json", folder / f"{stem}.log"
    for stale in (report, done, Path(job["results"])):
        stale.unlink(missing_ok=True)
    job_path.write_text(json.dumps(job, indent=1))
    # Started as a timed side is (side.py's command line, working directory and environment); its job comes on
    # standard input, not from a file named on its command line (docs/trust.md says what still tells them apart).
    target = [sys.executable, "-m", "kpremote.agent.harness.side", "--fd", "0", "--side", job["side"],
              "--run-dir", str(run_dir or Path(job["task_dir"]))]
    command = ncu.audit_command(found, report=report, target=target,
                                cache_control="none" if cache_control == "call" else cache_control)
    returncode = _run(command, log_path, env, run_dir or Path(job["task_dir"]), limit_s, job_path)
    try:
        ncu.check_profile(log_path.read_text(errors="replace"), returncode, report, target_finished=done.is_file(),
                          kernel_regex=None)
    except ncu.NcuError as exc:
        if exc.kind != "no_kernels":
            report.unlink(missing_ok=True)
            raise
        return judge_row(row, *per_call_us([], job["calls"]), None, one_sided=cache_control == "call",
                         empty_us=empty_us)
    csv_text = ncu.import_report(found, report)
    (folder / f"{stem}.raw.csv").write_text(csv_text)
    launches = sorted(ncu.parse_raw_csv(csv_text), key=lambda launch: int(launch.identity.get("ID") or 0))
    seconds = [launch.metrics.get(ncu.AUDIT_METRIC) for launch in launches]
    if any(value is None for value in seconds):
        raise ncu.NcuError("ncu_failed", f"ncu's report {report.name} lacks {ncu.AUDIT_METRIC} for some kernels")
    return judge_row(row, *per_call_us([value * 1e6 for value in seconds], job["calls"]), str(report),
                     one_sided=cache_control == "call", empty_us=empty_us)


def _run(command: list[str], log_path: Path, env: dict[str, str], cwd: Path, limit_s: float,
         stdin: Path | None = None) -> int:
    with open(log_path, "wb") as log, open(stdin or os.devnull, "rb") as given:
        child = subprocess.Popen(command, stdin=given, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        return child.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        kill_tree(child)
        raise ncu.NcuError("target_failed", f"ncu and the audited calls took longer than {limit_s:g} s") from None
    except BaseException:  # a cancelled run takes ncu and the audited process with it
        if child.poll() is None:
            kill_tree(child)
        raise


def call_files(run_dir: Path | str, side: str, workload: str) -> dict[str, Path]:
    """Where a side's audited process finds its cases and leaves its results and record: its scratch folder, the
    one place it may write, under names that say nothing of the audit."""
    scratch = sandbox.side_scratch(Path(run_dir), side)
    return {"inputs": scratch / f"cases-{workload}.pt", "results": scratch / f"results-{workload}.pt",
            "done": scratch / f"done-{workload}.json"}


def run_cases(command: str, request: dict[str, Any], env: dict[str, str], cwd: Path, limit_s: float) -> dict:
    """auditcases.py's make or check, in a process of its own (it imports torch and the adapter, which the runner
    never does); the request, with the row's secret, goes on its standard input. Its one JSON line, or NcuError."""
    try:
        done = subprocess.run([sys.executable, "-m", "kpremote.agent.ncu.auditcases", command],
                              input=json.dumps(request), capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise ncu.NcuError("target_failed", f"the audit's cases ({command}) took longer than {limit_s:g} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        why = (answer or {}).get("error") if isinstance(answer, dict) else None
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise ncu.NcuError("target_failed", f"the audit's cases ({command}) failed: {why or tail or done.returncode}")
    return answer


def _target_env(env: dict[str, str] | None) -> dict[str, str]:
    """The caller's worker environment, with this agent importable in the audited process."""
    env = dict(os.environ if env is None else env)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    if str(AGENT_HOME) not in paths:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AGENT_HOME), *paths]))
    return env


def _built_modules(run_dir: Path) -> dict[str, str | None]:
    """The built extensions of a CUDA task, as the prepare step recorded them (none for Triton)."""
    try:
        sides = json.loads((run_dir / "raw" / "prepare.json").read_text())["build"]["sides"]
        return {side: (record or {}).get("module") for side, record in sides.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


# --------------------------------------------------------------------------------------------- the audited process


def call_row(job: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then make the audited calls of one side for one row, each inside the profiler's region, each on a
    case of its own that auditcases.make wrote from the runner's secret (case 0: the warm-up's), its outputs (and
    mutated inputs, restored first) poisoned before it; what each call produced goes to the job's results file,
    which auditcases.check judges once the process has ended."""
    import torch

    from ..harness import correctness

    spec, workload, device = job_task(job)
    params, side = workload.params, job["side"]
    made = torch.load(job["inputs"], map_location=device, weights_only=True)
    mutates = tuple(made["mutates"])
    cases = [(case["inputs"], case["outputs"], correctness.clone_tensors(case["inputs"])) for case in made["cases"]]
    adapter = bound_adapter(spec, side, (job.get("modules") or {}).get(side))
    function = getattr(adapter, f"call_{side}")
    warm_inputs, warm_outputs, _ = cases[0]
    warm_up(lambda: function(params, warm_inputs, warm_outputs), job["warmup"], device)
    flush = _cold_l2(device) if job.get("flush_per_call") else None
    results = []
    for inputs, outputs, pristine in cases[1:1 + job["calls"]]:
        correctness.restore_mutated(pristine, inputs, mutates)
        correctness.poison_outputs(outputs)
        if flush is not None:  # cold at the call's start, as in the harness's samples (outside the profiled range)
            flush()
        synchronize(device)
        with profiled(device):
            function(params, inputs, outputs)
            synchronize(device)
        results.append({name: value.detach().cpu().clone()
                        for name, value in correctness.results_of(outputs, inputs, mutates).items()})
    torch.save(results, job["results"])
    return {"side": side, "workload": workload.id, "warmup": job["warmup"], "calls": job["calls"]}


def _cold_l2(device: str) -> Any:
    """A read of 2 x L2 (the harness's flush): the L2 holds none of the call's data afterwards."""
    if device != "cuda":
        return None
    from ..harness.timing import L2Flusher

    return L2Flusher(None).flush_buffer.max


