"""Where a pin lies in the task folder (baseline/upstream/, docs/baseline_source.md, baseline/.gitignore) and what it
says to people there: its block in docs/baseline_source.md (between markers, so text a person wrote around it
survives) and the /upstream/ line of baseline/.gitignore for files re-created from a wheel."""

from __future__ import annotations

from pathlib import Path

from . import wheels
from .pins import BaselineFile, BaselinePin, ReleasePin

UPSTREAM = Path("baseline") / "upstream"
SOURCE_DOC = Path("docs") / "baseline_source.md"
GITIGNORE = Path("baseline") / ".gitignore"
BLOCK_BEGIN = "<!-- kpremote:baseline begin (written by `inv baseline`; edit outside these markers) -->"
BLOCK_END = "<!-- kpremote:baseline end -->"
UPSTREAM_IGNORE = "/upstream/"


def render_source_block(pin: BaselinePin) -> str:
    return source_block([f"- Repository: {pin.repo}",
                         f"- Ref: `{pin.ref}`",
                         f"- Commit: `{pin.commit}`",
                         f"- Resolved at: {pin.resolved_at} (UTC)",
                         *([f"- Commit date: {pin.committed_at}"] if pin.committed_at else []),
                         *([f"- Read from a local git snapshot of it: `{pin.source}` (the ref was resolved there)"]
                           if pin.source else []),
                         f"- Copied, byte for byte, into `{UPSTREAM.as_posix()}/` (same relative paths)"], pin.files)


def render_release_block(pin: ReleasePin) -> str:
    return source_block([
        f"- Repository: {pin.repo}",
        f"- Release: {pin.release} (the release's wheel on PyPI; a wheel records no git commit)",
        f"- Wheel: `{pin.wheel}` (build tags `{wheels.Wheel(Path(pin.wheel), pin.wheel, '').tags}`)",
        f"- Wheel sha256: `{pin.wheel_sha256}`",
        f"- Resolved at: {pin.resolved_at} (UTC)",
        f"- Copied, byte for byte, from the wheel into `{UPSTREAM.as_posix()}/` (same paths as in the wheel). "
        "They are not committed (`baseline/.gitignore`): `inv baseline --task <task> --materialize`, and "
        "`inv run` / `inv check` / `inv sync` when they are missing, re-create them from the pinned wheel, and "
        "refuse any file whose sha256 differs from task.toml `[baseline.sha256]`; so does the agent."], pin.files)


def source_block(facts: list[str], files: list[BaselineFile]) -> str:
    """The marked block: where the files came from, a line each, then a row per file with its sha256 and size."""
    rows = "\n".join(f"| `{f.path.replace('|', chr(92) + '|')}` | `{f.sha256}` | {f.size} |" for f in files)
    return (f"{BLOCK_BEGIN}\n"
            "## Upstream baseline\n\n"
            + "".join(f"{fact}\n" for fact in facts) + "\n"
            "| file | sha256 | bytes |\n"
            "|---|---|---|\n"
            f"{rows}\n"
            f"{BLOCK_END}\n")


def with_upstream_ignored(path: Path) -> str | None:
    """baseline/.gitignore's text with /upstream/ listed, or None when it already is."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if UPSTREAM_IGNORE in old.split():
        return None
    head = old if not old or old.endswith("\n") else old + "\n"
    return (head + "# The pinned upstream files (task.toml [baseline.sha256]): re-created from the pinned wheel by "
            "`inv baseline --materialize`, never committed.\n" + UPSTREAM_IGNORE + "\n")


def with_source_block(old: str | None, block: str) -> str:
    """The doc with the generated block replaced, or appended after a person's text, or a new doc."""
    if old is None:
        return f"# Baseline source\n\n{block}"
    begin, end = old.find(BLOCK_BEGIN), old.find(BLOCK_END)
    if 0 <= begin < end:
        after = end + len(BLOCK_END)
        return old[:begin] + block + old[after:].removeprefix("\n")
    return old + ("" if old.endswith("\n") else "\n") + "\n" + block

