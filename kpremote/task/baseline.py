"""`inv baseline`: pin a task's upstream baseline and copy exactly the listed files from it.

Two kinds of pin:
- a git commit (`--repo`, `--ref`, `--source`): the ref is resolved with `git ls-remote` (a branch, a tag, or a full
  SHA given directly; anything else through a shallow fetch), that one commit is fetched shallowly into a scratch
  repository, and the files are read out of git's object store, never from a checkout, so nothing from the upstream
  is ever run. The upstream may also be read from a local git snapshot (`source`: a git directory or a checkout):
  the ref is resolved there, and the public `repo` URL is what the pin records, with the snapshot named as where the
  bytes were read.
- a release wheel (`--pypi sglang==0.5.23`, or a path to a .whl): pip fetches the one wheel into kpremote's cache
  (wheels.py), the files are read out of the zip by name, and task.toml records the release, the wheel's name and
  sha256 and, in `[baseline.sha256]`, each file's sha256. Such files are not committed (baseline/.gitignore):
  `materialize` re-creates baseline/upstream/ from the pinned wheel, refusing any byte that differs, and
  `ensure_upstream`, before every `inv run` / `inv check` / `inv sync`, compares each file with the wheel's own bytes
  and materializes the missing ones.

Everything is written into a staging folder under the task's `.kpremote/` and moved into place only once all of it is
ready (staging.py). Provenance lands in three places: `baseline/upstream/<path>` (the bytes), `docs/baseline_source.md`
(baselinedoc.py) and task.toml's `[baseline]` table (baselinetoml.py). A commit's files are read by upstreamgit.py, a
wheel's by wheels.py.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from . import wheels
from ..agent.provenance import file_sha256
from .baselinedoc import (GITIGNORE, SOURCE_DOC, UPSTREAM, render_release_block, render_source_block,
                          with_source_block, with_upstream_ignored)
from .baselinetoml import edit_baseline_table, edit_sha256_table, parse_toml, read_task_toml
from ..errors import BaselineError
from .pins import BaselineFile, BaselinePin, ReleasePin
from .staging import move_into_place, staging_folder
from .taskdir import TaskDir
from .upstreamgit import FULL_SHA, commit_date, fetch_files, git, last_line


def pin_baseline(task_dir: Path, repo: str, ref: str, files: list[str], force: bool = False,
                 source: str | None = None) -> BaselinePin:
    """Resolve ref to a commit of repo (or of the local snapshot `source` of it), copy exactly `files` at that commit
    into baseline/upstream/, and record the pin in docs/baseline_source.md and task.toml [baseline]. Refuses to
    replace an earlier pin unless force."""
    task_dir = Path(task_dir)
    paths = checked_paths(files)
    repo = checked_repo(repo)
    source = checked_source(source)
    if not ref or ref.startswith("-"):
        raise BaselineError(f"invalid ref {ref!r}: give a branch, a tag or a 40-hex commit")
    toml_path = task_dir / "task.toml"
    toml_text = read_task_toml(toml_path)
    refuse_overwrite(task_dir, toml_text, force)
    with tempfile.TemporaryDirectory(prefix="kpremote-baseline-") as scratch:
        commit, contents = fetch_files(source or repo, ref, paths, Path(scratch))
        committed_at = commit_date(Path(scratch), commit)
    pin = BaselinePin(
        repo=repo, ref=ref, commit=commit, resolved_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        files=[BaselineFile(path=p, sha256=hashlib.sha256(contents[p]).hexdigest(), size=len(contents[p]))
               for p in paths],
        source=source, committed_at=committed_at,
    )
    new_toml = edit_baseline_table(toml_text, {"repo": repo, "ref": ref, "commit": commit, "files": paths},
                                   toml_path)
    doc_path = task_dir / SOURCE_DOC
    old_doc = doc_path.read_text(encoding="utf-8") if doc_path.is_file() else None
    write_pin(task_dir, contents, with_source_block(old_doc, render_source_block(pin)), new_toml)
    return pin


def split_file_list(text: str) -> list[str]:
    """The --files flag: comma-separated paths, blanks dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


# ------------------------------------------------------------------------------------------------ release wheels

@dataclass
class Materialized:
    wheel: str
    files: int


