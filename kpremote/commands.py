"""The `inv` commands. Each task parses flags, calls one module that does the work, and renders the result."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional

from invoke import Collection

from .runs import interrupt

interrupt.install_early()  # before the slower imports below: Ctrl-C from the first moment kpremote is loaded

from .cli import options as checks  # noqa: E402
from .views import terminal  # noqa: E402
from .cli.commandline import EXIT_FAILED, EXIT_USAGE, command, finish, finish_asking_hosts  # noqa: E402
from .agent.protocol import RunExit
from .hosts.config import load_inventory
from .errors import KpremoteError, StoppedByUser
from .cli.jsonout import print_document
from .project import kernels_dir
from .task.taskdir import TaskDir, find_task, find_tasks

HOSTS_HELP = ("hosts file (default: $KPREMOTE_HOSTS, else the project's hosts.toml with ~/.config/kpremote/hosts.toml "
              "layered over it, else that file alone)")


@command(help={"check": "also connect to each host (in parallel): hostname, python, torch, triton, nvidia-ml-py",
               "host": "only this host, or the hosts of this group (default: every host)",
               "hosts": HOSTS_HELP, "json": "print JSON instead of a table"})
def hosts(c, check=False, host=None, hosts=None, json=False):
    """List the hosts of hosts.toml (name, address, arch, container, groups); --check reaches each one."""
    from .hosts import gpustatus  # imported here: `inv run` and the others never need it
    from .hosts.fanout import on_every_host
    from .views.hosts import hosts_view

    inventory = load_inventory(hosts)
    selected = inventory.select(host)
    infos = None
    if check:
        with terminal.Waiting("hosts --check") as waiting:
            answers = on_every_host(selected, gpustatus.info_host, waiting.hosts(len(selected)))
        infos = {info.host: info for info in answers}
    if json:
        print_document("hosts", {"hosts": [
            {"name": h.name, "address": h.address, "arch": h.arch, "container": h.container, "groups": list(h.groups),
             **({"check": infos[h.name].model_dump()} if infos else {})}
            for h in selected
        ]})
    else:
        terminal.show(hosts_view(selected, infos))
    answers = list((infos or {}).values())
    finish_asking_hosts(inventory, host, [info.answered for info in answers], [info.ok for info in answers])


@command(help={"host": "a host name or a group (default: every host)", "hosts": HOSTS_HELP,
               "json": "print the kpremote.gpu-status/1 JSON document (docs/schemas/gpu-status.json); with --watch, "
                       "one document per line per refresh",
               "watch": "refresh every SECONDS until Ctrl-C",
               "pids": "show each process's pid (name/pid(MiB))", "uuid": "show each GPU's UUID",
               "show_all": "show everything: UUID, pids, power, SM clock, clock events, why a GPU is busy",
               "no_color": "no colors (NO_COLOR in the environment does the same)"},
         short={"pids": "p", "uuid": "u", "show_all": "a"})
def gpu_status(c, host=None, hosts=None, json=False, watch: Optional[float] = None, pids=False, uuid=False,
               show_all=False, no_color=False):
    """Every GPU of every host, queried in parallel through NVML: one line per GPU, like gpustat."""
    from .hosts import gpustatus
    from .views.gpus import GpuViewOptions

    watch = checks.watch_seconds(watch)
    if no_color:
        terminal.plain_output()
    inventory = load_inventory(hosts)
    selected = inventory.select(host)
    options = GpuViewOptions(pids=pids, uuid=uuid, all=show_all)
    if watch:
        _watch_gpus(selected, watch, options, json)
        return
    with terminal.Waiting("gpu-status") as waiting:
        reports = gpustatus.gpu_status(selected, waiting.hosts(len(selected)))
    if json:
        print_document("gpu-status", gpustatus.gpu_status_body(reports))
    else:
        from .views.nodes import gpu_tables  # GPU hosts in the usual view, Slurm clusters per node

        for table in gpu_tables(reports, options):
            terminal.show(table)
    finish_asking_hosts(inventory, host, [r.answered for r in reports], [r.ok for r in reports])


def _watch_gpus(selected, seconds: float, options, as_json: bool) -> None:
    """Refresh every SECONDS until Ctrl-C (exit 130, as for every Ctrl-C, with a calm line: it is how a watch
    stops): the view, or one JSON document per line."""
    from .hosts import gpustatus
    from .views.gpus import gpu_view, show_every, watch_header

    try:
        if as_json:
            while True:
                print_document("gpu-status", gpustatus.gpu_status_body(gpustatus.gpu_status(selected)), one_line=True)
                time.sleep(seconds)
        show_every(seconds, lambda: gpu_view(gpustatus.gpu_status(selected), options, header=watch_header(seconds)))
    except KeyboardInterrupt:
        raise StoppedByUser("stopped watching") from None


@command(help={"host": "the host whose key to accept", "fingerprint": "the SHA256:... fingerprint you verified",
               "hosts": HOSTS_HELP})
def trust_host(c, host, fingerprint, hosts=None):
    """Add a host's key to known_hosts, only if it has the fingerprint you verified out of band."""
    from .hosts.hostkeys import trust

    [selected] = load_inventory(hosts).select(host)
    terminal.say(trust(selected, fingerprint).describe(selected.known_hosts))  # the known_hosts line whole


