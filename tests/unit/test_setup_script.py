"""scripts/setup.sh says what it installs before each install: the first quick start is pip's minutes, and silence
there reads as a hang. Run for real against a stand-in .venv/bin/python that records what it is asked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAND_IN = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/asked"
case "$*" in "-c import torch"|"-c import triton") exit 1;; esac
exit 0
"""


def test_setup_says_what_it_installs_before_installing_it(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    assert [line.split(" into ")[0] for line in said] == [
        "setup: installing torch 2.13.0", "setup: installing triton", "setup: installing kpremote and its dependencies",
        "setup: done"]
    installs = [line for line in (python.parent / "asked").read_text().splitlines() if " install " in line]
    assert len(installs) == 3 and installs[0].endswith("torch==2.13.0")


def test_a_second_setup_does_not_reinstall_kpremote_unless_pyproject_changed(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)

    def editable_installs() -> int:
        done = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        asked = (python.parent / "asked").read_text().splitlines()
        (python.parent / "asked").unlink()
        return sum(1 for line in asked if line.endswith("-e .[dev]"))

    assert editable_installs() == 1
    assert editable_installs() == 0  # the quick start's second setup: nothing of kpremote to do
    with open(tmp_path / "pyproject.toml", "a") as pyproject:
        pyproject.write("\n# a dependency changed\n")
    assert editable_installs() == 1
