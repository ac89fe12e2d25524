"""The audit's processes (audit.py): ncu with the audited calls under it, held to its limit (run_logged); where a
side's audited calls find their cases and leave their results (call_files); auditcases.py's make and check, each a
process of its own (run_cases); the environment the audited process runs in (target_env) and the built modules it
calls (built_modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import AGENT_HOME, sandbox
from . import ncu
from ..procfs import kill_tree


def run_logged(command: list[str], log_path: Path, env: dict[str, str], cwd: Path, limit_s: float,
               stdin: Path | None = None) -> int:
    """command (ncu, with the audited process under it) with its output in log_path and stdin from a file, held to
    limit_s; the process tree killed when it runs over or the run is cancelled."""
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


def target_env(env: dict[str, str] | None) -> dict[str, str]:
    """The caller's worker environment, with this agent importable in the audited process."""
    env = dict(os.environ if env is None else env)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    if str(AGENT_HOME) not in paths:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AGENT_HOME), *paths]))
    return env


def built_modules(run_dir: Path) -> dict[str, str | None]:
    """The built extensions of a CUDA task, as the prepare step recorded them (none for Triton)."""
    try:
        sides = json.loads((run_dir / "raw" / "prepare.json").read_text())["build"]["sides"]
        return {side: (record or {}).get("module") for side, record in sides.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
