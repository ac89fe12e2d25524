"""A kpremote project in a temporary folder for the view, JSON and CLI tests: hosts.toml with the `local` host (this
machine, no SSH, its GPUs from the NVML fixture) and `gone` (nothing listens there), and one scaffolded task.

The commands run as a user runs them: the real `inv` (or `kpremote`) command line in a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

from rig import REPO, busy_gpu, idle_gpu

TASK = "demo"


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "nvml.json").write_text(json.dumps({"driver": "580.1", "hostname": "box",
                                                "gpus": [idle_gpu(0), busy_gpu(1)]}))
    (root / "hosts.toml").write_text(
        "[defaults]\n"
        f'remote_root = "{root / "remote"}"\n'
        "connect_timeout = 3\n"
        "[hosts.local]\n"
        'transport = "local"\n'
        "[hosts.gone]\n"
        'ssh = "nobody@127.0.0.1:9"\n'
    )
    result = kp(root, "new-task", TASK)
    assert result.returncode == 0, result.stderr
    return root


def kp(project: Path, *args: str, columns: int = 100, env: Optional[dict[str, str]] = None,
       cwd: Optional[Path] = None, program: str = "inv", timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `inv ARGS` (or the `kpremote` program) in the project, as a user would, at a given terminal width."""
    full_env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONPATH": str(REPO),
                "KPREMOTE_NVML_FIXTURE": str(project / "nvml.json"), **(env or {})}
    full_env.pop("KPREMOTE_HOSTS", None)
    if program == "inv":
        argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args]
    else:
        argv = [sys.executable, "-m", "kpremote.program", *args]
    return subprocess.run(argv, cwd=cwd or project, env=full_env, capture_output=True, text=True, timeout=timeout)


def watch_for(project: Path, until: Callable[[str], bool], *args: str, columns: int = 100,
              limit_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run `inv ARGS` (a --watch) until what it has printed satisfies until(stdout), then press Ctrl-C: what it
    printed, and how it ended. Ctrl-C comes after limit_s seconds all the same (the test's asserts then say what
    was missing); a loaded machine only makes the wait longer, never the refreshes fewer."""
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONPATH": str(REPO),
           "KPREMOTE_NVML_FIXTURE": str(project / "nvml.json")}
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args]
    process = subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    enough = threading.Event()

    def read_out() -> None:
        for line in process.stdout:
            out.append(line)
            if until("".join(out)):
                enough.set()
        enough.set()  # it ended by itself

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.extend(process.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        enough.wait(limit_s)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reader in readers:
            reader.join(timeout=30)
    return subprocess.CompletedProcess(argv, process.returncode, "".join(out), "".join(err))
