"""Slurm on the agent's side: a run as a batch job, its step on the compute node, its state read from Slurm.

On the login node (remote_root on the shared filesystem):
    slurm-submit   apply the sync, create the run, write its batch script, `sbatch` it; state.json holds the job id
    slurm-follow   the run's events as `follow` sends them, plus "queued" phases (Slurm's reason, queue position)
    slurm-status   the runs, each reconciled with Slurm
    slurm-cancel   `scancel`, then wait until the run has recorded it
    slurm-nodes    per node: partitions, state, GPUs total / allocated, kpremote's jobs on it (gpu-status)
    slurm-check    what a run needs of Slurm: sinfo answers, the partition exists, sbatch takes the settings
On the compute node, inside the job:
    slurm-step     lease one of the GPUs Slurm allocated (never another), run the runner, wait for it

This module is the slurm-* command line; the work is in slurmsubmit.py (login node), slurmstep.py (compute node),
slurmruns.py (follow, status, cancel), slurmsettle.py (state.json reconciled with Slurm) and slurmjobs.py (Slurm's
commands and what they say). Each handler imports its module when it runs, so building the agent's command line
costs no import beyond this file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..protocol import BadRequest, ExitCode


def add_commands(command: Callable[..., Any]) -> None:
    """Register slurm-* on the agent's command line (kpremote/agent/__main__.py calls this)."""
    p = command("slurm-submit", _submit, "apply the sync, then submit the run as a Slurm batch job")
    p.add_argument("--task", required=True)
    p.add_argument("--request", required=True, help="JSON: device, workloads, mode, host_alias, arch, idle")
    p.add_argument("--settings", required=True, help="JSON: partition, account, qos, gres, time_limit, ...")
    p.add_argument("--sync", action="store_true", help="apply a sync stream from stdin first")
    p = command("slurm-step", _step, "inside the job: lease an allocated GPU and run the runner")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p = command("slurm-follow", _follow, "a cluster run's events, with its place in Slurm's queue while pending")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--from", dest="offset", type=int, default=0)
    p.add_argument("--once", action="store_true")
    p.add_argument("--with-summary", action="store_true")
    p = command("slurm-status", _status, "cluster runs, reconciled with squeue / sacct")
    p.add_argument("--task", default=None)
    p = command("slurm-cancel", _cancel, "scancel a run's job and record it cancelled")
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--pending", action="store_true",
                   help="if the run is not submitted yet, make sure its submit never submits it")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds to wait for the job's runner to record the cancel (Slurm's KillWait still applies)")
    command("slurm-nodes", _nodes, "per node: partitions, state, GPUs total / allocated, kpremote's jobs")
    p = command("slurm-check", _check, "sinfo answers, the partition exists, sbatch --test-only takes the settings")
    p.add_argument("--settings", required=True, help="JSON: partition, account, qos, gres, time_limit, ...")


def _root(args: Any) -> Path:
    return Path(os.path.expanduser(args.root))


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


def _json_arg(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise BadRequest(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


def _submit(args: Any) -> int:
    from ..run.runpaths import validate_task_name
    from ..sync import sync_answer
    from .slurmsubmit import sbatch_options, submit

    request = {**_json_arg(args.request, "--request"), "task": validate_task_name(args.task)}
    settings = _json_arg(args.settings, "--settings")
    sbatch_options(settings)  # a bad setting is refused before the sync touches anything
    synced = sync_answer(_root(args), args.task, sys.stdin.buffer) if args.sync else None
    if synced is not None and "error" in synced:
        _print(synced)
        return int(synced.get("exit_code", 1))
    if synced is not None and synced.get("need_full"):
        _print(synced)
        return ExitCode.NEED_FULL_SYNC
    result = submit(_root(args), request, settings)
    _print({**result, "sync": synced} if synced is not None else result)
    return 0


def _step(args: Any) -> int:
    from .slurmstep import step

    return step(_root(args), args.task, args.run)


def _follow(args: Any) -> int:
    from .slurmruns import follow

    return follow(_root(args), args.task, args.run, args.offset, once=args.once, with_summary=args.with_summary)


def _status(args: Any) -> int:
    from .slurmruns import status

    _print(status(_root(args), args.task))
    return 0


def _cancel(args: Any) -> int:
    from .slurmruns import cancel

    wait = {} if args.grace is None else {"wait_s": max(0.0, args.grace)}
    _print(cancel(_root(args), args.task, args.run, pending=args.pending, **wait))
    return 0


def _nodes(args: Any) -> int:
    from .slurmjobs import nodes

    _print(nodes(_root(args)))
    return 0


def _check(args: Any) -> int:
    from .slurmsubmit import check_settings

    _print(check_settings(_json_arg(args.settings, "--settings")))
    return 0
