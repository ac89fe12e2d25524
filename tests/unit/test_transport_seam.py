"""The transport package stands on its own, and a Command's values reach the process that runs it."""

from __future__ import annotations

import ast
import time
from pathlib import Path

from kpremote.transport import ChannelCounter, Command, Completed, ContainerTransport, LocalTransport, Transport

TRANSPORT_DIR = Path(__file__).resolve().parents[2] / "kpremote" / "transport"


def kpremote_imports(source: str, module: str) -> set[str]:
    """The kpremote modules that `source` (the text of module `module`) imports, relative imports resolved."""
    package = module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.update([target] if node.module else [f"{target}.{alias.name}" for alias in node.names])
    return {name for name in found if name == "kpremote" or name.startswith("kpremote.")}


SHARED = {"kpremote.agent.filelock"}
"""The one module outside the package it may import: a standard-library helper both halves share (one flock)."""


def outside_the_transport(names: set[str]) -> set[str]:
    return {name for name in names
            if name != "kpremote.transport" and not name.startswith("kpremote.transport.") and name not in SHARED}


def test_the_import_walk_sees_relative_and_absolute_imports_of_the_client():
    source = ("from ..config import Host\nfrom .base import Command\nimport kpremote.errors\nfrom . import streams\n"
              "from ..agent.filelock import held\nfrom ..agent.protocol import ExitCode\n")
    names = kpremote_imports(source, "kpremote.transport.example")
    assert outside_the_transport(names) == {"kpremote.config", "kpremote.errors", "kpremote.agent.protocol"}


def test_the_transport_package_imports_nothing_of_kpremote_outside_itself():
    files = sorted(TRANSPORT_DIR.glob("*.py"))
    assert {path.name for path in files} >= {"__init__.py", "base.py", "local.py", "ssh.py", "container.py"}
    for path in files:
        names = kpremote_imports(path.read_text(), f"kpremote.transport.{path.stem}")
        assert not outside_the_transport(names), f"{path.name} imports {sorted(outside_the_transport(names))}"


def test_a_command_carries_stdin_stdout_and_stderr_through_the_local_transport():
    chunks: list[bytes] = []
    argv = ["sh", "-c", "cat; echo to-stderr >&2; exit 3"]
    result = LocalTransport().send(Command(argv, stdin=b"payload", on_stdout=chunks.append))
    assert (result.argv, result.exit_code, result.stderr) == (argv, 3, b"to-stderr\n")
    assert b"".join(chunks) == b"payload" and result.stdout == b""  # stdout went to on_stdout only


def test_a_command_s_timeout_stops_it_on_the_local_transport():
    started = time.monotonic()
    result = LocalTransport().send(Command(["yes"], timeout=0.3, on_stdout=ignore))
    assert not result.ok and time.monotonic() - started < 5


def test_a_silent_command_is_held_to_its_timeout_too_with_what_it_started():
    # `yes` prints without end, so a timeout checked only between chunks stopped it; `sleep` prints nothing
    result = LocalTransport().send(Command(["sh", "-c", "sleep 30 & sleep 30; echo finished"], timeout=0.3,
                                           on_stdout=ignore))
    assert not result.ok and result.exit_code == -9, result  # killed, not run to its end (exit 0)


def ignore(chunk: bytes) -> None:
    """An on_stdout that drops what it gets."""


class Recording(Transport):
    """A transport that answers every command with exit 0 and keeps what it was sent."""

    def __init__(self) -> None:
        self.host = "recording"
        self.channels = ChannelCounter()
        self.sent: list[Command] = []

    def send(self, command: Command) -> Completed:
        self.sent.append(command)
        return Completed(list(command.argv), 0, b"", b"")


def test_run_builds_one_command_from_its_options():
    transport = Recording()
    transport.run(("echo", "hi"), stdin=b"in", timeout=4.0, on_stdout=ignore, idle_timeout=2.0)
    assert transport.sent == [Command(["echo", "hi"], stdin=b"in", timeout=4.0, on_stdout=ignore, idle_timeout=2.0)]


def test_a_container_wraps_only_the_words_and_stdin_of_a_command():
    inner = Recording()
    result = ContainerTransport(inner, "box").send(
        Command(["echo", "a b"], stdin=b"rest", timeout=4.0, on_stdout=ignore, idle_timeout=2.0)
    )
    (sent,) = inner.sent
    assert sent.argv == ["docker", "exec", "-i", "box", "bash", "-s"]
    assert (sent.timeout, sent.on_stdout, sent.idle_timeout) == (4.0, ignore, 2.0)
    script = b"".join(iter(sent.stdin, None))
    assert script == b"exec echo 'a b'\nrest"
    assert result.argv == ["echo", "a b"]  # the caller's words, not the wrapper's
