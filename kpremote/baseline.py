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
  `ensure_upstream` does so before `inv run` / `inv check` / `inv sync` when files are missing.

Everything is written into a staging folder under the task's `.kpremote/` (same filesystem, never synced) and moved
into place only once all of it is ready; a failure while moving puts back what was there.

Provenance lands in three places: `baseline/upstream/<path>` (the bytes), `docs/baseline_source.md` (a marked block,
so text a person wrote around it survives) and task.toml's `[baseline]` table (edited line by line; every other byte of
the file is kept, and the result is re-parsed to prove only the pinned keys changed).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from . import wheels
from .errors import KpremoteError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport, if installed
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

UPSTREAM = Path("baseline") / "upstream"
SOURCE_DOC = Path("docs") / "baseline_source.md"
STAGING_PARENT = ".kpremote"  # excluded from sync, on the task's filesystem so the final moves are renames
FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
LS_REMOTE_TIMEOUT_S = 60.0
FETCH_TIMEOUT_S = 600.0
LOCAL_GIT_TIMEOUT_S = 60.0
BLOCK_BEGIN = "<!-- kpremote:baseline begin (written by `inv baseline`; edit outside these markers) -->"
BLOCK_END = "<!-- kpremote:baseline end -->"
PINNED_KEYS = ("repo", "ref", "commit", "files")
GITIGNORE = Path("baseline") / ".gitignore"
UPSTREAM_IGNORE = "/upstream/"


class BaselineError(KpremoteError):
    """The baseline could not be pinned; nothing was written."""


class BaselineFile(BaseModel):
    path: str
    sha256: str
    size: int


class BaselinePin(BaseModel):
    repo: str
    ref: str
    commit: str
    resolved_at: str  # UTC, ISO 8601
    files: list[BaselineFile]
    source: str | None = None  # the local git snapshot the files were read from, when not the repo itself
    committed_at: str | None = None  # the commit's committer date, as git reports it




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

class ReleasePin(BaseModel):
    repo: str
    ref: str = "release"  # what task.toml [baseline] ref says for a release pin
    release: str          # "<distribution> <version>", e.g. "sglang 0.5.23"
    wheel: str            # the wheel's file name; its tags say which platform build pip chose
    wheel_sha256: str
    resolved_at: str      # UTC, ISO 8601: when pip resolved the release
    files: list[BaselineFile]


class Materialized(BaseModel):
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
    """Before a run, check or sync: baseline/upstream/ as [baseline.sha256] pins it. Missing files are materialized
    from the pinned wheel (the returned line says so); a file that differs is refused. None: nothing to do."""
    task_dir = Path(task_dir)
    wheel_name, _, digests = wheel_pin(task_dir)
    missing = []
    for path, want in sorted(digests.items()):
        local = task_dir / UPSTREAM / path
        if not local.is_file() or local.is_symlink():
            missing.append(path)
        elif wheels.file_sha256(local) != want:
            raise BaselineError(f"{local}: sha256 {wheels.file_sha256(local)} differs from task.toml "
                                f"[baseline.sha256] {want} — refused; restore it with: inv baseline --task "
                                f"{task_dir.name} --materialize")
    if not missing:
        return None
    if not wheel_name:
        raise BaselineError(f"{task_dir / UPSTREAM / missing[0]}: missing, and task.toml pins no wheel to re-create "
                            f"it from — pin the baseline again with inv baseline")
    done = materialize(task_dir)
    return (f"{task_dir}: baseline/upstream/ materialized from {done.wheel} ({done.files} file(s), sha256 as "
            f"task.toml pins them)")


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


def commit_date(scratch: Path, commit: str) -> str | None:
    shown = git(["show", "-s", "--format=%cI", commit], cwd=scratch)
    return (shown.stdout.decode().strip() or None) if shown.returncode == 0 else None


