"""`inv fetch-results`: a finished run's summary/ into kernels/<task>/results/<host>/<run-id>/, never raw/.

The archive is read whole (under a size cap), every member checked before anything is written, written into a hidden
folder next to the destination and renamed into place: a cut connection or a refused archive leaves nothing that looks
like a fetched summary. A summary already there is never replaced: the same content is a no-op, another is refused.
"""

from __future__ import annotations

import hashlib

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..agent.atomicfile import write_atomically
from ..agent.protocol import NAME_RULE, TERMINAL, ExitCode, RunResults, is_name
from ..hosts.agentclient import Agent, error_message
from ..hosts.config import Host
from ..errors import FetchRefused, HostError, RemoteCommandError
from ..results.ledger import kind_of, record_run
from ..results.runstore import is_profile_run
from .safetar import Member, read_members, read_tree, write_members
from ..task.taskdir import TaskDir, find_task

NEVER_FETCHED = ("raw",)
MIB = 1024 * 1024


@dataclass
class FetchReport:
    host: str
    task: str
    run_id: str
    run_status: str
    outcome: str  # "fetched" | "unchanged"
    path: Path
    files: int
    bytes: int
    headline: Any = None


def fetch_results(agent: Agent, task: str, run_id: str, kernels_dir: Path, host_name: str) -> list[FetchReport]:
    """Fetch one run by id, the newest finished run ("latest") or every finished run ("all"): one status call,
    then one channel per run. Runs refused (already fetched with other content) are named after the others landed."""
    task_dir = find_task(kernels_dir, task).path
    reports: list[FetchReport] = []
    refusals: list[str] = []
    try:
        for state in select_runs(agent, task, run_id, host_name):
            try:
                reports.append(fetch_one(agent, task_dir, state, host_name))
            except FetchRefused as exc:
                refusals.append(str(exc))
    finally:  # what landed is logged even when a later run breaks the loop
        refresh_docs(task_dir, [r for r in reports if r.outcome == "fetched"])
    if refusals:
        raise FetchRefused("\n".join(refusals))
    return reports


def fetch_run(agent: Agent, task: TaskDir, state: dict[str, Any], host_name: str,
              summary: Optional[bytes] = None) -> FetchReport:
    """Fetch the run described by state (a terminal state.json the caller already has, e.g. at the end of
    `inv run`): one channel, none when the summary tar came with the follow (summary)."""
    report = fetch_one(agent, task.path, state, host_name, summary)
    refresh_docs(task.path, [report] if report.outcome == "fetched" else [])
    return report


def select_runs(agent: Agent, task: str, wanted: str, host_name: str) -> list[dict[str, Any]]:
    """The terminal runs that `wanted` names, from the agent's `status`."""
    answer = agent.call_json("status", "--task", task)
    runs = answer.get("runs") if isinstance(answer, dict) else None
    if not isinstance(runs, list):
        raise HostError(host_name, f"status answered without a list of runs: {str(answer)[:200]}")
    runs = sorted((r for r in runs if isinstance(r, dict)), key=lambda r: str(r.get("run_id")))
    finished = [r for r in runs if r.get("status") in TERMINAL]
    if wanted in ("latest", "all"):
        if not finished:
            busy = len(runs) - len(finished)
            raise FetchRefused(f"{host_name}: no finished run of {task} to fetch"
                               + (f" ({busy} still running: inv logs --follow to wait)" if busy else ""))
        return finished[-1:] if wanted == "latest" else finished
    checked_name(wanted, "run id")
    match = [r for r in runs if r.get("run_id") == wanted]
    if not match:
        raise FetchRefused(f"{host_name}: no run {wanted} of {task}")
    if match[0].get("status") not in TERMINAL:
        raise FetchRefused(f"{host_name}: run {wanted} is {match[0].get('status')}; its summary is not final yet "
                           f"(inv logs --follow to wait)")
    return match


