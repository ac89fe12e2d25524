"""The agent skill shipped with kpremote: SKILL.md (Agent Skills format: YAML front matter, then instructions) and
where `kpremote skill install --for claude|codex|FOLDER` puts it.

Claude Code loads user skills from ~/.claude/skills/<name>/SKILL.md; Codex from ~/.agents/skills/<name>/SKILL.md
(the user scope of developers.openai.com/codex/skills; ~/.codex/skills was its earlier place).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import KpremoteError

NAME = "kpremote"
AGENT_FOLDERS = {"claude": Path(".claude") / "skills", "codex": Path(".agents") / "skills"}


def skill_text() -> str:
    """SKILL.md as shipped in the package."""
    return resources.files(__package__).joinpath("SKILL.md").read_text(encoding="utf-8")


def skill_folder(target: str) -> Path:
    """claude or codex: the agent's user skill folder for kpremote; anything else: that folder itself."""
    if not target or not target.strip():
        raise KpremoteError("--for is required: claude, codex or a folder")
    if target in AGENT_FOLDERS:
        return Path.home() / AGENT_FOLDERS[target] / NAME
    folder = Path(target).expanduser()
    if "/" not in target and not target.startswith((".", "~")) and not folder.is_dir():  # a bare word: a typo?
        import difflib

        close = difflib.get_close_matches(target, list(AGENT_FOLDERS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise KpremoteError(f"--for {target}: not claude or codex — {hint}(a new folder: --for ./{target})")
    if folder.exists() and not folder.is_dir():
        raise KpremoteError(f"--for {target}: not a folder")
    return folder


def install(target: str) -> Path:
    """Write SKILL.md into the folder `target` names (made if missing); returns the file's path."""
    folder = skill_folder(target)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "SKILL.md"
        path.write_text(skill_text(), encoding="utf-8")
    except OSError as exc:
        raise KpremoteError(f"--for {target}: cannot write {folder / 'SKILL.md'}: {exc.strerror}") from None
    return path