def read_task_toml(path: Path) -> str:
    if not path.is_file():
        raise BaselineError(f"{path}: missing — a task folder needs a task.toml (see docs/task-contract.md)")
    text = path.read_text(encoding="utf-8")
    parse_toml(text, path)
    return text


def parse_toml(text: str, path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise BaselineError("editing task.toml needs Python 3.11+ (tomllib) or the tomli package: pip install tomli")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BaselineError(f"{path}: not valid TOML: {exc}") from None


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


# ------------------------------------------------------------------------------------------------ git

def git(args: list[str], *, cwd: Path | None = None, timeout: float = LOCAL_GIT_TIMEOUT_S
        ) -> subprocess.CompletedProcess[bytes]:
    """One git command, as an argv list: no prompts (a private repo fails instead of waiting for a password),
    literal pathspecs, never the ext:: transport that runs commands."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_LITERAL_PATHSPECS": "1"}
    argv = ["git", "-c", "protocol.ext.allow=never", *args]
    try:
        # Its own session, so a timeout also ends the ssh / remote-https helpers that would keep the pipes open.
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise BaselineError("git is not installed (or not on PATH)") from None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BaselineError(f"git {args[0]} took longer than {timeout:.0f}s: {' '.join(args)}") from None
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def last_line(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("fatal:")]
    return (fatal or lines or ["no message"])[0]


def fetch_files(repo: str, ref: str, paths: list[str], scratch: Path) -> tuple[str, dict[str, bytes]]:
    """(commit, {path: bytes}) for ref of repo, fetched shallowly into scratch."""
    commit = ls_remote_commit(repo, ref)
    done = git(["init", "-q", str(scratch)])
    if done.returncode:
        raise BaselineError(f"git init {scratch} failed: {last_line(done.stderr)}")
    fetched = git(["fetch", "-q", "--no-tags", "--depth", "1", "--", repo, commit or ref], cwd=scratch,
                  timeout=FETCH_TIMEOUT_S)
    if fetched.returncode:
        what = f"commit {commit}" if commit else f"ref {ref!r} (not a branch, tag or 40-hex commit there)"
        raise BaselineError(f"could not fetch {what} from {repo}: {last_line(fetched.stderr)}")
    resolved = git(["rev-parse", "--verify", "-q", "FETCH_HEAD^{commit}"], cwd=scratch)
    if resolved.returncode:
        raise BaselineError(f"{ref!r} of {repo} does not name a commit")
    fetched_commit = resolved.stdout.decode().strip()
    if commit and fetched_commit != commit:
        raise BaselineError(f"{repo} served {fetched_commit} when asked for {commit}")
    return fetched_commit, read_blobs(scratch, fetched_commit, paths)


def ls_remote_commit(repo: str, ref: str) -> str | None:
    """The commit a branch or tag points to (a tag peeled to its commit), the SHA itself if ref is one, or None
    when the remote advertises no such name. An unreachable repository is an error here, before anything else."""
    names = ls_remote_names(ref)
    peeled = [f"{name}^{{}}" for name in names if name.startswith("refs/tags/")]  # not listed unless asked for
    listed = git(["ls-remote", "--", repo, *names, *peeled], timeout=LS_REMOTE_TIMEOUT_S)
    if listed.returncode:
        raise BaselineError(f"cannot reach repository {repo}: {last_line(listed.stderr)}")
    if FULL_SHA.fullmatch(ref):
        return ref.lower()
    advertised: dict[str, str] = {}
    for line in listed.stdout.decode("utf-8", "replace").splitlines():
        sha, _, name = line.partition("\t")
        advertised[name] = sha
    # A peeled tag (name^{}) is the commit an annotated tag points to; a lightweight tag has no peeled line.
    found = {name: advertised.get(f"{name}^{{}}", advertised.get(name)) for name in names if name in advertised}
    if len(found) > 1:
        raise BaselineError(f"{ref!r} is ambiguous in {repo}: {', '.join(found)} — pass the full ref name instead")
    return next(iter(found.values()), None)


def ls_remote_names(ref: str) -> list[str]:
    if FULL_SHA.fullmatch(ref):
        return ["HEAD"]  # only to prove the repository answers; a SHA needs no resolving
    if ref == "HEAD" or ref.startswith("refs/"):
        return [ref]
    return [f"refs/heads/{ref}", f"refs/tags/{ref}"]


def read_blobs(scratch: Path, commit: str, paths: list[str]) -> dict[str, bytes]:
    """The bytes of each path at commit, read from the object store; each must be a regular file there."""
    return {path: read_blob(scratch, commit, path) for path in paths}


def read_blob(scratch: Path, commit: str, path: str) -> bytes:
    # One ls-tree per path: given a folder and a file inside it together, ls-tree lists the file, not the folder.
    listed = git(["ls-tree", "-z", commit, "--", path], cwd=scratch)
    if listed.returncode:
        raise BaselineError(f"git ls-tree {commit} failed: {last_line(listed.stderr)}")
    entries = {}
    for record in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        meta, _, name = record.partition("\t")
        if record:
            entries[name] = meta.split()
    mode, kind, sha = entries.get(path, ("", "", ""))
    if not kind:
        raise BaselineError(f"{path} does not exist at commit {commit}")
    if kind != "blob" or mode not in ("100644", "100755"):
        what = {"tree": "a folder", "commit": "a submodule"}.get(kind, "a symlink" if mode == "120000" else kind)
        raise BaselineError(f"{path} is {what} at commit {commit}, not a file — list the files themselves")
    blob = git(["cat-file", "blob", sha], cwd=scratch)
    if blob.returncode:
        raise BaselineError(f"cannot read {path} at commit {commit}: {last_line(blob.stderr)}")
    return blob.stdout


# ------------------------------------------------------------------------------------------------ task.toml

HEADER = re.compile(r"\s*\[")
BASELINE_HEADER = re.compile(r"\s*\[\s*baseline\s*\]\s*(#.*)?")
KEY_LINE = re.compile(r"\s*([A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=")


def edit_baseline_table(text: str, values: dict[str, Any], path: Path) -> str:
    """text with [baseline]'s keys set to values: existing key lines replaced in place (a trailing comment kept),
    missing keys added after the table's last key, the table appended if absent; every other line untouched."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    header = next((i for i, line in enumerate(lines) if BASELINE_HEADER.fullmatch(line.rstrip("\r\n"))), None)
    if header is None:
        ending = "" if not lines or lines[-1].endswith("\n") else newline
        table = "".join(f"{key} = {toml_value(values[key])}{newline}" for key in values)
        edited = f"{text}{ending}{newline}[baseline]{newline}{table}"
    else:
        edited = "".join(edit_table_lines(lines, header, values, newline, path))
    check_only_pin_changed(text, edited, values, path)
    return edited


def edit_table_lines(lines: list[str], header: int, values: dict[str, Any], newline: str, path: Path) -> list[str]:
    spans = key_spans(lines, header, path)
    pending = dict(values)
    out = lines[: header + 1]
    cursor = header + 1
    last_key_end = header + 1
    insert_at = len(out)
    for key, start, end in spans:
        out.extend(lines[cursor:start])
        if key in pending:
            out.append(replaced_line(lines[start:end], key, pending.pop(key), newline))
        else:
            out.extend(lines[start:end])
        cursor = last_key_end = end
        insert_at = len(out)
    added = [f"{key} = {toml_value(value)}{newline}" for key, value in pending.items()]
    if added and insert_at > 0 and not out[insert_at - 1].endswith("\n"):
        out[insert_at - 1] += newline  # the table's last key was the file's unterminated last line
    out[insert_at:insert_at] = added
    out.extend(lines[last_key_end:])
    return out


def key_spans(lines: list[str], header: int, path: Path) -> list[tuple[str, int, int]]:
    """(key, first line, end line) of each key of the table after header; a value may span lines (an array, a
    multi-line string): it ends at the first line where the key = value text parses as TOML."""
    spans = []
    i = header + 1
    while i < len(lines):
        line = lines[i]
        if HEADER.match(line):
            break
        match = KEY_LINE.match(line)
        if not match:
            i += 1
            continue
        end = i + 1
        while not parses("".join(lines[i:end])):
            end += 1
            if end > len(lines):
                raise BaselineError(f"{path}: cannot find where [baseline] {match.group(1)} ends")
        spans.append((match.group(1).strip("\"'"), i, end))
        i = end
    return spans


def parses(text: str) -> bool:
    try:
        tomllib.loads(text)
        return True
    except tomllib.TOMLDecodeError:
        return False


def replaced_line(old: list[str], key: str, value: Any, newline: str) -> str:
    """key = value, keeping the old line's indentation and, for a one-line value, its trailing comment."""
    first = old[0]
    indent = first[: len(first) - len(first.lstrip())]
    comment = trailing_comment(first.rstrip("\r\n")) if len(old) == 1 else ""
    ending = newline if old[-1].endswith("\n") else ""
    return f"{indent}{key} = {toml_value(value)}{comment}{ending}"


def trailing_comment(line: str) -> str:
    """The '   # ...' after a one-line key = value (a '#' inside a string is not one)."""
    for hash_at in (i for i, ch in enumerate(line) if ch == "#"):
        before = line[:hash_at]
        if parses(before):
            return line[len(before.rstrip()):]
    return ""


def toml_value(value: Any) -> str:
    # A JSON string or list of strings is also a valid TOML basic string / array (check_only_pin_changed proves it).
    return json.dumps(value, ensure_ascii=False)


def check_only_pin_changed(old_text: str, new_text: str, values: dict[str, Any], path: Path) -> None:
    expected = copy.deepcopy(parse_toml(old_text, path))
    expected.setdefault("baseline", {}).update(values)
    try:
        actual = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:
        actual = {"error": str(exc)}
    if actual != expected:
        raise BaselineError(f"{path}: could not edit [baseline] safely; set it by hand to: "
                            + ", ".join(f"{k} = {toml_value(v)}" for k, v in values.items()))


SHA256_HEADER = re.compile(r"\s*\[\s*baseline\s*\.\s*sha256\s*\]\s*(#.*)?")


def edit_sha256_table(text: str, digests: dict[str, str], path: Path) -> str:
    """text with the [baseline.sha256] table's body replaced by digests (its header line and comment kept), or the
    table added right after [baseline]; re-parsed to prove nothing else changed."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    body = [f"{toml_value(rel)} = {toml_value(digest)}{newline}" for rel, digest in digests.items()]
    header = next((i for i, line in enumerate(lines) if SHA256_HEADER.fullmatch(line.rstrip("\r\n"))), None)
    if header is not None:
        end = next((i for i in range(header + 1, len(lines)) if HEADER.match(lines[i])), len(lines))
        while end > header + 1 and not lines[end - 1].strip():
            end -= 1  # keep the blank lines before the next table
        edited = lines[: header + 1] + body + lines[end:]
    else:
        start = next(i for i, line in enumerate(lines) if BASELINE_HEADER.fullmatch(line.rstrip("\r\n")))
        end = next((i for i in range(start + 1, len(lines)) if HEADER.match(lines[i])), len(lines))
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += newline
        table = [f"[baseline.sha256]        # each file as the wheel holds it; it lies at baseline/upstream/<path>"
                 f"{newline}", *body, newline]
        if end == len(lines):
            table = [newline, *table[:-1]]
        edited = lines[:end] + table + lines[end:]
    result = "".join(edited)
    expected = copy.deepcopy(parse_toml(text, path))
    expected.setdefault("baseline", {})["sha256"] = dict(digests)
    if parses(result) and tomllib.loads(result) == expected:
        return result
    raise BaselineError(f"{path}: could not edit [baseline.sha256] safely; set it by hand to: "
                        + ", ".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in digests.items()))


# ------------------------------------------------------------------------------------------------ docs

def render_source_block(pin: BaselinePin) -> str:
    rows = "\n".join(f"| `{f.path.replace('|', chr(92) + '|')}` | `{f.sha256}` | {f.size} |" for f in pin.files)
    return (f"{BLOCK_BEGIN}\n"
            "## Upstream baseline\n\n"
            f"- Repository: {pin.repo}\n"
            f"- Ref: `{pin.ref}`\n"
            f"- Commit: `{pin.commit}`\n"
            f"- Resolved at: {pin.resolved_at} (UTC)\n"
            + (f"- Commit date: {pin.committed_at}\n" if pin.committed_at else "")
            + (f"- Read from a local git snapshot of it: `{pin.source}` (the ref was resolved there)\n"
               if pin.source else "")
            + f"- Copied, byte for byte, into `{UPSTREAM.as_posix()}/` (same relative paths)\n\n"
            "| file | sha256 | bytes |\n"
            "|---|---|---|\n"
            f"{rows}\n"
            f"{BLOCK_END}\n")


def render_release_block(pin: ReleasePin) -> str:
    rows = "\n".join(f"| `{f.path.replace('|', chr(92) + '|')}` | `{f.sha256}` | {f.size} |" for f in pin.files)
    return (f"{BLOCK_BEGIN}\n"
            "## Upstream baseline\n\n"
            f"- Repository: {pin.repo}\n"
            f"- Release: {pin.release} (the release's wheel on PyPI; a wheel records no git commit)\n"
            f"- Wheel: `{pin.wheel}` (build tags `{wheels.Wheel(Path(pin.wheel), pin.wheel, '').tags}`)\n"
            f"- Wheel sha256: `{pin.wheel_sha256}`\n"
            f"- Resolved at: {pin.resolved_at} (UTC)\n"
            f"- Copied, byte for byte, from the wheel into `{UPSTREAM.as_posix()}/` (same paths as in the wheel). "
            "They are not committed (`baseline/.gitignore`): `inv baseline --task <task> --materialize`, and "
            "`inv run` / `inv check` / `inv sync` when they are missing, re-create them from the pinned wheel, and "
            "refuse any file whose sha256 differs from task.toml `[baseline.sha256]`; so does the agent.\n\n"
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


@contextlib.contextmanager
def staging_folder(task_dir: Path):
    """A scratch folder under the task's .kpremote/ (same filesystem: the final moves are renames), removed after."""
    staging_parent = task_dir / STAGING_PARENT
    staging_parent.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="baseline-", dir=staging_parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging_parent.rmdir()  # only if we made it and it is empty again
        except OSError:
            pass


def move_into_place(moves: list[tuple[Path, Path]], trash: Path) -> None:
    trash.mkdir()
    undo: list[tuple[Path, Path | None, list[Path]]] = []  # (final, its previous version, folders made for it)
    try:
        for index, (staged, final) in enumerate(moves):
            made = missing_parents(final)
            final.parent.mkdir(parents=True, exist_ok=True)
            previous = None
            if final.exists() or final.is_symlink():
                previous = trash / str(index)
                os.replace(final, previous)
            undo.append((final, previous, made))
            os.replace(staged, final)
    except BaseException:
        for final, previous, made in reversed(undo):
            if final.exists() and not final.is_symlink() and final.is_dir():
                shutil.rmtree(final)
            elif final.exists() or final.is_symlink():
                final.unlink()
            if previous is not None:
                os.replace(previous, final)
            for folder in made:
                folder.rmdir()
        raise


def missing_parents(path: Path) -> list[Path]:
    """The folders above path that do not exist yet, deepest first (so they can be removed in that order)."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing
