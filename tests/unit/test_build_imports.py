"""Validating a task and naming its builders stays light: the task validator (taskspec, taskfiles, buildrules) and
the builders package import no torch, tvm_ffi or cutlass, which each builder imports only when it builds a side.
The client validates a task before anything connects, and the runner imports build.py for paths and names only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
HEAVY = ("torch", "tvm_ffi", "cutlass", "triton")
LOAD_AND_NAME_BUILDERS = f"""
import sys
from pathlib import Path
from kpremote.agent.task import build, builders, buildrules
from kpremote.agent.task.taskspec import load_task

spec = load_task(Path({str(TASK)!r}), packages=False)
print([builders.builder_for(spec.build, side).kind for side in ("baseline", "candidate")])
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""


def test_a_task_is_validated_and_its_builders_named_without_importing_torch():
    done = subprocess.run([sys.executable, "-c", LOAD_AND_NAME_BUILDERS], cwd=REPO, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    kinds, heavy = done.stdout.splitlines()
    assert kinds == "['triton', 'triton']"
    assert heavy == "[]"
