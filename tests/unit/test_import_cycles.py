"""No import circle anywhere in kpremote/: not between modules, counting every import a module's source names (at its
top, inside a function, or under `if TYPE_CHECKING:`, which only annotations need but which a reader follows all the
same), and not between the agent's folders, which are its parts in layers (docs/architecture.md):

    task (the task and its builds) < harness (the judge) < ncu (Nsight Compute, the audit) < run (a run) < slurm

with sandbox/ below them all and the modules at the agent's top (protocol.py, procfs.py, lease.py, ...) each a part of
its own. A module imports the parts below its own, never one above. The agent imports nothing of the client either:
it ships alone, with the standard library, torch, triton and pynvml (and what a build kind names) for company.

Read from the source (AST), so a cycle is found before anything imports it.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

import kpremote

PACKAGE = Path(kpremote.__file__).parent
AGENT = PACKAGE / "agent"
AGENT_PARTS = ("sandbox", "task", "harness", "ncu", "run", "slurm")
"""The agent's folders, lowest first: a folder may import the ones before it, never one after it."""
AGENT_MAY_IMPORT = {
    "torch", "triton", "pynvml",  # the GPU and its kernels (torch and triton lazily: a probe imports neither)
    "matplotlib",  # run/plot.py draws speedup.png where it is installed, and says so where it is not
    "tvm_ffi",  # build kind "tvm-ffi": its builder imports it when a side is built
    "tomli",  # tomllib's twin on Python 3.10
}


def module_name(path: Path) -> str:
    """kpremote.runs.remote for kpremote/runs/remote.py; a package by its own name (kpremote.runs)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, source: str | None = None) -> set[str]:
    """Every name path's source imports, by its full dotted name, wherever in the file the import stands."""
    path = modules().get(name)
    is_package = path is not None and path.name == "__init__.py"
    package = name if is_package else name.rsplit(".", 1)[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text() if source is None else source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import x`: the module x
    return found


def kpremote_imports(name: str, source: str | None = None) -> set[str]:
    """The kpremote modules among imports_of (a name imported from a module is that module)."""
    return {found for found in imports_of(name, source) if found in modules()} - {name}


@functools.lru_cache(maxsize=1)
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(kpremote_imports(name)) for name in modules()}


def cycles(edges: dict[str, frozenset[str] | set[str]]) -> list[list[str]]:
    """Every circle: each group of nodes that reach each other (Tarjan's strongly connected components) of more
    than one node, each sorted."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in order:
            visit(node)
    return found


def agent_part(name: str) -> str:
    """The agent's part a module belongs to: its folder under kpremote/agent/, or the module itself at the top."""
    parts = name.split(".")
    return parts[2] if len(parts) >= 3 and parts[2] in AGENT_PARTS else name


def agent_parts_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, imported in graph().items():
        if name.startswith("kpremote.agent.") or name == "kpremote.agent":
            edges.setdefault(agent_part(name), set()).update(
                agent_part(other) for other in imported if other.startswith("kpremote.agent") and
                agent_part(other) != agent_part(name))
    return edges


def test_no_module_imports_itself_back_through_others():
    assert len(graph()) > 150 and sum(map(len, graph().values())) > 500  # the walk saw the package
    assert cycles(graph()) == []


def test_no_agent_folder_imports_one_above_it():
    """The parts in their order; a circle between folders would show as one, and an import of a part above as a
    step the wrong way."""
    edges = agent_parts_graph()
    assert set(AGENT_PARTS) <= set(edges)
    upward = sorted(f"{part} imports {other}" for part, others in edges.items() if part in AGENT_PARTS
                    for other in others if other in AGENT_PARTS and AGENT_PARTS.index(other) > AGENT_PARTS.index(part))
    assert upward == []
    assert cycles({part: frozenset(others) for part, others in edges.items()}) == []


def test_no_agent_module_imports_the_client_or_a_package_it_does_not_ship_with():
    """The agent ships alone (agentclient.agent_bundle: kpremote/__init__.py and kpremote/agent/), so an import of
    the client, or of the client's libraries, fails on a host."""
    outside: dict[str, list[str]] = {}
    for name in modules():
        if not name.startswith("kpremote.agent"):
            continue
        tops = {found for found in imports_of(name) if not found.startswith("kpremote.agent")}
        bad = {found for found in tops if found.startswith("kpremote") or (
            found.split(".")[0] not in sys.stdlib_module_names and found.split(".")[0] not in AGENT_MAY_IMPORT
            and not found.startswith("__future__"))}
        if bad - {"kpremote"}:  # `from kpremote import agent` style names only the package the agent ships in
            outside[name] = sorted(bad - {"kpremote"})
    assert outside == {}


@pytest.mark.parametrize("source", [
    "from .runs.remote import start_run\n",
    "def f():\n    from .runs.remote import start_run\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runs.remote import start_run\n",
    "import kpremote.runs.remote\n",
])
def test_the_walk_sees_an_import_however_it_is_written(source):
    """At the top, inside a function, under TYPE_CHECKING, absolute: each closes a circle all the same."""
    assert "kpremote.runs.remote" in kpremote_imports("kpremote.errors", source)


def test_the_cycle_check_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    with_a_circle = {**graph(), "kpremote.errors": graph()["kpremote.errors"] | {"kpremote.runs.remote"}}
    assert any("kpremote.errors" in group for group in cycles(with_a_circle))


def test_the_layer_check_can_fail():
    assert agent_part("kpremote.agent.task.builders.cuda") == "task"
    assert agent_part("kpremote.agent.protocol") == "kpremote.agent.protocol"
    edges = agent_parts_graph()
    assert "harness" in edges["ncu"] and "ncu" not in edges["harness"]  # the audit stands on the judge's parts
