"""benchmarks/gpu/block_e2e.py's input checks (no sglang, no GPU): a missing or wrong wheel or site folder is one line
naming it and exit 2, no traceback, before anything is imported or unzipped."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rig import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "block_e2e.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", ["no_wheel", "no_site", "not_a_zip", "folder_without_sglang"])
def test_bad_wheel_or_site_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    wheel = tmp_path / "sglang.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/__init__.py", "")
    expected = {"no_wheel": "no such file or folder", "no_site": "no such folder",
                "not_a_zip": "not a wheel", "folder_without_sglang": "holds no sglang/multimodal_gen"}[case]
    if case == "no_wheel":
        wheel = tmp_path / "missing.whl"
    elif case == "no_site":
        site = tmp_path / "missing-site"
    elif case == "not_a_zip":
        wheel.write_text("not a zip")
    else:
        wheel = tmp_path
    done = _run("--wheel", str(wheel), "--site", str(site), "--out", str(tmp_path / "out"), "--device", "cpu")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("block_e2e: ") and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_the_device_script_without_the_staged_wheels_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "benchmarks" / "gpu").mkdir(parents=True)
    script = tmp_path / "benchmarks" / "gpu" / "block_e2e.sh"
    script.write_text((REPO / "benchmarks" / "gpu" / "block_e2e.sh").read_text())
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [lines[0]] and ".gpustage/e2e missing" in lines[0] and "pack" in lines[0], done.stderr
    assert done.stdout == ""
