"""The `inv` commands. Each task parses flags, calls one module that does the work, and renders the result."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional

from invoke import Collection

from . import view
from .cli import EXIT_FAILED, EXIT_USAGE, command, finish, print_json
from .config import load_inventory

HOSTS_HELP = "hosts file (default: $KPREMOTE_HOSTS, else ./hosts.toml)"


@command(help={"check": "also connect to each host (in parallel): hostname, python, torch, triton, nvidia-ml-py",
               "hosts": HOSTS_HELP, "json": "print JSON instead of a table"})
def hosts(c, check=False, hosts=None, json=False):
    """List the hosts of hosts.toml (name, address, arch, container, groups); --check reaches each one."""
    from . import gpustatus  # imported here: `inv run` and the others never need it

    inventory = load_inventory(hosts)
    selected = inventory.select(None)
    infos = None
    if check:
        infos = {info.host: info for info in gpustatus.on_every_host(selected, gpustatus.info_host)}
    if json:
        print_json([
            {"name": h.name, "address": h.address, "arch": h.arch, "container": h.container, "groups": list(h.groups),
             **({"check": infos[h.name].model_dump()} if infos else {})}
            for h in selected
        ])
    else:
        view.console.print(view.hosts_table(selected, infos))
    finish(infos is None or all(info.ok for info in infos.values()))


@command(help={"host": "a host name or a group (default: every host)", "hosts": HOSTS_HELP,
               "json": "print the kpremote.gpu-status/1 JSON document (see README)",
               "watch": "refresh every SECONDS until Ctrl-C"})
def gpu_status(c, host=None, hosts=None, json=False, watch: Optional[float] = None):
    """Every GPU of every host, queried in parallel through NVML: memory, util, clocks, processes, lease, idle verdict."""
    from . import gpustatus

    selected = load_inventory(hosts).select(host)
    if watch:
        _watch_gpus(selected, float(watch))
        return
    reports = gpustatus.gpu_status(selected)
    if json:
        print_json(gpustatus.gpu_status_json(reports))
    else:
        from .slurm import gpu_tables  # GPU hosts in the usual table, Slurm clusters per node

        for table in gpu_tables(reports):
            view.console.print(table)
    finish(all(r.ok for r in reports))


def _watch_gpus(selected, seconds: float) -> None:
    from rich.live import Live

    from . import gpustatus

    try:
        with Live(view.gpu_table(gpustatus.gpu_status(selected)), console=view.console, auto_refresh=False) as live:
            while True:
                time.sleep(seconds)
                live.update(view.gpu_table(gpustatus.gpu_status(selected)), refresh=True)
    except KeyboardInterrupt:
        pass


@command(help={"host": "the host whose key to accept", "fingerprint": "the SHA256:... fingerprint you verified",
               "hosts": HOSTS_HELP})
def trust_host(c, host, fingerprint, hosts=None):
    """Add a host's key to known_hosts, only if it has the fingerprint you verified out of band."""
    from .hostkeys import trust

    [selected] = load_inventory(hosts).select(host)
    line = trust(selected, fingerprint)
    view.console.print(f"added to {selected.known_hosts}: {line}")


KERNELS = Path("kernels")
TASK_HELP = "a task folder name under kernels/"


@command(help={"host": "host name", "task": TASK_HELP, "hosts": HOSTS_HELP, "json": "print the sync report as JSON"})
def sync(c, host, task, hosts=None, json=False):
    """Sync kernels/TASK to the host's task workspace: only changed files travel; deletions follow."""
    from .runs import RunSession
    from .sync import sync_task

    [selected] = load_inventory(hosts).select(host)
    session = RunSession(selected)
    try:
        report = sync_task(session.agent, task, KERNELS)
    finally:
        session.close()
    if json:
        print_json(dataclasses.asdict(report))
    else:
        for warning in report.warnings:
            view.errors.print(f"warning: {warning}")
        view.console.print(f"{selected.name}: {task}: {report.files_sent} files sent ({report.bytes_sent} bytes), "
                           f"{report.deleted} deleted, {report.channels} channel(s)")


