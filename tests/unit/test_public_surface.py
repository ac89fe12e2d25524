"""Each package of kpremote/ declares its public surface in its __init__.py's `__all__` (as httpx does): the modules
and names that code outside the package may use. Everything a module outside a package imports of it is declared;
everything declared can be imported; and each declared module is drawn in docs/architecture.md (where the project
documents its modules), each declared name of an __init__ in that package's docstring or the drawing.

Read from the source (AST): `from P import x`, `import P.x`, `from P.x import y`, and `P.x` after `from Q import P`
(or `import P as p`) all count as a use of x.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

import kpremote

PACKAGE = Path(kpremote.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
NOT_PACKAGES = ("templates",)  # a new task's files: task code, not kpremote's


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    return {name_of(path): path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] not in NOT_PACKAGES}


@functools.lru_cache(maxsize=1)
def packages() -> list[str]:
    return [name for name, path in modules().items() if path.name == "__init__.py"]


def declared(package: str) -> list[str] | None:
    """The package's `__all__` as its __init__.py writes it (a list or tuple of strings), or None."""
    tree = ast.parse(modules()[package].read_text())
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return list(ast.literal_eval(node.value))
    return None


def used_names(name: str, source: str | None = None) -> set[tuple[str, str]]:
    """(package, x) for each x this module uses of a kpremote package: imports of it and attributes read through an
    alias bound to it."""
    path = modules().get(name, PACKAGE / "x.py")
    package_of_module = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text() if source is None else source)
    found: set[tuple[str, str]] = set()
    aliases: dict[str, str] = {}  # a local name -> the kpremote package it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _split(alias.name)
                if alias.asname and alias.name in packages():
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package_of_module.rsplit(".", node.level - 1)[0] if node.level > 1 else package_of_module
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            found |= _split(target)
            if target in packages():
                found |= {(target, alias.name) for alias in node.names}
                aliases.update({alias.asname or alias.name: f"{target}.{alias.name}" for alias in node.names
                                if f"{target}.{alias.name}" in packages()})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.add((aliases[node.value.id], node.attr))
    return found


def _split(dotted: str) -> set[tuple[str, str]]:
    """(package, x) for each package on a dotted path and the part after it: kpremote.runs.remote.x gives
    (kpremote, runs) and (kpremote.runs, remote)."""
    parts = dotted.split(".")
    return {(".".join(parts[:k]), parts[k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in packages()}


def outside(module: str, package: str) -> bool:
    return module != package and not module.startswith(package + ".")


def undeclared_uses() -> dict[str, list[str]]:
    missing: dict[str, set[str]] = {}
    for name in modules():
        for package, used in used_names(name):
            if outside(name, package) and used not in (declared(package) or []):
                missing.setdefault(package, set()).add(f"{used} (by {name})")
    return {package: sorted(uses) for package, uses in missing.items()}


def test_every_package_declares_its_public_surface():
    assert len(packages()) >= 15
    assert [package for package in packages() if declared(package) is None] == []


def test_what_a_package_is_used_for_from_outside_it_is_declared():
    assert undeclared_uses() == {}


@pytest.mark.parametrize("package", [p for p in sorted(modules()) if modules()[p].name == "__init__.py"])
def test_each_declared_name_can_be_imported(package):
    """A module or subpackage by its file (found, not imported: torch stays out of the fast suite), a name of the
    __init__ by importing the package (every __init__ is light)."""
    for name in declared(package) or []:
        if importlib.util.find_spec(f"{package}.{name}") is None:
            assert hasattr(importlib.import_module(package), name), f"{package}.{name}"


def is_module(package: str, name: str) -> bool:
    return f"{package}.{name}" in modules()


@functools.lru_cache(maxsize=1)
def drawing() -> str:
    return ARCHITECTURE.read_text()


def undocumented(package: str) -> list[str]:
    """Declared modules not named in docs/architecture.md (as NAME.py, or NAME/ for a folder); declared names of the
    __init__ in neither its docstring nor the drawing."""
    docstring = ast.get_docstring(ast.parse(modules()[package].read_text())) or ""
    missing = []
    for name in declared(package) or []:
        if is_module(package, name):
            file = f"{name}/" if modules()[f"{package}.{name}"].name == "__init__.py" else f"{name}.py"
            if not re.search(rf"(?<![\w.]){re.escape(file)}", drawing()):
                missing.append(file)
        elif not re.search(rf"\b{re.escape(name)}\b", docstring + drawing()):
            missing.append(name)
    return missing


def test_each_declared_module_is_drawn_and_each_declared_name_said():
    assert {package: undocumented(package) for package in packages() if undocumented(package)} == {}


@pytest.mark.parametrize("source, use", [
    ("from kpremote.runs import remote\n", ("kpremote.runs", "remote")),
    ("from ..runs.remote import start_run\n", ("kpremote.runs", "remote")),
    ("import kpremote.runs.remote\n", ("kpremote.runs", "remote")),
    ("from .. import sandbox\nsandbox.enter()\n", ("kpremote.agent.sandbox", "enter")),
    ("import kpremote.transport as t\nt.Command\n", ("kpremote.transport", "Command")),
])
def test_the_walk_sees_a_use_however_it_is_written(source, use):
    where = "kpremote.agent.run.x" if ".." in source and "sandbox" in source else "kpremote.cli.x"
    assert use in used_names(where, source)