KERNELS = kernels_dir()  # the project's kernels/, wherever in the project the command runs (project.py)
TASK_HELP = "a task folder name under kernels/"
EDITED_TASK_HELP = ("run a task whose files outside solution/ differ from the project's HEAD commit (its results say "
                    "TASK EDITED, never count as measured before, and are not compared with the pinned task's)")


@command(help={"host": "host name", "task": TASK_HELP, "hosts": HOSTS_HELP, "json": "print the sync report as JSON"})
def sync(c, host, task, hosts=None, json=False):
    """Sync kernels/TASK to the host's task workspace: only changed files travel; deletions follow."""
    from .runs.session import open_session
    from .runs.sync import sync_task

    [selected] = load_inventory(hosts).select(host)
    task_dir = find_task(KERNELS, task)
    _ensure_upstream([task_dir])
    with terminal.Waiting(f"sync {task} to {selected.name}") as waiting:
        waiting.say("connecting")
        session = open_session(selected)
        try:
            waiting.say("sending the changed files")
            report = sync_task(session.agent, task_dir)
        finally:
            session.close()
    if json:
        print_document("sync", dataclasses.asdict(report))
    else:
        for warning in report.warnings:
            terminal.errors.print(f"warning: {warning}")
        terminal.say(f"{selected.name}: {task}: {report.files_sent} files sent ({report.bytes_sent} bytes), "
                     f"{report.deleted} deleted, {report.channels} channel(s)")


@command(
    help={"host": "host name or group (default: local)", "task": "task name, or several separated by commas",
          "hosts": HOSTS_HELP, "detach": "start the run and return its id", "gpu": "GPU index or UUID (still leased)",
          "wait": "wait for an idle GPU (optionally at most SECONDS) instead of failing",
          "workloads": "only these workload ids, comma-separated", "mode": "cold (L2 flushed per call) or graph",
          "device": "auto, cuda or cpu (cpu = smoke run through Triton's interpreter)",
          "no_audit": "skip the Nsight Compute re-measurement of the production rows (the run reads unaudited)",
          "json": "print the outcome as JSON",
          "json_stream": "print every event as a JSON line as it happens (phase, workload i/n, each row's verdict, "
                         "each run's end; docs/schemas/run-event.json), then the --json document on one line",
          "again": "run even a candidate the ledger says was measured on this host already (same sha256s, harness, bench/)",
          "edited_task": EDITED_TASK_HELP},
    optional=["wait"],
)
def run(c, task, host="local", hosts=None, detach=False, gpu=None, wait=None, workloads=None, mode=None,
        device="auto", no_audit=False, json=False, json_stream=False, again=False, edited_task=False):
    """Sync, lease an idle GPU, build both sides, gate on correctness, time, summarize, fetch the summary."""
    from .hosts.connect import connect_early_to

    names = checks.task_names(task)
    connect_early_to(hosts, host, len(names))  # first: the handshake passes while the rest is imported and checked
    from .runs.eventstream import EventStream
    from .runs.placement import launch, measured_already
    from .runs.session import RunOptions

    plain = not (again or workloads or mode or gpu or no_audit or device != "auto")  # a run as measured before
    mode, ids = checks.mode(mode), checks.workload_ids(workloads)
    tasks = find_tasks(KERNELS, names)
    _ensure_upstream(tasks)
    checks.refuse_edited_tasks(tasks, edited_task=edited_task)
    checks.check_tasks(tasks, timing_mode=mode, workloads=ids)
    run_options = RunOptions(gpu=checks.gpu(gpu), wait=checks.wait_seconds(wait),
                             workloads=",".join(ids) if ids else None, mode=mode, device=checks.device(device),
                             audit=not no_audit)
    selected = load_inventory(hosts).select(host)
    tasks, already = measured_already(tasks, selected) if plain else (tasks, [])
    stream = EventStream() if json_stream else None
    outcomes = launch(selected, tasks, run_options, detach=detach, as_json=json, already=already, stream=stream)
    refused = any(o.status == "not started" for o in outcomes)  # the host refused a start: as before, exit 2
    finish(all(o.ok for o in outcomes), code=EXIT_USAGE if refused else EXIT_FAILED)