@command(
    help={"host": "host name or group (default: local)", "task": "task name, or several separated by commas",
          "hosts": HOSTS_HELP, "detach": "start the run and return its id", "gpu": "GPU index or UUID (still leased)",
          "wait": "wait for an idle GPU (optionally at most SECONDS) instead of failing",
          "workloads": "only these workload ids, comma-separated", "mode": "cold (L2 flushed per call) or graph",
          "device": "auto, cuda or cpu (cpu = smoke run through Triton's interpreter)",
          "json": "print the outcome as JSON"},
    optional=["wait"],
)
def run(c, task, host="local", hosts=None, detach=False, gpu=None, wait=None, workloads=None, mode=None,
        device="auto", json=False):
    """Sync, lease an idle GPU, build both sides, gate on correctness, time, summarize, fetch the summary."""
    from .launch import launch
    from .runs import RunOptions

    options = RunOptions(gpu=gpu, wait=_wait_seconds(wait), workloads=workloads, mode=mode, device=device)
    outcomes = launch(load_inventory(hosts).select(host), task.split(","), KERNELS, options,
                      detach=detach, as_json=json)
    refused = any(o.status == "not started" for o in outcomes)  # the host refused a start: as before, exit 2
    finish(all(o.ok for o in outcomes), code=EXIT_USAGE if refused else EXIT_FAILED)


def _wait_seconds(wait) -> Optional[float]:
    if wait in (None, False):
        return None
    if wait is True or wait == "":
        return 24 * 3600.0
    return float(wait)


@command(help={"host": "host name or group (default: every host)", "hosts": HOSTS_HELP, "json": "print JSON",
               "task": "only this task's runs"})
def status(c, host=None, hosts=None, json=False, task=None):
    """Runs on the hosts: id, task, GPU, status and phase, age, headline."""
    from . import gpustatus

    selected = load_inventory(hosts).select(host)
    answers = gpustatus.on_every_host(selected, lambda h, agent: _runs_or_error(h, agent, task))
    if json:
        print_json({"schema": "kpremote.status/1", "hosts": answers})
    else:
        view.console.print(view.runs_table(answers))
    finish(all(a["ok"] for a in answers))


def _runs_or_error(host, agent, task) -> dict:
    from .errors import KpremoteError

    try:
        from .slurm import agent_subcommand

        args = ["--task", task] if task else []
        runs = agent.call_json(agent_subcommand(host, "status"), *args).get("runs", [])
        return {"host": host.name, "ok": True, "runs": runs}
    except KpremoteError as exc:
        return {"host": host.name, "ok": False, "error": str(exc), "runs": []}


@command(help={"host": "host name", "run": "run id", "task": "the run's task (found from the run id if omitted)",
               "follow": "keep following until the run ends", "hosts": HOSTS_HELP})
def logs(c, host, run, task=None, follow=False, hosts=None):
    """The run's event stream, rendered; re-attachable at any time."""
    from .launch import show_logs

    [selected] = load_inventory(hosts).select(host)
    finish(show_logs(selected, run, task, follow))


@command(help={"host": "host name", "run": "run id", "task": "the run's task (found from the run id if omitted)",
               "hosts": HOSTS_HELP})
def cancel(c, host, run, task=None, hosts=None):
    """Cancel a run: its whole process group is killed and its GPU lease released."""
    from .runs import RunSession, cancel_run, find_task_of_run

    [selected] = load_inventory(hosts).select(host)
    session = RunSession(selected)
    try:
        answer = cancel_run(session, task or find_task_of_run(session, run), run)
    finally:
        session.close()
    state = answer.get("state", {})
    view.console.print(f"{selected.name}: run {run}: {state.get('status', '?')}"
                       + ("" if answer.get("cancelled") else " (it had already ended)"))


@command(help={"host": "host name", "task": TASK_HELP, "run": "a run id, latest (default) or all",
               "hosts": HOSTS_HELP, "json": "print what was fetched as JSON",
               "raw_file": "instead: fetch this one file of the run's raw/ (e.g. ncu/baseline-W.ncu-rep); its size "
                           "is shown first",
               "force": "with --raw-file: fetch even when the file is larger than the host's max_summary_mb"})
