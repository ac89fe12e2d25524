"""What source a run is made of: which files of a task folder count, their digests, the folder's git state, and
where its baseline came from upstream.

Standard library only, and used by both sides: the client stamps it into every sync (`.kpremote/provenance.json`),
and the agent computes the very same thing for a task that came without one (`python -m kpremote.agent run`). So
`solution_sha256`, `baseline_sha256` and `diff_sha256` in results.json mean one thing whoever computed them:

- the files: every regular file under the task folder, links never followed, minus `.git/`, `__pycache__/`,
  `.kpremote/`, `*.pyc`, `results/`, `ledger.jsonl`, the two docs fetch-results writes, and what `.kpremoteignore` names;
- a side's digest: `manifest_digest` of {path under the side's folder: sha256 of the content}; None when the side
  has no file;
- the git state of the task folder only when the repository tracks it: a task folder copied into some other project's
  untracked folder is not stamped with that project's commit. `diff_sha256` hashes `git diff HEAD --binary` of the
  folder, and is None when there is no difference (a clean tree). kpremote's own output (`results/`, `.kpremote/`
  and the two docs fetch-results writes) never makes a tree dirty: fetching a run must not change the next run's
  provenance.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from .protocol import manifest_digest

EXCLUDED_NAMES = {".git", "__pycache__", ".kpremote"}
FETCH_WRITTEN = {"docs/results.md", "docs/run_log.md"}
"""Written locally by fetch-results after every run: the host has the originals, and sending them back would
make every repeat run a changed one."""
KPREMOTE_OUTPUT = (*sorted(FETCH_WRITTEN), "results", ".kpremote", "ledger.jsonl")
"""What kpremote itself writes into a task folder (relative to it): fetched summaries and checks (results/), every
run's ledger line (kpremote/ledger.py), the two docs fetch writes, its own state; left out of the git state as well as
the digests: they change with every run and are no part of what is measured."""
IGNORE_FILE = ".kpremoteignore"
RECORDED = Path(".kpremote") / "provenance.json"
SIDES = ("solution", "baseline")
GIT_TIMEOUT_S = 30
CHUNK = 1024 * 1024


class IgnoreFileError(ValueError):
    """.kpremoteignore exists but cannot be read."""


# ---------------------------------------------------------------- which files count


def walk_task(task_dir: Path, warnings: list[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(relative POSIX path, lstat) of every file that counts, in a stable order; links are skipped, never
    followed. What is skipped and why goes to warnings."""
    ignore = IgnoreRules.load(Path(task_dir) / IGNORE_FILE, warnings)
    pending = [""]
    while pending:
        folder = pending.pop()
        with os.scandir(Path(task_dir) / folder if folder else task_dir) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{folder}/{entry.name}" if folder else entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if excluded(rel, is_dir) or ignore.matches(rel, is_dir):
                    continue
                if entry.is_symlink():
                    warnings.append(f"skipped symlink {rel} (links are never followed nor synced)")
                elif is_dir:
                    pending.append(rel)
                elif not entry.is_file(follow_symlinks=False):
                    warnings.append(f"skipped {rel}: not a regular file")
                elif not _encodable(rel):
                    warnings.append(f"skipped {rel!r}: file name is not valid UTF-8")
                else:
                    yield rel, entry.stat(follow_symlinks=False)


def excluded(rel: str, is_dir: bool) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if rel in KPREMOTE_OUTPUT or (not is_dir and name.endswith(".pyc")):
        return True
    return name in EXCLUDED_NAMES


def _encodable(rel: str) -> bool:
    try:
        rel.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


