"""Ctrl-C ends a command with 130 wherever the press lands, even inside an exec() of a string.

CPython marks a KeyboardInterrupt that passes out of `exec(<str>)` as unhandled (pythonrun's run_eval_code_obj), and
under `python -m` (how `inv` is often run, and how the suite runs it) ends the process by SIGINT at its own exit,
though the command caught the interrupt and asked for 130. Dataclasses and namedtuples make their methods that way,
so a press during a lazy import (`inv run` imports placement, remote, sync ... at its first step) ended -2: the
suite saw it once in ~20 loaded runs of tests/test_interrupts.py. The wrapper now leaves with os._exit(130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

TASKS = """
import sys
from kpremote.cli.commandline import command

@command()
def busy(c):
    sys.stderr.write("ready\\n")
    sys.stderr.flush()
    # what a dataclass does while it is made: its methods are exec()'d from a string
    exec("import time\\nt = time.monotonic()\\nwhile time.monotonic() - t < 30: pass\\n")
"""


def test_a_press_inside_an_exec_of_a_string_still_exits_130(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(textwrap.dedent(TASKS))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    client = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(tmp_path), "busy"], cwd=tmp_path,
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stderr.readline() == "ready\n"
        time.sleep(0.2)  # inside the exec's loop
        client.send_signal(signal.SIGINT)
        code = client.wait(timeout=20)
    finally:
        client.kill()
    err = client.stderr.read()
    assert code == 130, f"exit {code}: {err}"
    assert err == "error: interrupted\n", err
