"""A pin's records: the upstream commit a task's baseline was copied from (BaselinePin) or the release wheel
(ReleasePin), each copied file with its sha256 and size (BaselineFile). baseline.py makes them; baselinedoc.py
writes what they say into the task's docs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BaselineFile:
    path: str
    sha256: str
    size: int


@dataclass
class BaselinePin:
    repo: str
    ref: str
    commit: str
    resolved_at: str  # UTC, ISO 8601
    files: list[BaselineFile]
    source: str | None = None  # the local git snapshot the files were read from, when not the repo itself
    committed_at: str | None = None  # the commit's committer date, as git reports it


@dataclass(kw_only=True)
class ReleasePin:
    repo: str
    ref: str = "release"  # what task.toml [baseline] ref says for a release pin
    release: str          # "<distribution> <version>", e.g. "sglang 0.5.23"
    wheel: str            # the wheel's file name; its tags say which platform build pip chose
    wheel_sha256: str
    resolved_at: str      # UTC, ISO 8601: when pip resolved the release
    files: list[BaselineFile]
