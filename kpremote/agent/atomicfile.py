"""One way to replace a file so that no reader ever sees it half-written: write a hidden sibling, then rename.

Standard library only; the client uses it too. The temporary file lies in the same folder (a rename is atomic only
within one filesystem) and never outlives a failed write.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomically(path: str | Path, data: bytes | str) -> Path:
    """Replace path with data (text is written as UTF-8); its folder is created when missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomically(path: str | Path, value: Any, *, indent: int | None = None) -> Path:
    """value as JSON. Without indent it is compact and encoded in C: json.dumps with an indent takes the pure-Python
    encoder, ~0.3 s for the manifest of a 10,000-file workspace."""
    separators = (",", ":") if indent is None else None
    return write_atomically(path, json.dumps(value, indent=indent, separators=separators, default=str))
