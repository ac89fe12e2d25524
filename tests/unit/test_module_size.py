"""No module of kpremote/ over MAX_LINES lines (issue 46): a module that grows past it is split along a seam, a pure
move of what belongs together into a module of its own (runner.py's steps, timing.py's device probe, ...)."""

from __future__ import annotations

from pathlib import Path

import kpremote

PACKAGE = Path(kpremote.__file__).parent
MAX_LINES = 450


def lines_of(path: Path) -> int:
    """As `wc -l` counts them: newline characters."""
    return path.read_bytes().count(b"\n")


def oversized(folder: Path, limit: int = MAX_LINES) -> dict[str, int]:
    return {path.relative_to(folder).as_posix(): n for path in sorted(folder.rglob("*.py"))
            if (n := lines_of(path)) > limit}


def test_no_module_is_over_the_limit():
    assert len(list(PACKAGE.rglob("*.py"))) > 150  # the walk saw the package
    assert oversized(PACKAGE) == {}


def test_the_size_check_can_fail(tmp_path):
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "just.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == {"big.py": MAX_LINES + 1}