def fetch_one(agent: Agent, task_dir: Path, state: dict[str, Any], host_name: str,
              summary: Optional[bytes] = None) -> FetchReport:
    run_id = checked_name(state.get("run_id"), "run id", host_name)
    if summary is None:  # asked of the host only for a run whose runner sealed its summary
        refuse_unless_sealed(state, host_name, task_dir.name, run_id)
        summary = download_summary(agent, task_dir.name, run_id)
    members = read_members(summary, refused_tops=NEVER_FETCHED)
    refuse_unless_sealed(state, host_name, task_dir.name, run_id)
    refuse_unless_recorded(members, state, host_name, run_id)
    destination = real_folder(task_dir, "results", checked_name(host_name, "host name")) / run_id
    outcome = "unchanged" if destination.exists() or destination.is_symlink() else "fetched"
    if outcome == "unchanged":
        refuse_unless_identical(destination, members, host_name)
    else:
        move_into_place(members, destination)
        record_run(task_dir, destination, host_name, state.get("exit_code"), kind=kind_of(state))
    files = [m for m in members if m.data is not None]
    return FetchReport(host_name, task_dir.name, run_id, str(state.get("status")), outcome, destination, len(files),
                       sum(len(m.data or b"") for m in files), state.get("headline"))


def has_sealed_summary(state: dict[str, Any]) -> bool:
    """Whether the run's runner sealed a summary (records.py on the host: its sha256 and MAC in the final state)."""
    return bool(state.get("summary_sha256") and state.get("summary_mac"))


def refuse_unless_sealed(state: dict[str, Any], host_name: str, task: str, run_id: str) -> None:
    """A run whose runner sealed no summary is refused before anything is asked of the host: there is no "old run"
    path. Such a run stays readable on the host (inv logs, its folder)."""
    if not has_sealed_summary(state):
        missing = "summary hash" if not state.get("summary_sha256") else "summary MAC"
        raise FetchRefused(f"{host_name}: run {run_id} ({state.get('status')}): its runner recorded no {missing} (a "
                           f"runner before harness 2.17, or one that ended before it wrote a summary): not fetched; "
                           f"its rows stay readable with inv logs --host {host_name} --task {task} --run {run_id}, "
                           f"its files on the host under tasks/{task}/runs/{run_id}/")


def refuse_unless_recorded(members: list[Member], state: dict[str, Any], host_name: str, run_id: str) -> None:
    """The summary's results.json must be the one the run's runner wrote and sealed: its sha256 is in the run's
    final state (which the host checked against its MAC and index before it sent the summary)."""
    want = state.get("summary_sha256")
    results = next((m for m in members if m.path == "results.json" and m.data is not None), None)
    got = hashlib.sha256(results.data).hexdigest() if results else None
    if got != want:
        raise FetchRefused(f"{host_name}: run {run_id}: its summary's results.json "
                           f"{'has sha256 ' + got if got else 'is missing'}, but its runner recorded {want}: "
                           "not fetched (something other than the runner wrote it)")


def checked_name(name: Any, what: str, host_name: str = "") -> str:
    """Names that become local folder names (run ids come from the host: never trusted to be safe)."""
    if is_name(name):
        return name
    if host_name:
        raise HostError(host_name, f"sent an unusable {what} {name!r}; refused")
    raise FetchRefused(f"invalid {what} {name!r}: {NAME_RULE}")