@command(help={"host": "host name or group (default: every host)", "hosts": HOSTS_HELP, "json": "print JSON (every run)",
               "task": "only this task's runs", "all": "list every run (default: the newest 10 of each task)"})
def status(c, host=None, hosts=None, json=False, task=None, all=False):
    """Runs on the hosts: id, task, GPU, status and phase, age, headline."""
    from .hosts.fanout import on_every_host
    from .runs.remote import runs_or_error
    from .views.runlist import SHOWN, runs_view

    inventory = load_inventory(hosts)
    selected = inventory.select(host)
    with terminal.Waiting("status") as waiting:
        answers = on_every_host(selected, lambda h, agent: runs_or_error(h, agent, task),
                                          waiting.hosts(len(selected)))
    if json:
        print_document("status", {"hosts": answers})
    else:
        terminal.show(runs_view(answers, shown=None if all else SHOWN))
    finish_asking_hosts(inventory, host, [a["ok"] for a in answers], [a["ok"] for a in answers])  # not ok: not asked


RUN_HELP = "a run id, a unique part of one (its last 6 characters will do), or latest"


@command(help={"host": "host name", "run": RUN_HELP, "task": "the run's task (found from the run id if omitted)",
               "follow": "keep following until the run ends", "hosts": HOSTS_HELP,
               "json": "print each event as a JSON line (docs/schemas/run-event.json), the last one the run's end"})
def logs(c, host, run, task=None, follow=False, hosts=None, json=False):
    """The run's event stream, rendered as the live view shows it; re-attachable at any time."""
    from .runs.eventstream import EventStream
    from .runs.placement import show_logs
    from .runs.remote import named_run

    [selected] = load_inventory(hosts).select(host)
    run, task = named_run(selected, run, task)
    finish(show_logs(selected, run, task, follow, EventStream() if json else None))


@command(help={"host": "host name", "run": RUN_HELP, "task": "the run's task (found from the run id if omitted)",
               "hosts": HOSTS_HELP})
def cancel(c, host, run, task=None, hosts=None):
    """Cancel a run: its whole process group is killed and its GPU lease released."""
    from .runs.remote import cancel_run, find_task_of_run, named_run
    from .runs.session import open_session

    [selected] = load_inventory(hosts).select(host)
    run, task = named_run(selected, run, task)
    session = open_session(selected)
    try:
        answer = cancel_run(session, task or find_task_of_run(session, run), run)
    finally:
        session.close()
    state = answer.get("state", {})
    terminal.say(f"{selected.name}: run {run}: {state.get('status', '?')}"
                 + ("" if answer.get("cancelled") else " (it had already ended)"))


@command(help={"host": "host name", "task": TASK_HELP, "run": "a run id, a unique part of one, latest (default) or all",
               "hosts": HOSTS_HELP, "json": "print what was fetched as JSON",
               "raw_file": "instead: fetch this one file of the run's raw/ (e.g. ncu/baseline-W.ncu-rep); its size "
                           "is shown first",
               "force": "with --raw-file: fetch even when the file is larger than the host's max_summary_mb"})
def fetch_results(c, host, task, run="latest", hosts=None, json=False, raw_file=None, force=False):
    """Bring back a run's summary/ (never raw/) into kernels/TASK/results/HOST/RUN-ID/; --raw-file NAME: one raw file."""
    from .runs.fetch import fetch_results as fetch
    from .runs.profile import show_raw_file
    from .runs.remote import named_run
    from .runs.session import open_session

    [selected] = load_inventory(hosts).select(host)
    if run not in ("latest", "all"):
        run, _ = named_run(selected, run, task)
    session = open_session(selected)
    try:
        if raw_file:
            show_raw_file(session, task, run, raw_file, KERNELS, force=force, as_json=json)
            return
        reports = fetch(session.agent, task, run, KERNELS, selected.name)
    finally:
        session.close()
    if json:
        print_document("fetch-results", {"host": selected.name, "task": task,
                                         "fetched": [dataclasses.asdict(r) for r in reports]})
    else:
        for report in reports:
            terminal.say(f"{selected.name}: {task} run {report.run_id} ({report.run_status}): "
                         f"{report.outcome} → {report.path}")


