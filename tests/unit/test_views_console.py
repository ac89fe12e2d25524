"""--no-color replaces the two consoles (views/terminal.py plain_output), so every module must read them as
`terminal.console` / `terminal.errors` when it prints: a name imported from terminal would keep the colored console."""

from __future__ import annotations

import ast
from pathlib import Path

import kpremote
from kpremote.views import terminal

REPLACED = {"console", "errors"}


def names_imported_from_terminal(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("terminal"):
            found |= {alias.name for alias in node.names} & REPLACED
    return found


def test_no_module_holds_on_to_a_console_that_plain_output_replaces() -> None:
    offenders = {str(path): names for path in Path(kpremote.__file__).parent.rglob("*.py")
                 if (names := names_imported_from_terminal(path))}
    assert offenders == {}


def test_plain_output_replaces_both_consoles_without_colors(monkeypatch) -> None:
    monkeypatch.setattr(terminal, "console", terminal.console)
    monkeypatch.setattr(terminal, "errors", terminal.errors)
    before = (terminal.console, terminal.errors)
    terminal.plain_output()
    assert terminal.console is not before[0] and terminal.errors is not before[1]
    assert terminal.console.color_system is None and terminal.errors.color_system is None
    assert terminal.errors.stderr and not terminal.console.stderr
