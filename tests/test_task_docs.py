"""The shipped tasks' hand-written docs cannot go stale against their results or their pin.

Results live in docs/results.md (and the other summaries kpremote fetches), written from a run; the hand-written
method and provenance docs state none, so a re-run cannot leave a number behind in them. The sha256 of pinned files
are written by `inv baseline` between its markers in docs/baseline_source.md (and in task.toml); a second table by
hand is what a re-pin would leave stale, so there is none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
TASKS = sorted(p.parent.name for p in KERNELS.glob("*/task.toml"))
STATE_NO_RESULT = ("benchmark_method.md", "baseline_source.md")
SPEEDUP = re.compile(r"\d+\.\d+\s?[x×](?![0-9A-Za-z])")  # 1.12x, 0.752×; not "4 x 132" or "0x1F"
SHA256 = re.compile(r"\b[0-9a-f]{64}\b")
BLOCK = re.compile(r"<!-- kpremote:baseline begin.*?<!-- kpremote:baseline end -->", re.S)


def test_speedups_are_recognised() -> None:
    assert SPEEDUP.findall("geomean 0.752× and 1.12x, 2.0 x") == ["0.752×", "1.12x", "2.0 x"]
    assert SPEEDUP.findall("4 x 132 programs, 1.5 us, 0x1F, 3.0x4") == []


@pytest.mark.parametrize("task", TASKS)
def test_method_and_provenance_docs_state_no_result(task: str) -> None:
    for name in STATE_NO_RESULT:
        doc = KERNELS / task / "docs" / name
        found = SPEEDUP.findall(doc.read_text(encoding="utf-8"))
        assert not found, f"{doc.relative_to(KERNELS)} states {found}: results belong in docs/results.md"


@pytest.mark.parametrize("task", TASKS)
def test_no_hand_written_sha256_table_beside_the_one_inv_baseline_writes(task: str) -> None:
    doc = KERNELS / task / "docs" / "baseline_source.md"
    outside = BLOCK.sub("", doc.read_text(encoding="utf-8"))
    assert SHA256.findall(outside) == [], (f"{doc.relative_to(KERNELS)}: sha256 outside the block `inv baseline` "
                                           "writes; a re-pin would leave them stale")