@command(
    help={"host": "host name (default: local)", "task": TASK_HELP, "workload": "the one workload id to profile",
          "hosts": HOSTS_HELP, "side": "baseline, candidate or both (default)",
          "set": "ncu section set: basic (default; plus memory and warp-state sections) or full",
          "kernel": "profile only kernels whose function name matches this regular expression",
          "warmup": "calls before the profiled region (default 3)", "calls": "profiled calls per side (default 3)",
          "detach": "start the profile run and return its id", "wait": "wait for an idle GPU (optionally at most "
          "SECONDS) instead of failing", "json": "print the outcome as JSON"},
    optional=["wait"],
)
def profile(c, task, workload, host="local", hosts=None, side="both", set="basic", kernel=None, warmup=None,
            calls=None, detach=False, wait=None, json=False):
    """Nsight Compute on the host: gate the workload, profile each side under ncu, bring back profile.md/.csv."""
    from .agent.protocol import ProfileRequest
    from .runs.profile import profile as run_profile
    from .runs.profile import show_profile

    selected = load_inventory(hosts).select(host)
    if len(selected) != 1:
        from .errors import KpremoteError

        raise KpremoteError(f"--host {host} names {len(selected)} hosts; a profile runs on one: name that host")
    if selected[0].is_cluster:  # issue 15 covers inv run; a profile job needs ncu on the node (docs/slurm.md)
        from .errors import KpremoteError

        raise KpremoteError(f"{host}: inv profile does not submit to a Slurm cluster yet; profile on a GPU host")
    request = ProfileRequest(side=side, section_set=set, kernel=kernel,
                             warmup=checks.whole_number("--warmup", 3 if warmup is None else warmup, minimum=0,
                                                         maximum=100),
                             calls=checks.whole_number("--calls", 3 if calls is None else calls, minimum=1,
                                                        maximum=100))
    [task_dir] = find_tasks(KERNELS, [task])
    checks.check_tasks([task_dir], timing_mode=None, workloads=[workload])
    outcome = run_profile(selected[0], task_dir, workload, request, wait=checks.wait_seconds(wait),
                          detach=detach, quiet=json)
    if json:
        print_document("profile", dataclasses.asdict(outcome))
    else:
        show_profile(outcome)
    finish(outcome.ok)


@command(help={"task": TASK_HELP, "workloads": "only these workload ids, comma-separated",
               "json": "print the kpremote.check/1 JSON document (docs/schemas/check.json) instead of the views",
               "edited_task": EDITED_TASK_HELP})
def check(c, task, workloads=None, json=False, edited_task=False):
    """Local CPU smoke run of a task through Triton's interpreter (timings are not meaningful)."""
    from .runs.check import NOT_CHECKED_HERE, smoke_check

    [task_dir] = find_tasks(KERNELS, [task])
    ids = checks.workload_ids(workloads)
    _ensure_upstream([task_dir])
    if ids:  # an id the task lacks: refused before any run starts (a task the runner refuses: its own view)
        checks.check_tasks([task_dir], timing_mode=None, workloads=ids)
    checks.refuse_edited_tasks([task_dir], edited_task=edited_task)
    outcome = smoke_check(task_dir, ",".join(ids) if ids else None, quiet=json)
    if json:
        print_document("check", outcome)
    refused = outcome["exit_code"] == RunExit.REFUSED  # the task itself is not one the runner takes: bad input
    # nothing of it can be checked on a CPU (the task needs a GPU): said, not a failure of the candidate
    finish(outcome["exit_code"] == 0 or outcome["status"] == NOT_CHECKED_HERE, EXIT_USAGE if refused else EXIT_FAILED)


@command(help={"name": "the new task's folder name under kernels/"})
def new_task(c, name):
    """Scaffold kernels/NAME: a complete small Triton task that passes `inv check` at once."""
    from .project import find_root
    from .task.scaffold import new_task as scaffold

    if find_root() is None:
        raise KpremoteError(f"{Path.cwd()} is not inside a project (no hosts.toml, nor a pyproject.toml with "
                            "[tool.kpremote], here or above): run new-task in a project, or start one with a hosts.toml")
    path = scaffold(name, KERNELS)
    terminal.say(f"created {path}; try: inv check --task {name}")


