"""Where the project is: its root found by walking up from the current folder to a hosts.toml or a pyproject.toml
with a [tool.kpremote] table, so every command works from any folder inside it (kernels/foo included).

From the root come kernels/ and hosts.toml. [tool.kpremote] may name others: `kernels = "path"`, `hosts = "path"`
(relative to the root). With no project, hosts.toml is ~/.config/kpremote/hosts.toml when that exists; inside one,
that user file layers over the project's (config.load_inventory): a user's own hosts need no edit of a tracked file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

USER_HOSTS = Path("~/.config/kpremote/hosts.toml")


def _settings(pyproject: Path) -> Optional[dict[str, Any]]:
    """pyproject's [tool.kpremote] table, or None when it has none (or cannot be read as TOML)."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, ValueError):
        return None
    table = data.get("tool", {}).get("kpremote")
    return table if isinstance(table, dict) else None


def find_root(start: Optional[Path] = None) -> Optional[Path]:
    """The nearest folder at or above start (default: the current one) with a hosts.toml, or a pyproject.toml that
    has a [tool.kpremote] table."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "hosts.toml").is_file():
            return folder
        if (folder / "pyproject.toml").is_file() and _settings(folder / "pyproject.toml") is not None:
            return folder
    return None


def _named(root: Path, key: str, default: str) -> Path:
    settings = _settings(root / "pyproject.toml") if (root / "pyproject.toml").is_file() else None
    value = (settings or {}).get(key)
    return root / (value if isinstance(value, str) and value else default)


def kernels_dir(start: Optional[Path] = None) -> Path:
    """The project's kernels/ (./kernels outside any project)."""
    root = find_root(start)
    return _named(root, "kernels", "kernels") if root else Path("kernels")


def user_hosts_file() -> Optional[Path]:
    """~/.config/kpremote/hosts.toml when it exists: the user's own hosts."""
    user = USER_HOSTS.expanduser()
    return user if user.is_file() else None


def default_hosts_file(start: Optional[Path] = None) -> Path:
    """The project's hosts.toml, else ~/.config/kpremote/hosts.toml if it exists, else ./hosts.toml (whose absence
    the inventory reports)."""
    root = find_root(start)
    if root is not None:
        named = _named(root, "hosts", "hosts.toml")
        if named.is_file():
            return named
    return user_hosts_file() or Path("hosts.toml")
