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
  provenance;
- the task and its pin (docs/trust.md, "The sealed task"): `task_digest` is `manifest_digest` of every file that
  counts but solution/ and docs/ (task.toml, baseline/ with the upstream files, bench/, ...): everything a verdict
  is measured against. `task_pin` is the same digest of the task as the repository's HEAD commit holds it (the
  upstream files, never committed, as HEAD's task.toml [baseline.sha256] pins them), None where no commit holds
  the task; `task_changed` names each file where the two differ.
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
run's ledger line (kpremote/results/ledger.py), the two docs fetch writes, its own state; left out of the git state as well as
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


def _git(folder: Path, *args: str, stdin: bytes | None = None) -> bytes | None:
    """git's stdout in folder; None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True,
                              input=stdin, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: Path) -> dict[str, Any]:
    """Commit, dirty flag and hash of the uncommitted diff of folder; all None unless a repository tracks it."""
    unknown = {"git_commit": None, "git_dirty": None, "diff_sha256": None}
    tracked = _git(folder, "ls-files", "-z", "--", ".")
    if not tracked:  # no repository, or one that does not track this folder (say, copied into its untracked corner)
        return unknown
    ours = [f":(exclude){path}" for path in KPREMOTE_OUTPUT]
    status = _git(folder, "status", "--porcelain=v2", "--branch", "--", ".", *ours)
    diff = _git(folder, "diff", "HEAD", "--binary", "--", ".", *ours)
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


# ---------------------------------------------------------------- the task and its pin

UPSTREAM_DIR = "baseline/upstream"  # where [baseline.sha256]'s files lie (baselinedoc.UPSTREAM on the client)
NOT_THE_TASK = ("solution/", "docs/")  # the candidate, and notes that no run reads


def task_files(hashes: Mapping[str, str]) -> dict[str, str]:
    """{path: sha256} of the files a verdict is measured against: every file that counts but solution/ and docs/."""
    return {path: sha for path, sha in hashes.items() if not path.startswith(NOT_THE_TASK)}


def task_digest(hashes: Mapping[str, str]) -> str:
    return manifest_digest(task_files(hashes))


def committed_task(task_dir: Path) -> dict[str, str] | None:
    """{path: sha256} of the task as HEAD holds it, by the same rules as the folder's own files (walk_task, the
    folder's .kpremoteignore, task_files), with the upstream files HEAD's task.toml pins; None where no commit holds
    the task (no repository, no commit yet, a folder git does not track)."""
    files = _head_files(Path(task_dir))
    if not files:
        return None
    ignore = IgnoreRules.load(Path(task_dir) / IGNORE_FILE, [])
    kept = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items() if _counts(rel, ignore)}
    kept.update(_pinned_upstream(files.get("task.toml")))
    return task_files(kept)


def compare_to_pin(hashes: Mapping[str, str], committed: Mapping[str, str] | None) -> list[str]:
    """Each file where the task differs from its pin, with how ("bench/workloads.toml (changed)"); [] when it is the
    pinned one, or when there is no pin."""
    if committed is None:
        return []
    ours = task_files(hashes)
    changed = [f"{p} ({'changed' if p in committed else 'not committed'})" for p in sorted(ours)
               if ours[p] != committed.get(p)]
    return changed + [f"{p} (missing)" for p in sorted(set(committed) - set(ours))]


def _counts(rel: str, ignore: "IgnoreRules") -> bool:
    """Whether walk_task would yield this committed path: no part of it excluded or ignored."""
    parts = rel.split("/")
    prefixes = [("/".join(parts[:n]), n < len(parts)) for n in range(1, len(parts) + 1)]
    return not any(excluded(rel, is_dir) or ignore.matches(rel, is_dir) for rel, is_dir in prefixes)


def _head_files(folder: Path) -> dict[str, bytes]:
    """{path under folder: content} of every regular file HEAD holds there (links and submodules left out, as
    walk_task leaves them); {} where git cannot say."""
    entries = []
    for item in (_git(folder, "ls-tree", "-r", "-z", "HEAD", "--", ".") or b"").split(b"\0"):
        meta, _, path = item.partition(b"\t")
        fields = meta.split()
        if len(fields) == 3 and fields[1] == b"blob" and fields[0] in (b"100644", b"100755"):
            entries.append((path.decode("utf-8", "surrogateescape"), fields[2].decode()))
    if not entries:
        return {}
    out = _git(folder, "cat-file", "--batch", stdin="".join(f"{oid}\n" for _, oid in entries).encode()) or b""
    files, at = {}, 0
    for rel, _ in entries:  # each object as "<oid> blob <size>\n<content>\n", in the order asked
        header_end = out.find(b"\n", at)
        if header_end < 0:
            return {}
        size = int(out[at:header_end].split()[2])
        files[rel] = out[header_end + 1:header_end + 1 + size]
        at = header_end + 1 + size + 1
    return files


def _pinned_upstream(task_toml: bytes | None) -> dict[str, str]:
    """{baseline/upstream/<path>: sha256} as a task.toml's [baseline.sha256] pins them ({} where unreadable)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli where it is installed
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return {}
    try:
        table = tomllib.loads((task_toml or b"").decode("utf-8")).get("baseline", {}).get("sha256", {})
    except (ValueError, AttributeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {f"{UPSTREAM_DIR}/{path}": sha for path, sha in table.items() if isinstance(sha, str)}


# ---------------------------------------------------------------- the one provenance


def task_provenance(task_dir: Path, hashes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Git state, both sides' digests, and the task's digest and pin, of a task folder. hashes: {path: sha256} of its files when the caller has
    them already (the client's scan, through its hash cache); else they are walked and hashed here."""
    task_dir = Path(task_dir)
    hashes = hash_task(task_dir) if hashes is None else hashes
    committed = committed_task(task_dir)
    return {**git_state(task_dir), **{f"{side}_sha256": side_sha256(hashes, side) for side in SIDES},
            "task_digest": task_digest(hashes), "task_pin": manifest_digest(committed) if committed else None,
            "task_changed": compare_to_pin(hashes, committed)}


def task_pin_record(task_dir: Path, source: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a run measured against: the digest of its own copy of the task (task_files) and whether that is the
    pinned task — "pinned" (the pin the client read at HEAD, or the agent where no client synced), "edited" (a pin,
    and another task: `changed` names the files) or "unpinned" (no commit holds the task)."""
    digest = task_digest(hash_task(Path(task_dir)))
    source = source or {}
    pin = source.get("task_pin") if isinstance(source.get("task_pin"), str) else None
    state = "unpinned" if pin is None else "pinned" if pin == digest else "edited"
    changed = [str(c) for c in source.get("task_changed") or []] if state == "edited" else []
    if state == "edited" and not changed:
        changed = ["the host's copy of the task is not the one its client synced"]
    return {"digest": digest, "pin": pin, "state": state, "changed": changed}


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
