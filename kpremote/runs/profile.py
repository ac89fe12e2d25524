"""`inv profile` and `inv fetch-results --raw-file`: Nsight Compute on a host, the summary home, the reports left there.

A profile is a run like any other (start with the sync in one channel, follow, fetch the summary: only a passed
one's, a failed profile stays on the host), except that `start --profile JSON` asks for a profile run: the agent spawns its profile runner (kpremote/agent/ncu/profile.py). Its
heavy .ncu-rep files stay in the run's raw/ on the host; one of them comes home only when asked for by name, into
kernels/<task>/results/<host>/.raw/<run-id>/ (a hidden folder: it is not a fetched summary, and re-fetching the
summary never compares against it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..agent.protocol import ProfileRequest
from ..agent.provenance import file_sha256
from ..hosts.agentclient import Agent, error_message
from ..hosts.config import Host
from ..cli.jsonout import print_document
from ..errors import FetchRefused, HostError, KpremoteError, RemoteCommandError
from .fetch import MIB, SummaryReceiver, checked_name, fetch_run, real_folder, select_runs
from .placement import Outcome
from .remote import follow_run, reattach_hint, start_run
from .session import RunOptions, RunSession, open_session
from ..task.taskdir import TaskDir, find_task
from ..views import terminal
from ..views.results import summary_markdown
from ..views.run import RunView
from ..views.start import StartView

RAW_FOLDER = ".raw"


# --------------------------------------------------------------------------------------------- inv profile


def profile(host: Host, task: TaskDir, workload: str, request: ProfileRequest, *,
            wait: Optional[float] = None, detach: bool = False, quiet: bool = False) -> Outcome:
    """Start a profile run of one workload on an idle GPU of host, follow it, and fetch its summary.

    While it starts, the run's line says so (connecting, syncing, starting, waiting for a GPU) as `inv run`'s does;
    quiet (--json) says nothing on the way.
    """
    problems = request.problems()
    if problems:
        raise KpremoteError("; ".join(problems))
    options = RunOptions(workloads=workload, profile=request.to_json(), wait=wait)
    started_at = time.monotonic()
    session = open_session(host)
    key = f"{host.name}/{task.name}"
    with RunView(quiet=quiet) as live:
        try:
            with StartView(live, key, task.name, silent=quiet) as shown:
                run = start_run(session, task, options, on_progress=shown.on(host.name))
                if not detach:
                    live.add(key, run.host, task.name, run.run_id, run.gpu)  # in place of its starting line
        except BaseException:
            session.close()
            raise
        outcome = Outcome(host=run.host, task=task.name, run_id=run.run_id, status="detached" if detach else "running",
                          synced_files=run.synced_files)
        try:
            if not detach:
                _follow_and_fetch(session, live, key, outcome, task)
        except HostError as exc:
            outcome.status = "connection lost"
            outcome.error = f"{exc}; {reattach_hint(run.host, task.name, run.run_id)}"
        finally:
            outcome.channels = session.channels
            outcome.seconds = time.monotonic() - started_at
            session.close()
    return outcome


def _follow_and_fetch(session: RunSession, live: RunView, key: str, outcome: Outcome, task: TaskDir) -> None:
    summary = SummaryReceiver(session.host, outcome.run_id)
    state = follow_run(session, outcome.task, outcome.run_id, lambda event: live.event(key, event),
                       summary_sink=summary)
    outcome.status = state.get("status", "unknown")
    outcome.exit_code = state.get("exit_code")
    outcome.headline = state.get("headline")
    if outcome.status != "passed":
        outcome.error = state.get("message") or state.get("error") or f"the profile run is {outcome.status}"
    if outcome.status == "passed":  # a failed profile has no profile to bring home: it stays on the host
        fetched = fetch_run(session.agent, task, state, outcome.host, summary.data)
        outcome.summary_dir = str(fetched.path)


def show_profile(outcome: Outcome) -> None:
    """profile.md as the host wrote it, or the run's one-line error."""
    if outcome.status == "detached":
        terminal.say(f"{outcome.host}: {outcome.task}: started profile run {outcome.run_id} "
                     f"(follow: inv logs --host {outcome.host} --run {outcome.run_id} --follow; then inv fetch-results)")
        return
    profile_md = Path(outcome.summary_dir) / "profile.md" if outcome.summary_dir else None
    if profile_md and profile_md.is_file():
        terminal.console.print(summary_markdown(profile_md))
        terminal.say(f"{outcome.host}: {outcome.task}: profile run {outcome.run_id} {outcome.status}; "
                     f"summary: {outcome.summary_dir}")
    if outcome.error:
        terminal.error_line(f"{outcome.task}: run {outcome.run_id or '-'}: {outcome.error}")


# --------------------------------------------------------------------------------------------- one raw file