class SummaryReceiver:
    """A run's summary tar as it arrives (from pack-summary, or after a follow's end line), refused past the
    host's max_summary_mb: a runaway summary never fills the client's memory or disk."""

    def __init__(self, host: Host, run_id: str) -> None:
        self.host = host
        self.run_id = run_id
        self.parts: list[bytes] = []
        self.received = 0

    def __call__(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.host.max_summary_mb * MIB:
            raise FetchRefused(f"{self.host.name}: the summary of run {self.run_id} is larger than "
                               f"{self.host.max_summary_mb:g} MB; stopped reading, nothing was written "
                               f"(raise max_summary_mb for this host in hosts.toml if it is expected)")
        self.parts.append(chunk)

    @property
    def data(self) -> Optional[bytes]:
        """The tar, or None when nothing came (a follow that sent no summary)."""
        return b"".join(self.parts) if self.parts else None


def download_summary(agent: Agent, task: str, run_id: str) -> bytes:
    """The tar of the run's summary/, reading no more than the host's max_summary_mb."""
    receiver = SummaryReceiver(agent.host, run_id)
    result = agent.call("pack-summary", "--task", task, "--run", run_id, on_stdout=receiver)
    if not result.ok:
        result.stdout = receiver.data or b""  # the agent's one-line JSON error, if it printed one
        if result.exit_code == ExitCode.SUMMARY_UNVERIFIED:
            raise FetchRefused(f"{agent.host.name}: {error_message(result)}")
        raise RemoteCommandError(agent.host.name, f"cannot fetch run {run_id}: {error_message(result)}",
                                 result.exit_code, result.stderr_tail())
    return receiver.data or b""


def real_folder(task_dir: Path, *parts: str) -> Path:
    """task_dir/parts as real folders: a link on the way could send writes outside the task."""
    folder = task_dir
    for part in parts:
        folder = folder / part
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise FetchRefused(f"{folder} is a link or a file, not a folder; refusing to write through it")
        folder.mkdir(exist_ok=True)
    return folder


def refuse_unless_identical(destination: Path, members: list[Member], host_name: str) -> None:
    incoming = {m.path: m.data for m in members if m.data is not None}
    if destination.is_symlink() or not destination.is_dir() or read_tree(destination) != incoming:
        raise FetchRefused(f"{destination} already holds a different summary of run {destination.name} from "
                           f"{host_name}; kept it as it is. Move it away to fetch again.")


def move_into_place(members: list[Member], destination: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.fetching-", dir=destination.parent))
    try:
        write_members(members, staging)
        os.rename(staging, destination)
    except OSError as exc:
        raise FetchRefused(f"cannot write {destination}: {exc.strerror or exc}; nothing was written") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- docs/results.md and docs/run_log.md


def refresh_docs(task_dir: Path, fetched: list[FetchReport]) -> None:
    """Append each new run to docs/run_log.md; docs/results.md follows the newest timing run fetched so far.

    CPU smoke runs and profile runs are logged but never replace docs/results.md: a quick-start smoke run
    must not overwrite the numbers of a real GPU run.
    """
    if not fetched:
        return
    docs = real_folder(task_dir, "docs")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    append_run_log(docs / "run_log.md", fetched, now)
    timed = [r for r in fetched if is_timing_run(r.path)]
    if not timed:
        return
    newest = max(timed, key=lambda r: r.run_id)
    summary_md = newest.path / "results.md"
    if newest.run_id >= newest_fetched_run(task_dir) and summary_md.is_file() and not summary_md.is_symlink():
        header = f"_Fetched from host `{newest.host}`, run `{newest.run_id}`, at {now} by kpremote._\n\n"
        write_atomically(docs / "results.md", header + summary_md.read_text(errors="replace"))


def is_timing_run(summary: Path) -> bool:
    """A real timing run's summary: not a CPU smoke run, not a profile run."""
    try:
        results = RunResults.read(summary / "results.json")
    except ValueError:
        return False
    return not results.smoke and not is_profile_run(results, summary)


def newest_fetched_run(task_dir: Path) -> str:
    runs = [p for p in (task_dir / "results").glob("*/*") if p.is_dir() and not p.name.startswith(".")]
    return max((p.name for p in runs if is_timing_run(p)), default="")


def append_run_log(path: Path, fetched: list[FetchReport], now: str) -> None:
    existing = path.read_text(errors="replace") if path.is_file() and not path.is_symlink() else ""
    lines = [run_log_line(r, now) for r in sorted(fetched, key=lambda r: r.run_id) if _marker(r) not in existing]
    if lines:
        start = "" if existing else "# Run log\n\n"
        write_atomically(path, existing + ("\n" if existing and not existing.endswith("\n") else "")
                              + start + "".join(lines))


def run_log_line(report: FetchReport, now: str) -> str:
    """A sentence a person reads: `- results/h/ID/ · passed · headline 1.024x (0.99–1.06) over 3 of 3 production rows
    · fetched ...`."""
    from ..views.run import headline_text

    headline = report.headline if isinstance(report.headline, str) or report.headline is None \
        else f"headline {headline_text(report.headline)}" if isinstance(report.headline, dict) else str(report.headline)
    detail = f" · {headline}" if headline else ""
    return f"- {_marker(report)} · {report.run_status}{detail} · fetched {now}\n"


def _marker(report: FetchReport) -> str:
    """The run's place under results/: unique per (host, run), so a re-fetch never adds a second line."""
    return f"results/{report.host}/{report.run_id}/"