@command(help={"task": TASK_HELP, "repo": "the upstream repository: a URL git can fetch (or a local path); with "
                                         "--pypi, the repository the release comes from (default: task.toml's)",
               "ref": "a branch, a tag or a 40-hex commit (default: main)",
               "files": "the upstream files to copy, comma-separated, relative to the repository root (with --pypi: "
                        "as the wheel holds them, e.g. sglang/kernels/ops/...)",
               "force": "replace an existing baseline/upstream/ and an already pinned [baseline] commit or wheel",
               "source": "read the upstream from this local git snapshot of REPO (a git folder or a checkout); "
                         "REPO is what the pin records",
               "pypi": "pin a release instead of a commit: DIST==VERSION (pip downloads that one wheel into the "
                       "cache, $KPREMOTE_CACHE or ~/.cache/kpremote) or a path to a .whl file",
               "materialize": "re-create baseline/upstream/ from the wheel task.toml pins (every sha256 checked)",
               "json": "print the pin as JSON"})
def baseline(c, task, repo=None, files=None, ref="main", force=False, json=False, source=None, pypi=None,
             materialize=False):
    """Pin the upstream baseline (a commit, or a release wheel with --pypi) and copy FILES into baseline/upstream/."""
    from .task.pinning import pin_as_asked

    document, line = pin_as_asked(task, find_task(KERNELS, task).path, repo=repo, files=files, ref=ref, force=force,
                                  source=source, pypi=pypi, materialize=materialize)
    if json and document is not None:
        print_document("baseline", document)
    else:
        terminal.console.print(line, markup=False)


def _ensure_upstream(tasks: list[TaskDir]) -> None:
    """Pinned upstream files a task lacks are materialized from their wheel before it is synced or run."""
    from .task.baseline import ensure_task_upstreams

    for line in ensure_task_upstreams(tasks):
        terminal.errors.print(line, markup=False, soft_wrap=True)  # on stderr: stdout may be a --json document


@command(help={"task": TASK_HELP,
               "host": "only runs fetched from this host (default: any; the default base is on the new run's host)",
               "new": "the new run: an id, a unique part of one, or latest (default)",
               "base": "the base run (default: the run before the new one, on its host)",
               "last": "compare the last N runs: each row's speedup in each, and the newest against the oldest",
               "json": "print the kpremote.compare/1 JSON document (docs/schemas/compare.json)"})
def compare(c, task, host=None, new="latest", base=None, last: Optional[int] = None, json=False):
    """Did it help? Two fetched runs row by row: medians, speedup change with its interval, FASTER / SAME / SLOWER."""
    from .results.compare import MAX_LAST, compare_document
    from .views.compare import compare_view

    if last is not None:
        last = checks.whole_number("--last", last, minimum=2, maximum=MAX_LAST)
    document = compare_document(KERNELS, task, host, new, base, last)
    if json:
        print_document("compare", document)
    else:
        terminal.show(compare_view(document, terminal.console.width))  # its run lines whole, never cropped


@command(help={"task": TASK_HELP, "host": "only runs fetched from this host",
               "plot": "where to draw the plot (default: kernels/TASK/results/history.png)",
               "json": "print the kpremote.history/1 JSON document (docs/schemas/history.json)"})
def history(c, task, host=None, plot=None, json=False):
    """Every fetched run of a task, oldest first: commit, status, headline; and a plot of the headline over time."""
    from .results.history import history_document
    from .views.compare import history_view

    document = history_document(KERNELS, task, host, Path(plot) if plot else None)
    if json:
        print_document("history", document)
    else:
        terminal.show(history_view(document, terminal.console.width))  # the plot's path whole, never cropped


@command(help={"for_": "claude (~/.claude/skills/kpremote/), codex (~/.agents/skills/kpremote/) or a folder"})
def skill_install(c, for_=None):
    """Install kpremote's agent skill (SKILL.md: the loop, verdicts, exit codes) for a coding agent."""
    from .skill import install

    terminal.console.print(f"installed {install(for_ or '')}", markup=False)


ns = Collection(hosts, gpu_status, trust_host, sync, run, status, logs, cancel, fetch_results, check, new_task,
                baseline, profile, compare, history, skill_install)
