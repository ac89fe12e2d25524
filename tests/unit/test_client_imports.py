"""The client reaches into the agent only through the seam: protocol.py, the BOOT stub and the stdlib-only helpers
meant for both sides (CONTRIBUTING.md). Read from the source (AST), so an import inside a function counts too.
(No import circle anywhere: test_import_cycles.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kpremote

PACKAGE = Path(kpremote.__file__).parent
SEAM = {f"kpremote.agent.{name}" for name in ("protocol", "results", "record", "boot", "provenance", "atomicfile", "filelock",
                                              "run.events")}  # run/events.py: the event record, made by its writer
ALLOWED_ELSEWHERE = {
    # The task folder is refused on the client by the host's own validator, so nothing the host would refuse is
    # sent (docs/architecture.md): one rule, not a client copy of the task contract.
    ("cli/options.py", "kpremote.agent.task.taskspec"),
    # An earlier measurement stands for a new one only with the same harness version and pinned bench/ and task.toml,
    # computed by the runner's own rule (harness.py: standard library only, meant for the client too).
    ("results/ledger.py", "kpremote.agent.harness"),
}
NOT_CLIENT_FOLDERS = {
    "agent",
    "templates",  # a new task's files: task code, which runs on the host beside the agent
}
NOT_CLIENT = {
    # The in-process transport *is* an agent, answered in the test process: it runs agent/__main__.py by design.
    "hosts/inprocessagent.py",
}


def client_files() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] not in NOT_CLIENT_FOLDERS
            and path.relative_to(PACKAGE).as_posix() not in NOT_CLIENT]


def module_of(path: Path) -> str:
    return ".".join(("kpremote", *path.relative_to(PACKAGE).with_suffix("").parts))


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every kpremote module path imports, by its full name (`from .agent import protocol` names
    kpremote.agent.protocol)."""
    package = module_of(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_of(path)
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            source = f"{base}.{node.module}" if node.level and node.module else (node.module if not node.level
                                                                                else base)
            modules.add(source)
            modules.update(f"{source}.{alias.name}" for alias in node.names)
    return {m for m in modules if m.startswith("kpremote.")}


def agent_imports_outside_the_seam(path: Path, source: str | None = None) -> set[str]:
    rel = path.relative_to(PACKAGE).as_posix()
    agent_modules = {m for m in imported_modules(path, source) if m.startswith("kpremote.agent.")}
    # `from .agent.protocol import X` also yields kpremote.agent.protocol.X: only real modules count
    real = {m for m in agent_modules if (PACKAGE / Path(*m.split(".")[1:])).with_suffix(".py").is_file()}
    return {m for m in real if m not in SEAM and (rel, m) not in ALLOWED_ELSEWHERE}


def test_the_client_imports_only_the_seam_from_the_agent():
    outside = {path.relative_to(PACKAGE).as_posix(): sorted(agent_imports_outside_the_seam(path))
               for path in client_files()}
    assert {rel: modules for rel, modules in outside.items() if modules} == {}


@pytest.mark.parametrize("source", ["def f():\n    from .agent import lease, protocol\n",
                                    "from .agent.lease import IdlePolicy\n", "import kpremote.agent.lease\n",
                                    "from ..agent import lease\n"])
def test_the_walk_finds_an_agent_import_however_it_is_written(source):
    """The check itself can fail: inside a function, relative, absolute, from a subpackage."""
    where = PACKAGE / ("transport/x.py" if source.startswith("from ..") else "x.py")
    assert agent_imports_outside_the_seam(where, source) == {"kpremote.agent.lease"}


@pytest.mark.parametrize("source", ["from .agent.run import plot\n", "from .agent.run.plot import copy_share\n",
                                    "import kpremote.agent.run.plot\n"])
def test_the_walk_finds_a_module_in_an_agent_folder(source):
    """The agent's parts are folders (run/, harness/, ...): an import of a module in one is found too."""
    assert agent_imports_outside_the_seam(PACKAGE / "x.py", source) == {"kpremote.agent.run.plot"}


def test_the_exceptions_still_name_real_imports():
    """An allowance whose import is gone must go too (ncu.py's ProfileRequest, once it lives in protocol.py)."""
    for rel, module in ALLOWED_ELSEWHERE:
        path = PACKAGE / rel
        assert path.is_file() and module in imported_modules(path), (rel, module)
