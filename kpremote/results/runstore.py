"""The runs of a task fetched so far, read from kernels/<task>/results/: <host>/<run-id>/results.json (inv run,
inv fetch-results) and check/<stamp>/summary/results.json (inv check, host `check`), oldest first; each with whether
its record verifies (records.py: its results.json is the one a ledger line whose MAC verifies recorded)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..agent.protocol import PROFILE, RUNNERS, Headline, RowResult, RunResults
from ..errors import KpremoteError
from .ledger import read_ledger
from .records import record_problem, results_json
from ..runs.runids import resolve_run_id


@dataclass
class FetchedRun:
    task: str
    host: str
    run_id: str
    path: Path  # its results.json
    results: RunResults
    record: Optional[str] = None  # why its record does not verify (records.py); None when it does

    @property
    def started(self) -> str:
        return self.results.started

    @property
    def commit(self) -> Optional[str]:
        return self.results.part("source").get("git_commit")

    @property
    def dirty(self) -> bool:
        return bool(self.results.part("source").get("git_dirty"))

    @property
    def candidate_sha256(self) -> Optional[str]:
        """The sha256 of the candidate's files this run measured (provenance.py), None where the summary lacks it."""
        return self.results.part("source").get("solution_sha256")

    @property
    def task_digest(self) -> Optional[str]:
        return self.results.task_digest

    @property
    def task_state(self) -> Optional[str]:
        return self.results.task_state

    @property
    def smoke(self) -> bool:
        return bool(self.results.smoke)

    @property
    def status(self) -> str:
        return self.results.status

    @property
    def headline(self) -> Headline:
        return self.results.headline

    def rows(self) -> dict[str, RowResult]:
        return self.results.by_workload()

    def nothing_to_compare(self) -> Optional[str]:
        """Why this run has no results to compare (a profile run; a run no row of which has a speedup, as a
        cancelled or failed one; a run whose record does not verify), or None when it has."""
        if self.record:
            return f"not verified: {self.record}"
        if is_profile_run(self.results, self.path.parent):
            return f"a profile run, {self.status}"
        if not any(row.speedup for row in self.results.rows):
            return f"{self.status}, no row has a speedup"
        return None


def is_profile_run(results: RunResults, summary: Path) -> bool:
    """A summary of `inv profile` (its one row gated and timed once, then Nsight Compute), whether or not it got as
    far as profile.md: not a timing run."""
    command = results.provenance.get("command") or []
    return (summary / "profile.md").exists() or (isinstance(command, list) and RUNNERS[PROFILE] in command)


def _read(task: str, host: str, run_id: str, path: Path, lines: list[dict]) -> Optional[FetchedRun]:
    try:
        results = RunResults.read(path)
    except ValueError:
        return None  # a folder being written: not a run to compare
    if not results.is_summary:
        return None
    return FetchedRun(task=task, host=host, run_id=run_id, path=path, results=results,
                      record=record_problem(lines, host, run_id, path))


def fetched_runs(kernels_dir: Path, task: str, host: Optional[str] = None) -> list[FetchedRun]:
    """Every readable run of the task (on host, if given), oldest first (by start time, then id)."""
    from ..task.taskdir import find_task

    task_dir = find_task(kernels_dir, task)
    results, lines = task_dir.results, read_ledger(task_dir.path)
    runs = []
    for folder in sorted(results.glob("*/*")) if results.is_dir() else []:
        where = folder.parent.name
        if host is not None and where != host:
            continue
        run = _read(task, where, folder.name, results_json(task_dir.path, where, folder.name), lines)
        if run is not None:
            runs.append(run)
    return sorted(runs, key=lambda r: (r.started, r.run_id))


def find_run(runs: list[FetchedRun], wanted: str, where: str) -> FetchedRun:
    """The run that `wanted` names (an id, a unique part of one, or latest) among runs."""
    if not runs:
        raise KpremoteError(f"no fetched runs {where} (bring one home: inv fetch-results)")
    run_id = resolve_run_id(wanted, [r.run_id for r in runs], where)
    return next(r for r in runs if r.run_id == run_id)