def fetch_results(c, host, task, run="latest", hosts=None, json=False, raw_file=None, force=False):
    """Bring back a run's summary/ (never raw/) into kernels/TASK/results/HOST/RUN-ID/; --raw-file NAME: one raw file."""
    from .fetch import fetch_results as fetch
    from .runs import RunSession

    [selected] = load_inventory(hosts).select(host)
    session = RunSession(selected)
    try:
        if raw_file:
            _fetch_raw_file(session, task, run, raw_file, force, json)
            return
        reports = fetch(session.agent, task, run, KERNELS, selected.name)
    finally:
        session.close()
    if json:
        print_json([dataclasses.asdict(r) for r in reports])
    else:
        for report in reports:
            view.console.print(f"{selected.name}: {task} run {report.run_id} ({report.run_status}): "
                               f"{report.outcome} → {report.path}")


def _fetch_raw_file(session, task, run, name, force, as_json) -> None:
    from .profiling import fetch_raw_file

    def announce(info: dict) -> None:
        if not as_json:
            view.console.print(f"{session.host.name}: raw/{info['name']}: {info['bytes']} bytes "
                               f"({info['bytes'] / 1048576:.2f} MiB), sha256 {info['sha256']}", markup=False)

    fetched = fetch_raw_file(session.agent, task, run, name, KERNELS, session.host.name, force=force, on_stat=announce)
    if as_json:
        print_json(dataclasses.asdict(fetched))
    else:
        view.console.print(f"{fetched.outcome} → {fetched.path}", markup=False)


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
def profile(c, task, workload, host="local", hosts=None, side="both", set="basic", kernel=None, warmup=3, calls=3,
            detach=False, wait=None, json=False):
    """Nsight Compute on the host: gate the workload, profile each side under ncu, bring back profile.md/.csv."""
    from .agent.ncu import ProfileRequest
    from .profiling import profile as run_profile
    from .profiling import show_profile

    selected = load_inventory(hosts).select(host)
    if len(selected) != 1:
        from .errors import KpremoteError

        raise KpremoteError(f"--host {host} names {len(selected)} hosts; a profile runs on one: name that host")
    if selected[0].is_cluster:  # issue 15 covers inv run; a profile job needs ncu on the node (docs/slurm.md)
        from .errors import KpremoteError

        raise KpremoteError(f"{host}: inv profile does not submit to a Slurm cluster yet; profile on a GPU host")
    request = ProfileRequest(side=side, section_set=set, kernel=kernel, warmup=int(warmup), calls=int(calls))
    outcome = run_profile(selected[0], task, workload, request, KERNELS, wait=_wait_seconds(wait), detach=detach,
                          quiet=json or detach)
    if json:
        print_json(outcome.model_dump())
    else:
        show_profile(outcome)
    finish(outcome.ok)


@command(help={"task": TASK_HELP, "workloads": "only these workload ids, comma-separated"})
def check(c, task, workloads=None):
    """Local CPU smoke run of a task through Triton's interpreter (timings are not meaningful)."""
    from .launch import smoke_check

    finish(smoke_check(KERNELS, task, workloads))


@command(help={"name": "the new task's folder name under kernels/"})
def new_task(c, name):
    """Scaffold kernels/NAME: a complete small Triton task that passes `inv check` at once."""
    from .scaffold import new_task as scaffold

    path = scaffold(name, KERNELS)
    view.console.print(f"created {path}; try: inv check --task {name}")


@command(help={"task": TASK_HELP, "repo": "the upstream repository: a URL git can fetch (or a local path)",
               "ref": "a branch, a tag or a 40-hex commit (default: main)",
               "files": "the upstream files to copy, comma-separated, relative to the repository root",
               "force": "replace an existing baseline/upstream/ and an already pinned [baseline] commit",
               "json": "print the pin as JSON"})
def baseline(c, task, repo, files, ref="main", force=False, json=False):
    """Pin the upstream baseline: resolve REF to a commit, copy FILES at it into baseline/upstream/, record where from."""
    from .baseline import pin_baseline, split_file_list
    from .sync import resolve_task_dir

    pin = pin_baseline(resolve_task_dir(KERNELS, task), repo, ref, split_file_list(files), force=force)
    if json:
        print_json(pin.model_dump())
        return
    view.console.print(f"{task}: {pin.repo} {pin.ref} → {pin.commit} ({len(pin.files)} file(s) in "
                       f"kernels/{task}/baseline/upstream/; docs/baseline_source.md and task.toml [baseline] updated)",
                       markup=False)


ns = Collection(hosts, gpu_status, trust_host, sync, run, status, logs, cancel, fetch_results, check, new_task,
                baseline, profile)
