"""A module run as a program (`python -m kpremote.agent.run.runner`) runs its `if __name__ == "__main__"` block when
Python reaches it: a function defined below that block does not exist yet. Under 2.17 a merge put the runner's audit
check below it, and every audited GPU run ended "NameError: _judge_audited_outputs" though the tests, which import
the runner, passed. So the block is each module's last statement."""

from __future__ import annotations

import ast
from pathlib import Path

import kpremote

PACKAGE = Path(kpremote.__file__).parent


def is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def test_a_main_block_is_the_last_statement_of_its_module():
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        body = ast.parse(path.read_text(), str(path)).body
        late += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for node in body[:-1] if is_main_block(node)]
    assert not late, f"code after the __main__ block: {late}"
