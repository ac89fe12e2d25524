"""Every agent module a run imports either counts in the harness digest or is named, with its reason, as deciding
no verdict and no number (kpremote/agent/harness/__init__.py). A module split out of the runner or the judge cannot slip
out of the digest unnoticed: results would then not say which code measured them."""

from __future__ import annotations

import ast
from pathlib import Path

from kpremote.agent import harness

AGENT = harness.AGENT_DIR
# the processes of one run
ENTRY_POINTS = ("run/runner.py", "harness/judge.py", "harness/side.py", "task/worker.py", "ncu/audit.py",
                "ncu/auditcases.py")


def agent_imports(name: str) -> set[str]:
    """The agent modules the file `name` imports (relative or absolute, at the top or inside a function), as paths
    from the agent's folder ("task/build.py", "task/builders/cuda.py"); importing a package's module imports its
    __init__.py."""
    path = AGENT / name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parents[node.level - 1]
        elif (node.module or "").startswith("kpremote.agent."):
            base = AGENT
        else:
            continue
        module = node.module[len("kpremote.agent."):] if not node.level else node.module
        target = base.joinpath(*module.split(".")) if module else base
        found |= module_files(target, [alias.name for alias in node.names])
    return found


def module_files(target: Path, names: list[str]) -> set[str]:
    """The agent files behind `from target import names`: target's module, or a package's __init__.py and the
    names that are its modules, with the __init__.py of every package on the way."""
    files = [target.with_suffix(".py"), target / "__init__.py", *(target / f"{name}.py" for name in names)]
    files = [file for file in files if file.is_file() and file != AGENT / "__init__.py"]
    packages = [folder / "__init__.py" for file in files for folder in file.parents if AGENT in folder.parents]
    return {file.relative_to(AGENT).as_posix() for file in files + packages}


def imported_by_a_run() -> set[str]:
    seen: set[str] = set()
    todo = list(ENTRY_POINTS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(agent_imports(name))
    return seen


def test_every_module_a_run_imports_is_in_the_digest_or_says_why_not():
    unclassified = imported_by_a_run() - set(harness.HARNESS_FILES) - set(harness.OUTSIDE_THE_HARNESS)
    assert unclassified == set(), f"add to harness.HARNESS_FILES (or OUTSIDE_THE_HARNESS, with a reason): {unclassified}"


def test_the_two_lists_name_real_files_and_never_the_same_one():
    named = set(harness.HARNESS_FILES) | set(harness.OUTSIDE_THE_HARNESS)
    assert not set(harness.HARNESS_FILES) & set(harness.OUTSIDE_THE_HARNESS)
    assert {name for name in named if not (AGENT / name).is_file()} == set()


def test_the_digest_changes_with_any_harness_file(tmp_path):
    for name in harness.HARNESS_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n")
    before = harness.harness_digest(tmp_path)
    (tmp_path / "run/children.py").write_text("# changed\n")
    assert harness.harness_digest(tmp_path) != before


def test_the_modules_of_a_package_are_followed_into_the_digest():
    """build.py reaches the builders through builders/__init__.py: each kind's builder decides how a side is built."""
    reached = imported_by_a_run()
    assert {"task/builders/__init__.py", "task/builders/base.py", "task/builders/cuda.py",
            "task/builders/tvmffi.py"} <= reached
    assert {"task/builders/cuda.py", "task/builders/tvmffi.py", "task/buildrules.py"} <= set(harness.HARNESS_FILES)
