"""An agent answered inside this process: for fast tests of what the client does with the agent's answers.

`python -c BOOT ROOT HASH SUBCOMMAND ARGS...` becomes a call of `kpremote.agent.__main__.main([SUBCOMMAND, *ARGS,
"--root", ROOT])` with stdin, stdout and stderr captured, the way httpx's MockTransport answers a request without a
network. The agent code is this checkout's; what it writes lands under ROOT as on a host, and a run that `start`
spawns is a real detached process. Unlike a host: calls run one at a time (sys.stdin and sys.stdout belong to the
whole process), timeouts are not enforced, and on_stdout gets the output when the call has ended. BOOT's one job of
its own, answering AGENT_MISSING until the agent is shipped, is kept (shipped=False), so shipping can be tested.
It is a transport, but it lives beside agentclient.py rather than in transport/: it knows the BOOT call and runs
the agent itself, while the transport package knows nothing of either.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import traceback
from typing import Callable, Sequence

from ..agent.protocol import ExitCode
from ..transport.base import ChannelCounter, Command, Completed, Transport
from ..transport.streams import Output, stdin_chunks

_ONE_AT_A_TIME = threading.Lock()


class InProcessTransport(Transport):
    def __init__(self, host: str = "inprocess", *, shipped: bool = True) -> None:
        self.host = host
        self.channels = ChannelCounter()
        self.shipped = shipped
        self.calls: list[list[str]] = []
        """The agent argv of every call (SUBCOMMAND ARGS..., without BOOT), for tests to look at."""

    def send(self, command: Command) -> Completed:
        self.channels.note(command.argv)
        root, words = _boot_arguments(command.argv)
        self.calls.append(words)
        data = b"".join(stdin_chunks(command.stdin))
        if words[0] == "ship":
            self.shipped = True
            code, out, err = ExitCode.OK, b'{"ok": true}\n', b""
        elif not self.shipped:
            code, out, err = ExitCode.AGENT_MISSING, b"", f"kpremote: agent is not shipped to {root}\n".encode()
        else:
            code, out, err = call_agent([*words, "--root", root], data, root)
        output = Output(command)
        if out:
            output.stdout(out)
        output.stderr(err)
        return output.completed(int(code))


def _boot_arguments(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(ROOT, [SUBCOMMAND, ARGS...]) of `PYTHON -c BOOT ROOT HASH SUBCOMMAND ARGS...`."""
    if len(argv) < 6 or argv[1] != "-c":
        raise ValueError(f"not an agent call (PYTHON -c BOOT ROOT HASH SUBCOMMAND ...): {list(argv)[:2]}")
    return os.path.expanduser(argv[3]), list(argv[5:])


def call_agent(argv: list[str], stdin: bytes, root: str) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of the agent's main(argv), as BOOT would run it in a process of its own."""
    from ..agent.__main__ import main

    stdout, stderr = io.BytesIO(), io.BytesIO()
    with _ONE_AT_A_TIME:
        saved = sys.stdin, sys.stdout, sys.stderr, os.environ.get("KPREMOTE_ROOT")
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(stderr, encoding="utf-8", write_through=True)
        os.environ["KPREMOTE_ROOT"] = root
        try:
            code = _exit_code(main, argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            stdout_bytes, stderr_bytes = stdout.getvalue(), stderr.getvalue()
            sys.stdin, sys.stdout, sys.stderr = saved[:3]
            _restore_env("KPREMOTE_ROOT", saved[3])
    return code, stdout_bytes, stderr_bytes


def _exit_code(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return int(main(argv) or 0)
    except SystemExit as exc:  # argparse of a delegated subcommand, or sys.exit inside the agent
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return ExitCode.ERROR
    except Exception:  # noqa: BLE001 - a crash reads as in a process: a traceback on stderr, exit 1
        sys.stderr.write(traceback.format_exc())
        return ExitCode.ERROR


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