def pin_release(task_dir: Path, pypi: str, files: list[str], force: bool = False,
                repo: str | None = None) -> ReleasePin:
    """Pin `files` of a release wheel (`pypi`: sglang==0.5.23, or a .whl path) as the task's baseline: copy them into
    baseline/upstream/ (git-ignored), record the release, the wheel and every sha256 in task.toml and
    docs/baseline_source.md. Refuses to replace an earlier pin unless force."""
    task_dir = Path(task_dir)
    paths = checked_paths(files)
    toml_path = task_dir / "task.toml"
    toml_text = read_task_toml(toml_path)
    table = parse_toml(toml_text, toml_path).get("baseline")
    known_repo = table.get("repo") if isinstance(table, dict) else None
    if not repo and not isinstance(known_repo, str):
        raise BaselineError(f"{toml_path}: [baseline] has no repo — give --repo URL (the upstream's repository)")
    repo = checked_repo(repo or known_repo)
    refuse_overwrite(task_dir, toml_text, force)
    wheel = wheels.fetch_requirement(pypi)
    contents = wheels.read_members(wheel, paths)
    digests = {p: hashlib.sha256(contents[p]).hexdigest() for p in paths}
    pin = ReleasePin(repo=repo, release=wheel.release, wheel=wheel.name, wheel_sha256=wheel.sha256,
                     resolved_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     files=[BaselineFile(path=p, sha256=digests[p], size=len(contents[p])) for p in paths])
    values = {"repo": repo, "ref": "release", "commit": "unresolved", "release": pin.release, "wheel": pin.wheel,
              "wheel_sha256": pin.wheel_sha256, "files": paths}
    new_toml = edit_sha256_table(edit_baseline_table(toml_text, values, toml_path), digests, toml_path)
    doc_path = task_dir / SOURCE_DOC
    old_doc = doc_path.read_text(encoding="utf-8") if doc_path.is_file() else None
    write_pin(task_dir, contents, with_source_block(old_doc, render_release_block(pin)), new_toml,
              gitignore=with_upstream_ignored(task_dir / GITIGNORE))
    return pin


def wheel_pin(task_dir: Path) -> tuple[str | None, str | None, dict[str, str]]:
    """(wheel, wheel_sha256, {path: sha256}) as task.toml [baseline] records them; Nones and {} where absent."""
    toml_path = Path(task_dir) / "task.toml"
    table = parse_toml(read_task_toml(toml_path), toml_path).get("baseline")
    table = table if isinstance(table, dict) else {}
    digests = table.get("sha256", {})
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise BaselineError(f"{toml_path}: [baseline.sha256] must map each file to its sha256 (a string)")
    for path in digests:
        problem = path_problem(path)
        if problem:
            raise BaselineError(f"{toml_path}: [baseline.sha256] {path!r}: {problem}")
    wheel, wheel_sha256 = table.get("wheel"), table.get("wheel_sha256")
    return (wheel if isinstance(wheel, str) else None, wheel_sha256 if isinstance(wheel_sha256, str) else None,
            dict(digests))


def materialize(task_dir: Path) -> Materialized:
    """Re-create baseline/upstream/ from the pinned wheel (cache, else pip), every file's sha256 checked first."""
    task_dir = Path(task_dir)
    wheel_name, wheel_sha256, digests = wheel_pin(task_dir)
    if not (wheel_name and wheel_sha256 and digests):
        raise BaselineError(f"{task_dir / 'task.toml'}: [baseline] pins no wheel (wheel, wheel_sha256 and "
                            "[baseline.sha256]) — pin one with: inv baseline --task T --pypi DIST==VERSION --files ...")
    if (task_dir / UPSTREAM).is_symlink() or (task_dir / "baseline").is_symlink():
        raise BaselineError(f"{task_dir / UPSTREAM} is a symlink: refused (the baseline is written only inside the task)")
    wheel = wheels.obtain(wheel_name, wheel_sha256)
    contents = wheels.read_members(wheel, sorted(digests))
    for path, data in contents.items():
        got = hashlib.sha256(data).hexdigest()
        if got != digests[path]:
            raise BaselineError(f"{path} in {wheel_name}: sha256 {got} differs from task.toml [baseline.sha256] "
                                f"{digests[path]} — refused")
    write_upstream(task_dir, contents)
    return Materialized(wheel=wheel_name, files=len(contents))


