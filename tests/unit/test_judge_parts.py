"""The judge's parts (sideprocess.py, cases.py, sampling.py, floors.py) stand below judge.py: none imports the
judge back at run time (sampling.py names Judge for type checking only), and none imports torch at import time
(the agent imports torch lazily)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from kpremote.agent import harness

PARTS = ("sideprocess", "cases", "sampling", "floors")
REPO = Path(__file__).resolve().parents[2]


def runtime_imports(path: Path) -> set[str]:
    """The relative imports of path's top level, leaving out those under `if TYPE_CHECKING:`."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.update([node.module] if node.module else [alias.name for alias in node.names])
    return names


def test_no_part_of_the_judge_imports_the_judge_back() -> None:
    for part in PARTS:
        assert "judge" not in runtime_imports(harness.AGENT_DIR / "harness" / f"{part}.py"), part


def test_the_judges_parts_import_neither_the_judge_nor_torch() -> None:
    code = ("import sys\n" + "".join(f"import kpremote.agent.harness.{part}\n" for part in PARTS) +
            "print(sorted(name for name in ('kpremote.agent.harness.judge', 'torch') if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO)}, check=True)
    assert done.stdout.strip() == "[]"