@dataclass
class RawFile:
    host: str
    task: str
    run_id: str
    name: str
    bytes: int
    sha256: str
    host_path: str
    path: Path
    outcome: str  # "fetched" | "unchanged"


def show_raw_file(session: RunSession, task: str, run: str, name: str, kernels_dir: Path, *, force: bool,
                  as_json: bool) -> None:
    """`inv fetch-results --raw-file NAME`: the file fetched, its size said first; or the --json document."""
    def announce(info: dict) -> None:
        if not as_json:
            terminal.say(f"{session.host.name}: raw/{info['name']}: {info['bytes']} bytes "
                         f"({info['bytes'] / 1048576:.2f} MiB), sha256 {info['sha256']}")

    fetched = fetch_raw_file(session.agent, task, run, name, kernels_dir, session.host.name, force=force,
                             on_stat=announce)
    if as_json:
        print_document("fetch-results", {"host": session.host.name, "task": task, "fetched": [],
                                         "raw_file": asdict(fetched)})
    else:
        terminal.say(f"{fetched.outcome} → {fetched.path}")


def fetch_raw_file(agent: Agent, task: str, run: str, name: str, kernels_dir: Path, host_name: str, *,
                   force: bool = False, on_stat: Optional[Callable[[dict[str, Any]], None]] = None) -> RawFile:
    """One named file of a finished run's raw/, after its size is known and within the host's max_summary_mb
    (unless force); checked against the host's sha256 before it lands, never replacing a different file."""
    task_dir = find_task(kernels_dir, task).path
    if run == "all":
        raise FetchRefused("--raw-file fetches one file of one run: give --run ID (or latest)")
    [state] = select_runs(agent, task, run, host_name)
    run_id = checked_name(state.get("run_id"), "run id", host_name)
    parts = raw_name_parts(name)
    info = agent.call_json("raw-file", "--task", task, "--run", run_id, "--name", "/".join(parts), "--stat")
    size, digest = int(info["bytes"]), str(info["sha256"])
    if on_stat:
        on_stat(info)
    limit = agent.host.max_summary_mb * MIB
    if size > limit and not force:
        raise FetchRefused(f"{host_name}: raw/{'/'.join(parts)} of run {run_id} is {size / MIB:.1f} MB, over this "
                           f"host's max_summary_mb ({agent.host.max_summary_mb:g}); nothing was fetched (add --force "
                           "to fetch it anyway)")
    folder = real_folder(task_dir, "results", checked_name(host_name, "host name"), RAW_FOLDER, run_id, *parts[:-1])
    destination = folder / parts[-1]
    report = RawFile(host_name, task, run_id, "/".join(parts), size, digest, str(info.get("path")), destination,
                     "fetched")
    if destination.exists() or destination.is_symlink():
        if destination.is_symlink() or not destination.is_file() or file_sha256(destination) != digest:
            raise FetchRefused(f"{destination} already holds a different file; kept it as it is. Move it away to "
                               "fetch again.")
        report.outcome = "unchanged"
        return report
    _download(agent, task, run_id, report)
    return report


def raw_name_parts(name: str) -> list[str]:
    """'ncu/x.ncu-rep' (or 'raw/ncu/x.ncu-rep') as checked parts: each a plain file or folder name."""
    parts = [part for part in str(name).split("/") if part]
    if parts[:1] == ["raw"]:
        parts = parts[1:]
    if not parts:
        raise FetchRefused(f"invalid raw file name {name!r}: a path under the run's raw/, e.g. ncu/x.ncu-rep")
    return [checked_name(part, "raw file name") for part in parts]


def _download(agent: Agent, task: str, run_id: str, report: RawFile) -> None:
    """Into a hidden temporary file beside the destination, renamed into place only when size and sha256 match."""
    fd, tmp = tempfile.mkstemp(dir=report.path.parent, prefix=f".{report.path.name}.", suffix=".part")
    digest, received = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            def keep(chunk: bytes) -> None:
                nonlocal received
                received += len(chunk)
                if received > report.bytes:
                    raise FetchRefused(f"{report.host}: raw/{report.name} grew past the {report.bytes} bytes it had; "
                                       "nothing was written")
                digest.update(chunk)
                out.write(chunk)

            result = agent.call("raw-file", "--task", task, "--run", run_id, "--name", report.name, on_stdout=keep)
        if not result.ok:
            raise RemoteCommandError(report.host, f"cannot fetch raw/{report.name}: {error_message(result)}",
                                     result.exit_code, result.stderr_tail())
        if received != report.bytes or digest.hexdigest() != report.sha256:
            raise FetchRefused(f"{report.host}: raw/{report.name} arrived as {received} bytes with another sha256 "
                               "than the host announced; nothing was written")
        os.rename(tmp, report.path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