def ensure_upstream(task_dir: Path) -> str | None:
    """Before a run, check or sync: baseline/upstream/ as the pinned wheel holds it. Every file is compared with the
    wheel's own bytes (the wheel from the cache, itself checked against task.toml's wheel_sha256), not only with
    task.toml's [baseline.sha256], which whoever edits a file can edit too; missing files are materialized (the
    returned line says so); a file that differs is refused. None: nothing to do. A pin with no wheel (a git commit)
    is checked against [baseline.sha256]."""
    task_dir = Path(task_dir)
    wheel_name, wheel_sha256, digests = wheel_pin(task_dir)
    missing = [path for path in sorted(digests) if not _is_plain_file(task_dir / UPSTREAM / path)]
    if wheel_name and wheel_sha256 and digests:
        _refuse_unlike_the_wheel(task_dir, wheel_name, wheel_sha256, digests, set(missing))
    else:
        _refuse_unlike_the_toml(task_dir, digests, set(missing))
    if not missing:
        return None
    if not wheel_name:
        raise BaselineError(f"{task_dir / UPSTREAM / missing[0]}: missing, and task.toml pins no wheel to re-create "
                            f"it from — pin the baseline again with inv baseline")
    done = materialize(task_dir)
    return (f"{task_dir}: baseline/upstream/ materialized from {done.wheel} ({done.files} file(s), sha256 as "
            f"task.toml pins them)")


def _is_plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _refuse_unlike_the_wheel(task_dir: Path, wheel_name: str, wheel_sha256: str, digests: dict[str, str],
                             missing: set[str]) -> None:
    wheel = wheels.obtain(wheel_name, wheel_sha256)
    contents = wheels.read_members(wheel, sorted(digests))
    for path in sorted(digests):
        got = hashlib.sha256(contents[path]).hexdigest()
        if got != digests[path]:
            raise BaselineError(f"{task_dir / 'task.toml'}: [baseline.sha256] {path!r} is {digests[path]}, but "
                                f"{wheel_name} holds sha256 {got} — refused: the upstream pin is the wheel's bytes")
        local = task_dir / UPSTREAM / path
        if path not in missing and local.read_bytes() != contents[path]:
            raise BaselineError(f"{local}: differs from {path} in {wheel_name} — refused; restore it with: "
                                f"inv baseline --task {task_dir.name} --materialize")


def _refuse_unlike_the_toml(task_dir: Path, digests: dict[str, str], missing: set[str]) -> None:
    for path, want in sorted(digests.items()):
        local = task_dir / UPSTREAM / path
        if path not in missing and file_sha256(local) != want:
            raise BaselineError(f"{local}: sha256 {file_sha256(local)} differs from task.toml "
                                f"[baseline.sha256] {want} — refused; restore it with: inv baseline --task "
                                f"{task_dir.name} --materialize")


def ensure_task_upstreams(tasks: Iterable[TaskDir]) -> Iterator[str]:
    """ensure_upstream for each task of a sync, run or check, a line for each task it materialized. A task.toml that
    is not TOML is left to the task checks that follow (one line each)."""
    for task in tasks:
        if _is_toml(task.toml):
            line = ensure_upstream(task.path)
            if line:
                yield line


