"""The harness: the judge and its parts (this folder). This file says what measured a result: the harness version
(HARNESS_VERSION), a digest of the harness's own files here and in the folders beside it (HARNESS_FILES,
harness_digest; harness_record: both, as a run records them), and the pinned task inputs (pinned_inputs).

A result is only as good as the code that judged it. results.json and results.md carry HARNESS_VERSION, the
sha256 of the harness files below, and the sha256 of the task's trusted inputs (bench/ and task.toml), so a
task's docs/results.md measured by an older harness, or against a changed bench, says so by itself
(resultsmd.harness_staleness). Standard library only: the client imports it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..provenance import file_sha256

__all__ = ["HARNESS_FILES", "HARNESS_VERSION", "cases", "correctness", "deviceprobe", "floors", "guard",
           "harness_digest", "harness_record", "judge", "judgeprocess", "numerics", "pinned_inputs", "profiledcall",
           "rowlog", "side", "stats", "timing"]

HARNESS_VERSION = "2.21"  # 2.0: process boundary (judge + one process per side), checked timed calls, floors;
# 2.1: no persisting-L2 reset inside a side before each sample (it inflated small kernels), the set-aside checked;
# 2.2: one judge and its sides serve a run's rows while they pass clean (judgeprocess.py), not a fresh set a row;
# 2.3: a row's noise threshold covers two timer ticks; the flush probe ramps the clocks first (no timed number moves)
# 2.4: a GPU row's noise threshold covers how far apart two side processes read one kernel (stats.PROCESS_FLOOR_US)
# 2.5: the headline's interval carries that floor too (stats.with_process_offset); rows' numbers and verdicts as 2.4
# 2.6: a side reads one byte per 64 KiB of its case's tensors before each head start (its address translations warm:
#      without, one 4 us kernel read 0.74 us apart from one process to the next); a sample whose window opened before
#      its call was queued is dropped and taken again with a longer head start (host time had been in such windows)
# 2.7: a candidate late 4 times in a row at the longest head start (a host sync in its call) keeps its samples, host
#      time and all, where 2.6 ended the row with ERROR; the baseline still ends it. Rows 2.6 finished: as in 2.6
# 2.8: each side, each side's build and the audited calls run sandboxed (sandbox/: Landlock, seccomp, the judge's PID
#      namespace); task code imported from source only; a row whose side leaves a process behind, is reniced,
#      re-pinned or starved, or whose candidate runs a helper thread while timed, is void (guard.py)
# 2.9: a cold GPU row is timed by four process pairs (timing.SIDE_PAIRS), its samples pooled, and its process floor is
#      0.3 us / sqrt(pairs) = 0.15 us (2.4-2.8: one pair, 0.75 us): each process's own offset, measured with the dial
# 2.10: a side seals its own machinery before task code is imported (seal.py): what the task replaces of the functions
#      that time and report its samples voids the row's times, and the window's clock after the call is torch's C
#      functions, read into the sample's frame first; honest numbers as 2.9's
# 2.11: the device probe measures what an empty call's event pair reads (timing.empty_window), and the audit's floor
#      for a cold window starts from it: its kernels + that empty window - 0.7 us - 1 % (2.8-2.10: + 0.5 us - 0.5 %)
# 2.12: the audit's floor starts from the least empty window the probe read, not their median (a host stalled
#      between an empty pair's records lengthens it: one H200 probe's median read 1.92 us where others read 1.28-1.34)
# 2.13: each side is forked from a copy of the judge taken once torch is imported (sidestarter.py), not exec'd, and
#      both sides build at once, each in its own sandboxed process: a run's cost, not its timing, is what changes
# 2.14: a row timed by several process pairs is FASTER or SLOWER only where 3 of its 4 pairs read it so on their own
#      (stats.PAIRS_AGREEING); else SAME, its verdict saying what the pooled samples alone would have called (held)
# 2.15: on a GPU both sides' build processes start before the device probe and import torch and Triton while it runs,
#      held at a gate (worker.BuildGate) until its numbers have left; no task code runs earlier than in 2.14. A CUDA
#      side's compile-only check (no GPU) compiles with torch's COMMON_NVCC_FLAGS too, as the GPU build does; the copy
#      probe records its fastest and slowest repeat beside the median (the floor still reads the median)
# 2.16: a row's floor holds it to the copy probe's fastest repeat, not its median (floors.reachable_gbps): a probe
#      whose every copy ran slow refused honest copy-speed rows in 4 of 54 four-GPU H200 runs of 2.14-2.15
#      A process pair whose timing only starvation disturbed is timed once more (guard.take_until_undisturbed)
# 2.17: the task sealed against its contestant and the candidate against its audit (issues 43, 44): the run records
#      its task digest against the pin; a side's /proc and /dev writes narrowed, the run's records unreadable, /dev/shm
#      its namespace's own, no capability as root, host-changing syscalls refused; the idle side's CPU (every thread)
#      while the other side is timed voids the row; trace/profile/monitoring hooks and a changed channel void the
#      reply; the audited calls run on secret cases and their outputs are judged; a FASTER the audit cannot vouch for
#      under 5 % reads FASTER (unverified); a smoke row has no verdict; a row's log holds its first 8 MiB
# 2.18: each row judged by SGLang's numerical contract too (numerics.py: float64 error ratios against the baseline's,
#      or bitwise exact), on top of the atol/rtol floor
# 2.19: a context may write an input the call rewrites in place (qknorm_rope); each row a typed record, made once by
#      the runner from the judge's answer, its every key declared and type-checked (record.py); no timed code changed
# 2.20: the side whose copies of a case (and of its context's state) are allocated first alternates from one case to
#      the next (cases.allocation_order); the warm regime calls no change under 2 % (stats.WARM_NOISE_FLOOR)
# 2.21: the side that goes first alternates from one process pair to the next too (its processes started, warmed
#      up, primed and their graphs captured in that order)
AGENT_DIR = Path(__file__).resolve().parents[1]
# The files whose code decides a verdict or a number: a change to any of them is a new harness.
# Each is named by its path from the agent's folder (AGENT_DIR), e.g. "harness/judge.py".
HARNESS_FILES = (
    "children.py", "contract.py", "harness/__init__.py", "harness/bench.py", "harness/cases.py", "harness/channel.py",
    "harness/comparison.py", "harness/contexts.py", "harness/correctness.py", "harness/deviceprobe.py",
    "harness/floors.py", "harness/guard.py", "harness/judge.py", "harness/judgeprocess.py", "harness/judgetiming.py",
    "harness/numerics.py", "harness/profiledcall.py", "harness/regimes.py", "harness/rowjudge.py",
    "harness/rowlog.py", "harness/sampling.py", "harness/seal.py", "harness/side.py", "harness/sideprocess.py",
    "harness/sidestarter.py", "harness/smclock.py", "harness/stats.py", "harness/streamcheck.py", "harness/timing.py",
    "ncu/audit.py", "ncu/auditcases.py", "ncu/auditprocesses.py", "ncu/ncu.py", "run/auditstep.py", "run/guards.py",
    "run/leasestep.py", "run/report.py", "run/resultsmd.py", "run/runchildren.py", "run/runner.py",
    "run/runoptions.py", "run/stopping.py", "run/worker.py", "sandbox/__init__.py", "sandbox/landlock.py",
    "sandbox/members.py", "sandbox/namespace.py", "sandbox/privileges.py", "sandbox/seccomp.py", "task/build.py",
    "task/builders/__init__.py", "task/builders/base.py", "task/builders/compiler.py", "task/builders/cuda.py",
    "task/builders/imported.py", "task/builders/tvmffi.py", "task/buildrules.py", "task/sourceonly.py",
    "task/taskfiles.py", "task/taskrecords.py", "task/taskspec.py",
)
# The other agent modules a run imports, and why none of them decides a verdict or a number
# (tests/unit/test_harness_files.py: every module a run imports is in one of the two lists).
OUTSIDE_THE_HARNESS = {
    "atomicfile.py": "writes files whole",
    "filelock.py": "holds a lock file (state.json's, a run's claims) while a record is written",
    "run/events.py": "writes the event stream the client follows",
    "lease.py": "chooses and holds the GPU; the arch gate refuses, it never measures",
    "nvml.py": "reads GPU state for the record",
    "run/plot.py": "draws the numbers report.py wrote",
    "procfs.py": "reads /proc, kills process trees",
    "protocol.py": "the client-agent seam: exit codes, names, request kinds, a GPU's state",
    "results.py": "the records results.json is written through (they carry the judge's and report.py's numbers, "
                  "never compute one)",
    "record.py": "the typed record results.py's records are made of: checks a document's types, never a number",
    "provenance.py": "stamps which source was measured",
    "run/runstate.py": "writes state.json",
    "run/records.py": "seals the summary report.py already wrote (its sha256 and MAC): no number, no verdict",
    "run/runpaths.py": "where runs live under ROOT and the task-name rule, for the seal's index",
    "run/__init__.py": "a docstring: says what the folder holds",
    "task/__init__.py": "a docstring: says what the folder holds",
    "ncu/__init__.py": "a docstring: says what the folder holds",
}


def harness_digest(folder: Path = AGENT_DIR) -> str:
    """sha256 over "name NUL sha256(content)" lines of the harness files, in name order (a missing file counts)."""
    digest = hashlib.sha256()
    for name in sorted(HARNESS_FILES):
        path = folder / name
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        digest.update(f"{name}\0{content}\n".encode())
    return digest.hexdigest()


def tree_sha256(folder: Path) -> str | None:
    """sha256 over "relative path NUL sha256(content)" lines of every file, in path order (caches skipped)."""
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def harness_record() -> dict[str, Any]:
    return {"version": HARNESS_VERSION, "digest": harness_digest()}


def pinned_inputs(task_dir: Path) -> dict[str, Any]:
    """The trusted-but-pinned task inputs: bench/ (adapter, workloads, tolerances) and task.toml."""
    task_dir = Path(task_dir)
    toml = task_dir / "task.toml"
    present = toml.is_file() and not toml.is_symlink()  # a link is never synced, so never read here either
    return {"bench_sha256": tree_sha256(task_dir / "bench"), "task_toml_sha256": file_sha256(toml) if present else None}
