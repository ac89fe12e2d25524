"""A row's log (raw/workloads/<row>.log) is held to its cap while a writer keeps appending to it, and says at the end
how much it dropped (harness/rowlog.py)."""

from __future__ import annotations

import os
from pathlib import Path

from kpremote.agent.harness.rowlog import CappedLog, open_log


def test_a_log_past_its_cap_keeps_its_first_bytes_and_says_how_many_were_dropped(tmp_path: Path) -> None:
    path = tmp_path / "row.log"
    fd = open_log(str(path))  # as a side holds it: appending
    try:
        log = CappedLog(path, cap=1000)
        os.write(fd, b"a" * 600)
        log.hold()
        assert path.stat().st_size == 600 and log.dropped == 0  # under the cap: untouched
        os.write(fd, b"b" * 900)
        log.hold()
        assert path.read_bytes() == b"a" * 600 + b"b" * 400 and log.dropped == 500
        os.write(fd, b"c" * 300)  # the writer goes on at the cut
        assert log.end() == 800
    finally:
        os.close(fd)
    text = path.read_bytes()
    assert text.startswith(b"a" * 600 + b"b" * 400 + b"\n[kpremote: at least 800 bytes of this row's output were dropped")
    assert len(text) < 1200


def test_a_log_under_its_cap_or_never_made_is_left_alone(tmp_path: Path) -> None:
    assert CappedLog(tmp_path / "none.log", cap=10).end() == 0 and not (tmp_path / "none.log").exists()
    path = tmp_path / "small.log"
    path.write_bytes(b"x" * 10)
    assert CappedLog(path, cap=10).end() == 0 and path.read_bytes() == b"x" * 10