def _is_toml(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        parse_toml(path.read_text(encoding="utf-8"), path)
    except (BaselineError, UnicodeDecodeError):
        return False
    return True


# ------------------------------------------------------------------------------------------------ checking inputs

def checked_paths(files: list[str]) -> list[str]:
    """Repository-relative POSIX paths, each naming something inside the repository and the upstream/ folder."""
    if not files:
        raise BaselineError("no files given: --files takes comma-separated paths relative to the repository root")
    for path in files:
        problem = path_problem(path)
        if problem:
            raise BaselineError(f"refused baseline file {path!r}: {problem}")
    duplicates = sorted({p for p in files if files.count(p) > 1})
    if duplicates:
        raise BaselineError(f"baseline file listed twice: {', '.join(map(repr, duplicates))}")
    return list(files)


def path_problem(path: str) -> str | None:
    if not path:
        return "empty path"
    if "\0" in path or "\\" in path:
        return "NUL or backslash in the path"
    if path.startswith("/"):
        return "absolute path — give it relative to the repository root"
    parts = path.split("/")
    if ".." in parts:
        return "'..' would leave the repository"
    if "" in parts or "." in parts:
        return "empty or '.' path component — write it like python/pkg/kernel.py"
    if ".git" in parts:
        return "'.git' is not part of a commit's files"
    return None


def checked_repo(repo: str) -> str:
    # A leading '-' would be read by git as an option.
    if not repo or repo.startswith("-"):
        raise BaselineError(f"invalid repository URL {repo!r}")
    return repo


def checked_source(source: str | None) -> str | None:
    """A local git snapshot: an existing folder that git recognises as a repository (bare or with a work tree)."""
    if source is None:
        return None
    path = Path(source).expanduser()
    if not path.is_dir():
        raise BaselineError(f"--source {source}: no such folder — give a local git repository (a .git folder or a checkout)")
    inside = git(["rev-parse", "--git-dir"], cwd=path)
    if inside.returncode:
        raise BaselineError(f"--source {source}: not a git repository ({last_line(inside.stderr)})")
    return str(path.resolve())


def refuse_overwrite(task_dir: Path, toml_text: str, force: bool) -> None:
    """An earlier pin (files in upstream/ or a SHA in task.toml) is only replaced on purpose."""
    for folder in (task_dir / "baseline", task_dir / "docs", task_dir / UPSTREAM):
        if folder.is_symlink():
            raise BaselineError(f"{folder} is a symlink: refused (the baseline is written only inside the task)")
    if force:
        return
    upstream = task_dir / UPSTREAM
    existing: list[str] = []
    if upstream.exists():
        count = sum(1 for p in upstream.rglob("*") if p.is_file())
        existing.append(f"{upstream}/ exists ({count} file{'s' if count != 1 else ''})")
    table = parse_toml(toml_text, task_dir / "task.toml").get("baseline")
    commit = table.get("commit") if isinstance(table, dict) else None
    if isinstance(commit, str) and FULL_SHA.fullmatch(commit):
        existing.append(f"{task_dir / 'task.toml'} [baseline] commit = {commit}")
    wheel_sha256 = table.get("wheel_sha256") if isinstance(table, dict) else None
    if isinstance(wheel_sha256, str) and wheel_sha256:
        existing.append(f"{task_dir / 'task.toml'} [baseline] wheel_sha256 = {wheel_sha256}")
    if existing:
        raise BaselineError(f"the baseline is already pinned: {'; '.join(existing)} — "
                            "rerun with --force to replace them with the new pin")


# ------------------------------------------------------------------------------------------------ writing

def write_pin(task_dir: Path, contents: dict[str, bytes], doc: str, toml_text: str,
              gitignore: str | None = None) -> None:
    """Stage upstream/, the doc and task.toml (and baseline/.gitignore when given), then move each into place; a
    failure undoes the moves done so far."""
    with staging_folder(task_dir) as staging:
        upstream = stage_upstream(staging, contents)
        (staging / "baseline_source.md").write_text(doc, encoding="utf-8")
        (staging / "task.toml").write_text(toml_text, encoding="utf-8", newline="")
        shutil.copymode(task_dir / "task.toml", staging / "task.toml")
        moves = [(upstream, task_dir / UPSTREAM), (staging / "baseline_source.md", task_dir / SOURCE_DOC),
                 (staging / "task.toml", task_dir / "task.toml")]
        if gitignore is not None:
            (staging / "gitignore").write_text(gitignore, encoding="utf-8")
            moves.append((staging / "gitignore", task_dir / GITIGNORE))
        move_into_place(moves, staging / "replaced")


def write_upstream(task_dir: Path, contents: dict[str, bytes]) -> None:
    """baseline/upstream/ replaced, as one move, by exactly these files."""
    with staging_folder(task_dir) as staging:
        move_into_place([(stage_upstream(staging, contents), task_dir / UPSTREAM)], staging / "replaced")


def stage_upstream(staging: Path, contents: dict[str, bytes]) -> Path:
    upstream = staging / "upstream"
    upstream.mkdir()
    for rel, data in contents.items():
        target = upstream / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o644)  # provenance, never executed
    return upstream

