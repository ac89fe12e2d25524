"""`inv baseline`: pin a task's upstream baseline to one commit and copy exactly the listed files from it.

The ref is resolved with `git ls-remote` (a branch, a tag, or a full SHA given directly; anything else through a
shallow fetch), that one commit is fetched shallowly into a scratch repository, and the files are read out of git's
object store, never from a checkout, so nothing from the upstream is ever run. Everything is written into a staging
folder under the task's `.kpremote/` (same filesystem, never synced) and moved into place only once all of it is ready;
a failure while moving puts back what was there.

The upstream may also be read from a local git snapshot (`source`: a git directory or a checkout, e.g. what a
mirror tool brought): the ref is resolved there, and the public `repo` URL is what the pin records, with the snapshot
named as where the bytes were read.

Provenance lands in three places: `baseline/upstream/<path>` (the bytes), `docs/baseline_source.md` (a marked block,
so text a person wrote around it survives) and task.toml's `[baseline]` table (edited line by line; every other byte of
the file is kept, and the result is re-parsed to prove only repo/ref/commit/files changed).
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

def write_pin(task_dir: Path, contents: dict[str, bytes], doc: str, toml_text: str) -> None:
    """Stage upstream/, the doc and task.toml, then move each into place; a failure undoes the moves done so far."""
    staging_parent = task_dir / STAGING_PARENT
    staging_parent.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="baseline-", dir=staging_parent))
    try:
        upstream = staging / "upstream"
        for rel, data in contents.items():
            target = upstream / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)  # provenance, never executed
        (staging / "baseline_source.md").write_text(doc, encoding="utf-8")
        (staging / "task.toml").write_text(toml_text, encoding="utf-8", newline="")
        shutil.copymode(task_dir / "task.toml", staging / "task.toml")
        move_into_place([(upstream, task_dir / UPSTREAM), (staging / "baseline_source.md", task_dir / SOURCE_DOC),
                         (staging / "task.toml", task_dir / "task.toml")], staging / "replaced")
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
