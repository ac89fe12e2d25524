"""Slurm's client commands (argv lists, never a shell), and what they say: a job's state (squeue, else sacct), a
pending job's place in the queue, and per node its partitions, state, GPUs and kpremote's jobs (`slurm-nodes`).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any, Optional

from ..protocol import TERMINAL, AgentError

SCHEDULER = "slurm"
COMMAND_TIMEOUT_S = 60.0
# Slurm job states after which the job runs no more, and what each means for the run.
ENDED = {
    "COMPLETED": "the job ended",
    "FAILED": "the job's step failed",
    "CANCELLED": "the job was cancelled in Slurm (scancel)",
    "TIMEOUT": "the job reached its time limit",
    "PREEMPTED": "the job was preempted",
    "NODE_FAIL": "the job's node failed or was set down",
    "BOOT_FAIL": "the job's node failed to boot",
    "DEADLINE": "the job reached its deadline",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "REVOKED": "the job was revoked",
    "SPECIAL_EXIT": "the job ended with a special exit",
}
FORGOTTEN = "UNKNOWN"
ENDED[FORGOTTEN] = "Slurm no longer knows the job and has no accounting to ask"
KILLED_BY_SLURM = {"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}


class SlurmError(AgentError):
    kind = "slurm"


def slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """One Slurm client command (argv list, no shell); a missing command or a failure is one clear line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found on {socket.gethostname()}: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
        why = re.sub(r"^\w+: (?:error|fatal): ", "", why)
        raise SlurmError(f"{argv[0]} failed: {why}")
    return done


JOB_FORMAT = "%i|%T|%N|%S|%M|%l|%P|%r"  # id, state, nodes, start, elapsed, limit, partition, reason (may hold '|')

def jobs(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """What Slurm knows now of these jobs: squeue (any state, while slurmctld remembers them), else sacct."""
    if not job_ids:
        return {}
    # Our own jobs in every state, filtered here: `squeue -j` fails outright when one id is no longer known.
    done = slurm("squeue", "-h", "-t", "all", "--me", "-o", JOB_FORMAT)
    found = _job_records(done.stdout, job_ids)
    missing = [j for j in job_ids if j not in found]
    if missing:
        found.update(_from_accounting(missing))
    for job_id in job_ids:  # slurmctld forgot it (MinJobAge) and there is no accounting to ask
        found.setdefault(job_id, {"job_id": job_id, "state": FORGOTTEN, "reason": "no longer in squeue; no sacct"})
    return found


def _from_accounting(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """sacct, where accounting exists (a cluster without slurmdbd answers an error: then nothing is known)."""
    done = slurm("sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,NodeList,Start,Elapsed,"
                 "Timelimit,Partition,Reason", check=False)
    if done.returncode != 0:
        return {}
    return _job_records(done.stdout, job_ids, source="sacct")


def _job_records(lines: str, job_ids: list[str], **extra: str) -> dict[str, dict[str, Any]]:
    """squeue's JOB_FORMAT lines (sacct's -P columns are the same eight) as records, for the jobs asked about."""
    found = {}
    for line in lines.splitlines():
        parts = line.split("|", 7)
        if len(parts) == 8 and parts[0] in job_ids:
            job_id, state, nodes, start, elapsed, limit, partition, reason = parts
            found[job_id] = {"job_id": job_id, "state": state.split()[0], "node": nodes or None, "start": start,
                             "elapsed": elapsed, "time_limit": limit, "partition": partition,
                             "reason": None if reason in ("None", "") else reason, **extra}
    return found


def queue_position(job_id: str, partition: Optional[str]) -> tuple[Optional[int], int]:
    """(1-based place among the pending jobs of its partition, in Slurm's priority order; how many are pending)."""
    args = ["squeue", "-h", "-t", "PENDING", "--sort=-p,i", "-o", "%i"]
    if partition:
        args += ["-p", partition]
    pending = slurm(*args, check=False).stdout.split()
    return (pending.index(job_id) + 1 if job_id in pending else None), len(pending)


def node_reason(node: str) -> Optional[str]:
    """Why a node is down or drained, as its admin (or slurmd) said: `scontrol update ... reason=...`."""
    done = slurm("sinfo", "-h", "-N", "-n", node, "-o", "%E", check=False)
    reason = (done.stdout.strip().splitlines() or [""])[0].strip()
    return reason if reason and reason != "none" else None


def nodes(root: Path) -> dict[str, Any]:
    """Per node: partitions, state (and why), GPUs total / allocated, and kpremote's jobs on it."""
    info = json.loads(slurm("sinfo", "--json").stdout)
    queue = json.loads(slurm("squeue", "--json").stdout)
    ours = _our_jobs(root)
    on_node: dict[str, list[dict[str, Any]]] = {}
    for job in queue.get("jobs", []):
        if job.get("job_state") not in ("RUNNING", "COMPLETING", "PENDING"):
            continue
        record = {"job_id": str(job.get("job_id")), "name": job.get("name"), "user": job.get("user_name"),
                  "state": job.get("job_state"), "reason": job.get("state_reason"),
                  "gpus": _gpu_detail(job.get("gres_detail") or []), **ours.get(str(job.get("job_id")), {})}
        for node in _node_names(job.get("nodes") or "") if job.get("job_state") != "PENDING" else []:
            on_node.setdefault(node, []).append(record)
    pending = [str(j.get("job_id")) for j in queue.get("jobs", []) if j.get("job_state") == "PENDING"]
    result = []
    for node in info.get("nodes", []):
        name = node.get("name")
        result.append({"node": name, "hostname": node.get("hostname"), "partitions": node.get("partitions", []),
                       "state": node.get("state"), "state_flags": node.get("state_flags", []),
                       "reason": node.get("reason") or None, "gpus_total": _gpu_count(node.get("gres", "")),
                       "gpus_allocated": _gpu_count(node.get("gres_used", "")), "cpus": node.get("cpus"),
                       "cpus_allocated": node.get("alloc_cpus"), "jobs": on_node.get(name, [])})
    return {"hostname": socket.gethostname(), "source": SCHEDULER, "nodes": result,
            "pending_jobs": len(pending), "pending_ours": [ours[j] for j in pending if j in ours]}


def _our_jobs(root: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for state_file in Path(root, "tasks").glob("*/runs/*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if state.get("scheduler") == SCHEDULER and state.get("job_id") and state.get("status") not in TERMINAL:
            found[str(state["job_id"])] = {"run_id": state.get("run_id"), "task": state.get("task"),
                                          "status": state.get("status")}
    return found


def _gpu_count(gres: str) -> int:
    """GPUs in a gres string: "gpu:8", "gpu:h200:4(S:0-1)", "gpu:(null):2(IDX:0-1)", several comma-separated."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        match = re.match(r"gpu(?::[^:]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def _gpu_detail(details: list[str]) -> Optional[str]:
    return ", ".join(details) or None


def _node_names(expression: str) -> list[str]:
    """Slurm's node list ("vm", "gpu[01-03,07]") as names, through scontrol (it knows every form)."""
    if "[" not in expression:
        return [n for n in expression.split(",") if n]
    return slurm("scontrol", "show", "hostnames", expression).stdout.split()
