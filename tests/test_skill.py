"""The shipped agent skill (kpremote/skill/SKILL.md) used the way an agent uses it: every command its ```bash blocks
show is run as written, against the `local` host of a test project (a CPU smoke run, fixture GPUs, the stand-in ncu),
so the skill cannot drift from the code. Each must exit 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from localproject import make_project
from rig import REPO

from kpremote.agent.provenance import task_provenance
from kpremote.results.ledger import read_ledger
from kpremote.skill import skill_text

STAND_IN_NCU = REPO / "tests" / "fixtures" / "ncu"
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def skill_commands(text: str) -> list[str]:
    """Every command line of the skill's ```bash blocks, in order (comments stay: bash reads them as comments)."""
    return [line for block in BASH_BLOCK.findall(text) for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def agent_shell(project: Path) -> dict[str, str]:
    """What an agent's shell would have: the project's tools on PATH, its own HOME, and the test's two stand-ins
    (NVML's answers, and ncu first on PATH)."""
    bin_dir = project / "bin"
    bin_dir.mkdir()
    script = (STAND_IN_NCU / "ncu").read_text().replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1)
    (bin_dir / "ncu").write_text(script)
    (bin_dir / "ncu").chmod(0o755)
    shutil.copy(STAND_IN_NCU / "raw.csv", bin_dir / "raw.csv")
    (bin_dir / "ncu.mode").write_text("ok\n")
    (project / "tasks.py").write_text("from kpremote.commands import ns  # noqa: F401\n")  # what `inv` loads
    return {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "HOME": str(project / "home"), "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "100",
            "KPREMOTE_NVML_FIXTURE": str(project / "nvml.json"), "KPREMOTE_CACHE": str(project / ".cache")}


def test_every_command_the_skill_shows_runs_as_written(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    shutil.rmtree(project / "kernels" / "demo")  # a newcomer's project: the skill's own commands make its task
    env = agent_shell(project)
    commands = skill_commands(skill_text())
    exports = [c for c in commands if c.startswith("export ")]
    assert exports, "the skill sets HOST, TASK and WORKLOAD before its commands"
    shown = [c for c in commands if not c.startswith("export ")]
    assert {"inv new-task", "inv check", "inv run", "inv profile", "inv compare", "inv logs",
            "kpremote skill install"} <= \
        {" ".join(c.split()[:2]) if not c.startswith("kpremote") else " ".join(c.split()[:3]) for c in shown}
    for command in shown:
        done = subprocess.run(["bash", "-c", "\n".join([*exports, command])], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (project / "home" / ".claude" / "skills" / "kpremote" / "SKILL.md").read_text() == skill_text()
    # The ledger the skill points to: one line per check and per run fetched (by `inv run`, `inv profile` or `fetch-results`).
    ledger = read_ledger(project / "kernels" / "demo")
    fetched = sorted(p.name for p in (project / "kernels" / "demo" / "results" / "local").iterdir())
    checked = sorted(p.name for p in (project / "kernels" / "demo" / "results" / "check").iterdir())
    assert sorted(e["run_id"] for e in ledger if e["host"] == "local") == fetched and len(fetched) >= 3
    assert sorted(e["run_id"] for e in ledger if e["host"] == "check") == checked and len(checked) == 1
    assert {e["kind"] for e in ledger} == {"check", "run", "profile"}
    solution = task_provenance(project / "kernels" / "demo")["solution_sha256"]
    for entry in ledger:
        assert entry["candidate_sha256"] == solution and entry["exit_code"] == 0 and entry["harness"]
        assert entry["rows"]["prod_r8_c256"]["status"] == "PASSED" and entry["headline"]["n"] == 1
        assert re.search(r"\binv (check|run|profile|fetch-results) .*--task demo", entry["command"]), entry["command"]
    assert "ledger.jsonl" in (REPO / ".gitignore").read_text()