@dataclass
class IgnoreRules:
    """.kpremoteignore: gitignore-like globs. 'dir/' matches folders only, '/x' or 'a/b' anchor at the task root,
    a bare name matches at any depth; a matched folder is skipped whole. '!' (re-include) is not supported."""

    patterns: list[tuple[str, bool, bool]]  # (glob, anchored, folders only)

    @classmethod
    def load(cls, path: Path, warnings: list[str]) -> "IgnoreRules":
        try:
            lines = path.read_text().splitlines() if path.is_file() and not path.is_symlink() else []
        except (OSError, UnicodeDecodeError) as exc:
            raise IgnoreFileError(f"{path}: cannot read: {exc}") from None
        patterns = []
        for line in (raw.strip() for raw in lines):
            if not line or line.startswith("#"):
                continue
            if line.startswith("!"):
                warnings.append(f"{path.name}: {line!r} ignored ('!' re-include is not supported)")
                continue
            body = line.rstrip("/")
            patterns.append((body.lstrip("/"), "/" in body, line.endswith("/")))
        return cls(patterns)

    def matches(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return any(
            fnmatch.fnmatchcase(rel if anchored else name, glob) and (is_dir or not folders_only)
            for glob, anchored, folders_only in self.patterns
        )


# ---------------------------------------------------------------- digests


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's content; refuses a link (OSError), so a swapped-in link is never read through."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_task(task_dir: Path) -> dict[str, str]:
    """{path: sha256} of every file that counts."""
    return {rel: file_sha256(os.path.join(task_dir, rel)) for rel, _ in walk_task(Path(task_dir), [])}


def side_sha256(hashes: Mapping[str, str], side: str) -> str | None:
    """The digest of one side's folder (solution/ or baseline/), None when it holds no file."""
    prefix = side + "/"
    inside = {path[len(prefix):]: sha for path, sha in hashes.items() if path.startswith(prefix)}
    return manifest_digest(inside) if inside else None


# ---------------------------------------------------------------- git


def git_state(folder: Path) -> dict[str, Any]:
    """Commit, dirty flag and hash of the uncommitted diff of folder; all None unless a repository tracks it."""
    def git(*args: str) -> bytes | None:
        try:
            done = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True,
                                  timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    unknown = {"git_commit": None, "git_dirty": None, "diff_sha256": None}
    tracked = git("ls-files", "-z", "--", ".")
    if not tracked:  # no repository, or one that does not track this folder (say, copied into its untracked corner)
        return unknown
    ours = [f":(exclude){path}" for path in KPREMOTE_OUTPUT]
    status = git("status", "--porcelain=v2", "--branch", "--", ".", *ours)
    diff = git("diff", "HEAD", "--binary", "--", ".", *ours)
    commit = _branch_oid(status) if status is not None else None
    if commit is None or diff is None:
        return unknown
    dirty = any(line and not line.startswith(b"#") for line in status.splitlines())
    return {"git_commit": commit, "git_dirty": dirty, "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}


def _branch_oid(status: bytes) -> str | None:
    """HEAD's commit from `status --porcelain=v2 --branch` ("# branch.oid <sha>"; "(initial)" before any commit)."""
    for line in status.splitlines():
        if line.startswith(b"# branch.oid "):
            oid = line.split()[-1].decode()
            return None if oid == "(initial)" else oid
    return None


# ---------------------------------------------------------------- the one provenance


def task_provenance(task_dir: Path, hashes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Git state and both sides' digests of a task folder. hashes: {path: sha256} of its files when the caller has
    them already (the client's scan, through its hash cache); else they are walked and hashed here."""
    task_dir = Path(task_dir)
    hashes = hash_task(task_dir) if hashes is None else hashes
    return {**git_state(task_dir), **{f"{side}_sha256": side_sha256(hashes, side) for side in SIDES}}


def baseline_upstream(baseline: Any) -> dict[str, Any]:
    """Where the task's baseline came from, as task.toml's [baseline] pins it (a taskspec.BaselineInfo): the upstream
    repository, ref and commit and the files taken, plus the release wheel and its digests when it came as one."""
    b = baseline
    release = {"release": b.release, "wheel": b.wheel, "wheel_sha256": b.wheel_sha256,
               "sha256": dict(b.sha256)} if b.wheel else {}
    return {"repo": b.repo, "ref": b.ref, "commit": b.commit, "files": list(b.files), "follows": b.follows, **release}


def source_provenance(task_dir: Path) -> dict[str, Any]:
    """What source ran: the sync's record (workspace/.kpremote/provenance.json) when there is one, else computed
    here by the same definition."""
    recorded = Path(task_dir) / RECORDED
    if recorded.is_file():
        try:
            return {**json.loads(recorded.read_text()), "origin": RECORDED.as_posix()}
        except ValueError:
            pass
    try:
        computed = task_provenance(task_dir)
    except (IgnoreFileError, OSError) as exc:
        computed = {"error": str(exc)}
    return {"origin": "computed by the agent", **computed}
