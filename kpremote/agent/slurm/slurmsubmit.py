"""`slurm-submit` on the login node: create the run, write its batch script, `sbatch` it; state.json holds the
job id before the answer goes back. The host's Slurm settings become sbatch words only through an allow-list.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

from ..lease import utc_now_iso
from ..run.events import EventLog
from ..protocol import BadRequest, RunExit
from ..run.runpaths import claim_run, task_dir
from ..run.runstate import update_state
from .slurmjobs import SCHEDULER, SlurmError, slurm
from .. import AGENT_HOME
from ..sync import snapshot_of, snapshot_workspace

SBATCH_ALLOWED = ("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu", "gpus", "gpus-per-node",
                  "gpu-bind", "nodelist", "exclude", "reservation", "nice", "comment", "wckey", "licenses",
                  "tmp", "hint", "exclusive", "mail-type", "mail-user", "clusters", "begin", "deadline",
                  "priority", "distribution", "ntasks", "nodes")  # the client's config.py holds the same list
SETTING_FLAGS = {"partition": "--partition", "account": "--account", "qos": "--qos", "gres": "--gres",
                 "time_limit": "--time", "constraint": "--constraint"}
JOB_SHAPE = ("--no-requeue", "--nodes=1", "--ntasks=1")  # every run's job, and what `slurm-check` asks Slurm about
SETTING_VALUE = re.compile(r"[A-Za-z0-9_.,:&|*()\[\]!+-]+")


def submit(root: Path, request: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Create the run, write its batch script, sbatch it; the job id goes into state.json before we answer."""
    sbatch_settings = sbatch_options(settings)  # refused before anything is written or submitted
    workspace = task_dir(root, request["task"]) / "workspace"
    if not workspace.is_dir():
        raise BadRequest(f"task {request['task']} has no workspace on this host ({workspace}); sync it first")
    # The client's run id (it may cancel the run before it hears back): a cancel that came first refuses it here.
    run_id, run_dir = claim_run(workspace.parent / "runs", request.get("run_id"), task=request["task"],
                                status="pending", phase="queued", scheduler=SCHEDULER)
    (run_dir / "raw").mkdir()
    (run_dir / "summary").mkdir()
    snapshot_workspace(workspace, snapshot_of(run_dir, request["task"]))  # the job runs what was submitted
    script = run_dir / "raw" / "job.sh"
    script.write_text(batch_script(root, request["task"], run_id))
    now = utc_now_iso()  # `started` is the submit time until the job's step starts the run
    update_state(run_dir, run_id=run_id, task=request["task"], status="pending", phase="queued",
                 scheduler=SCHEDULER, job_id=None, submitted=now, started=now, host_alias=request.get("host_alias"),
                 device=request.get("device"), workloads=request.get("workloads"), mode=request.get("mode"),
                 request=request, settings=settings)
    argv = ["sbatch", "--parsable", f"--job-name=kp-{request['task']}"[:120], f"--output={run_dir / 'raw' / 'slurm-%j.out'}",
            f"--chdir={run_dir}", *JOB_SHAPE, *sbatch_settings, str(script)]
    try:
        done = slurm(*argv)
    except SlurmError as exc:
        _record_not_submitted(run_dir, f"not submitted: {exc}")
        raise SlurmError(f"{exc} (recorded as run {run_id}: error)") from None
    job_id = done.stdout.strip().split(";")[0]
    state = update_state(run_dir, job_id=job_id, slurm={"job_id": job_id, "state": "PENDING"})
    return {"run_id": run_id, "run_dir": str(run_dir), "job_id": job_id, "gpu": None, "state": state}


def _record_not_submitted(run_dir: Path, message: str) -> None:
    """Slurm refused the job: the run ends error with Slurm's line, in its state and its events (status, logs)."""
    log = EventLog(run_dir / "raw" / "events.jsonl")
    try:
        log.emit("done", status="error", exit_code=int(RunExit.REFUSED), message=message)
    finally:
        log.close()
    update_state(run_dir, status="error", phase="done", exit_code=int(RunExit.REFUSED), message=message,
                 finished=utc_now_iso())


def sbatch_options(settings: dict[str, Any]) -> list[str]:
    """The host's Slurm settings as sbatch words: each checked again here, whatever the client sent."""
    words = []
    for key, flag in SETTING_FLAGS.items():
        value = settings.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not SETTING_VALUE.fullmatch(value):
            raise BadRequest(f"bad Slurm setting {key} = {value!r}")
        words.append(f"{flag}={value}")
    for arg in settings.get("sbatch_args") or []:
        key = arg[2:].split("=", 1)[0] if isinstance(arg, str) and arg.startswith("--") and "=" in arg else None
        if key not in SBATCH_ALLOWED or any(ord(ch) < 32 for ch in arg):
            raise BadRequest(f"sbatch argument {arg!r} is not allowed (allowed: --KEY=VALUE with KEY one of "
                             f"{', '.join(SBATCH_ALLOWED)})")
        words.append(arg)
    unknown = set(settings) - set(SETTING_FLAGS) - {"sbatch_args"}
    if unknown:
        raise BadRequest(f"unknown Slurm settings: {', '.join(sorted(unknown))}")
    return words


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """What a run on this login node needs from Slurm, asked of Slurm (`inv hosts --check`): sinfo answers, the
    partitions exist, and sbatch would take a job with these settings (`--test-only`: Slurm checks partition, account,
    qos, gres and time limit as for a real submit, and queues nothing). {"ok", "checks": [{"check", "ok", "detail"}]}"""
    checks: list[dict[str, Any]] = []

    def check(name: str, ask: Any) -> bool:
        try:
            detail, ok = ask(), True
        except SlurmError as exc:
            detail, ok = str(exc), False
        checks.append({"check": name, "ok": ok, "detail": detail})
        return ok

    words = sbatch_options(settings)
    if check("sinfo", _partitions_known) and settings.get("partition"):
        check("partition", lambda: _partitions_exist(settings["partition"]))
    if all(c["ok"] for c in checks):
        check("sbatch", lambda: _sbatch_would_take(words))
    return {"ok": all(c["ok"] for c in checks), "checks": checks}


def _partitions_known() -> str:
    names = sorted(set(slurm("sinfo", "-h", "-o", "%R").stdout.split()))
    return f"partitions: {', '.join(names) or 'none'}"


def _partitions_exist(wanted: str) -> str:
    known = set(slurm("sinfo", "-h", "-o", "%R").stdout.split())
    missing = [name for name in wanted.split(",") if name not in known]
    if missing:
        raise SlurmError(f"partition {', '.join(missing)} is not one of this cluster's ({', '.join(sorted(known))})")
    return f"partition {wanted} exists"


def _sbatch_would_take(words: list[str]) -> str:
    done = slurm("sbatch", "--test-only", *JOB_SHAPE, *words, "--wrap=true")
    said = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return "sbatch --test-only: " + re.sub(r"^sbatch: ", "", said[-1] if said else "accepted")


def batch_script(root: Path, task: str, run_id: str) -> str:
    """The job's script: one step, this very agent copy on the shared filesystem; every word quoted."""
    argv = [sys.executable, "-m", "kpremote.agent", "slurm-step", "--task", task, "--run", run_id, "--root", str(root)]
    return ("#!/bin/bash\n"
            f"# kpremote run {run_id} of task {task}: written by kpremote.agent.slurm\n"
            f"export PYTHONPATH={shlex.quote(str(AGENT_HOME))}\n"
            f"exec {' '.join(shlex.quote(word) for word in argv)}\n")
