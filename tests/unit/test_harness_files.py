"""Every agent module a run imports either counts in the harness digest or is named, with its reason, as deciding
no verdict and no number (kpremote/agent/harness.py). A module split out of the runner or the judge cannot slip out
of the digest unnoticed: results would then not say which code measured them."""

from __future__ import annotations

import ast
from pathlib import Path

from kpremote.agent import harness

AGENT = harness.AGENT_DIR
ENTRY_POINTS = ("runner.py", "judge.py", "side.py", "worker.py", "audit.py")  # the processes of one run


def agent_imports(path: Path) -> set[str]:
    """The agent modules path imports (relative or absolute, at the top or inside a function), as file names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:
            names.update([node.module.split(".")[0]] if node.module else [alias.name for alias in node.names])
        elif node.level == 0 and (node.module or "").startswith("kpremote.agent."):
            names.add(node.module.split(".")[2])
    return {f"{name}.py" for name in names if (AGENT / f"{name}.py").is_file()}


def imported_by_a_run() -> set[str]:
    seen: set[str] = set()
    todo = list(ENTRY_POINTS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(agent_imports(AGENT / name))
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
        (tmp_path / name).write_text(f"# {name}\n")
    before = harness.harness_digest(tmp_path)
    (tmp_path / "children.py").write_text("# changed\n")
    assert harness.harness_digest(tmp_path) != before
