"""Copied upstream lines: a task's committed files must not repeat runs of lines from its pinned upstream files.

The pinned upstream files are not committed (baseline/.gitignore), so what is committed in their place is a digest:
`baseline/upstream_lines.sha256` holds, for every window of WINDOW consecutive non-blank lines of every pinned file
(each line whitespace-normalized: stripped, inner runs of blanks made one space), the first 16 hex digits of the
sha256 of the window's lines joined by newlines. A committed file that shares WINDOW such lines in a row with the
upstream shares a digest with it; one that shares at most WINDOW - 1 does not. The file's header names the wheel and
each pinned file's sha256, so a digest left behind by an older pin is told apart from the current one.

`inv baseline --materialize` (and a new `--pypi` pin) writes the digest from the wheel; tests/test_upstream_lines.py
checks every shipped task against it, and re-generates it wherever the wheel can be had.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import wheels
from ..agent.atomicfile import write_atomically
from .baseline import wheel_pin

WINDOW = 6          # more than 5 consecutive lines in common is a copy
DIGEST_HEX = 16     # 64 bits of each window's sha256: no chance collision among a few thousand windows
DIGEST_FILE = "baseline/upstream_lines.sha256"


def normalized_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) for the non-blank lines of text, each stripped and its inner runs of whitespace
    made one space."""
    return [(number, " ".join(line.split())) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def window_digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()[:DIGEST_HEX]


def windows(text: str) -> dict[str, int]:
    """{digest: the line number where the window starts} for every WINDOW-line window of text (the first such)."""
    numbered = normalized_lines(text)
    lines = [line for _, line in numbered]
    found: dict[str, int] = {}
    for start in range(len(lines) - WINDOW + 1):
        found.setdefault(window_digest(lines[start:start + WINDOW]), numbered[start][0])
    return found


def render_digest(wheel: str, wheel_sha256: str, contents: dict[str, bytes]) -> str:
    """The digest file for these pinned files: a header (wheel, each file's sha256), then sorted unique digests."""
    header = [f"# Every {WINDOW}-line window of the pinned upstream files (non-blank lines, whitespace-normalized): "
              f"the first {DIGEST_HEX} hex digits of the sha256 of its lines joined by newlines.",
              "# Written by `inv baseline --task T --materialize` from the pinned wheel; checked by "
              "tests/test_upstream_lines.py.",
              f"# wheel {wheel} {wheel_sha256}"]
    header += [f"# file {path} {hashlib.sha256(data).hexdigest()}" for path, data in sorted(contents.items())]
    digests = sorted({d for data in contents.values() for d in windows(data.decode("utf-8", errors="replace"))})
    return "\n".join(header + digests) + "\n"


def digest_from_wheel(task_dir: Path) -> str:
    """The digest file's text for the task's pin, read from the pinned wheel (cache, else pip)."""
    wheel_name, wheel_sha256, digests = wheel_pin(task_dir)
    if not (wheel_name and wheel_sha256 and digests):
        raise wheels.WheelError(f"{Path(task_dir) / 'task.toml'}: [baseline] pins no wheel")
    wheel = wheels.obtain(wheel_name, wheel_sha256)
    return render_digest(wheel_name, wheel_sha256, wheels.read_members(wheel, sorted(digests)))


def write_digest(task_dir: Path) -> Path:
    """baseline/upstream_lines.sha256 written (atomically) from the pinned wheel; returns its path."""
    target = write_atomically(Path(task_dir) / DIGEST_FILE, digest_from_wheel(task_dir))
    target.chmod(0o644)
    return target


def read_digest(path: Path) -> tuple[dict[str, str], set[str]]:
    """({pinned path: sha256} from the header, the set of window digests) of a digest file."""
    files: dict[str, str] = {}
    digests: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# file "):
            _, _, name, sha256 = line.split(" ")
            files[name] = sha256
        elif line and not line.startswith("#"):
            digests.add(line)
    return files, digests


def copied_runs(text: str, digests: set[str]) -> list[int]:
    """The line numbers where a window of text that the digests hold starts, in order."""
    return sorted(start for digest, start in windows(text).items() if digest in digests)
