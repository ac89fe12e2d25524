"""No committed baseline or adapter file repeats more than five consecutive lines of the pinned upstream files.

The upstream files are not committed (they are materialized from the pinned wheel), so each task commits
baseline/upstream_lines.sha256, every 6-line window of them (kpremote/task/upstreamlines.py). The copy check runs on
that digest alone; a second test re-generates the digest from the pinned wheel (kpremote's cache, else pip) and
compares, so a digest cut short or left from an older pin fails here wherever the wheel can be had.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kpremote.task import upstreamlines, wheels
from kpremote.task.baseline import wheel_pin

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
PINNED = sorted(p.parent.name for p in KERNELS.glob("*/task.toml") if wheel_pin(p.parent)[2])
CHECKED = ("baseline", "bench")  # the copied-baseline glue and the adapters; the pinned files themselves excepted


def committed_files(task: Path) -> list[Path]:
    """The task's own text files under baseline/ and bench/: not upstream/, caches or the digest itself."""
    found = []
    for folder in CHECKED:
        for path in sorted((task / folder).rglob("*")):
            parts = path.relative_to(task).parts
            if not path.is_file() or "upstream" in parts or "__pycache__" in parts:
                continue
            if path.relative_to(task).as_posix() == upstreamlines.DIGEST_FILE:
                continue
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # not text
            found.append(path)
    return found


def every_digest() -> set[str]:
    return {d for task in PINNED for d in upstreamlines.read_digest(KERNELS / task / upstreamlines.DIGEST_FILE)[1]}


def test_the_wheel_pinned_tasks_are_found() -> None:
    assert len(PINNED) >= 5


@pytest.mark.parametrize("task", PINNED)
def test_the_digest_is_of_the_files_task_toml_pins(task: str) -> None:
    """Checked without the wheel: the header's file list and sha256s are task.toml's [baseline.sha256]."""
    files, digests = upstreamlines.read_digest(KERNELS / task / upstreamlines.DIGEST_FILE)
    assert files == wheel_pin(KERNELS / task)[2], (f"kernels/{task}/{upstreamlines.DIGEST_FILE} is of another pin: "
                                                   f"re-write it with inv baseline --task {task} --materialize")
    assert len(digests) > 100


@pytest.mark.parametrize("task", PINNED)
def test_no_baseline_or_adapter_file_shares_six_lines_in_a_row_with_the_upstream(task: str) -> None:
    digests = every_digest()  # any task's pinned files: a copy from a neighbour's upstream counts too
    files = committed_files(KERNELS / task)
    assert any(p.name == "adapter.py" for p in files)
    copies = {str(p.relative_to(KERNELS)): upstreamlines.copied_runs(p.read_text(encoding="utf-8"), digests)
              for p in files}
    assert not {name: lines for name, lines in copies.items() if lines}, (
        "these files repeat 6 or more consecutive upstream lines (starting at the lines given): call upstream's own "
        "functions instead")


@pytest.mark.parametrize("task", PINNED)
def test_the_committed_digest_is_the_one_the_pinned_wheel_gives(task: str) -> None:
    wheel_name, wheel_sha256, _ = wheel_pin(KERNELS / task)
    try:
        wheels.obtain(wheel_name, wheel_sha256)
    except wheels.WheelError as exc:
        pytest.skip(f"the pinned wheel cannot be had here ({exc}): the digest is checked against task.toml only")
    committed = (KERNELS / task / upstreamlines.DIGEST_FILE).read_text(encoding="utf-8")
    assert committed == upstreamlines.digest_from_wheel(KERNELS / task), (
        f"re-write it with inv baseline --task {task} --materialize")


# ------------------------------------------------------------------------------------------------ the detector

UPSTREAM = "\n".join(f"    value_{i} = compute(value_{i - 1}, {i})  # step {i}" for i in range(1, 21)) + "\n"


def digests_of(text: str) -> set[str]:
    return set(upstreamlines.windows(text))


def test_six_lines_in_a_row_are_found_wherever_they_sit_and_however_they_are_indented() -> None:
    lines = UPSTREAM.splitlines()
    copied = "def mine():\n    pass\n\n" + "\n\n".join("  " + " ".join(line.split()) + "   " for line in lines[4:10])
    assert upstreamlines.copied_runs(copied, digests_of(UPSTREAM)) == [4]  # the copy starts on line 4


def test_five_lines_in_a_row_are_not_a_copy() -> None:
    lines = UPSTREAM.splitlines()
    near = "\n".join(lines[4:9] + ["    mine = 1"] + lines[9:14]) + "\n"
    assert upstreamlines.copied_runs(near, digests_of(UPSTREAM)) == []


def test_the_digest_file_round_trips(tmp_path: Path) -> None:
    text = upstreamlines.render_digest("w-1-py3-none-any.whl", "ab" * 32, {"pkg/a.py": UPSTREAM.encode()})
    (tmp_path / "d").write_text(text)
    files, digests = upstreamlines.read_digest(tmp_path / "d")
    assert files == {"pkg/a.py": __import__("hashlib").sha256(UPSTREAM.encode()).hexdigest()}
    assert digests == digests_of(UPSTREAM) and len(digests) == 20 - 6 + 1
