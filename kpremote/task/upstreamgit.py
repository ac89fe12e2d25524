"""An upstream repository's files at one commit, read out of git's object store: a ref resolved with `git ls-remote`
(a branch, a tag peeled to its commit, or a full SHA), that one commit fetched shallowly into a scratch repository,
and each file read as a blob, never checked out, so nothing from the upstream is ever run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

from ..errors import BaselineError

FULL_SHA = re.compile(r"[0-9a-fA-F]{40}")
LS_REMOTE_TIMEOUT_S = 60.0
FETCH_TIMEOUT_S = 600.0
LOCAL_GIT_TIMEOUT_S = 60.0


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


def commit_date(scratch: Path, commit: str) -> str | None:
    shown = git(["show", "-s", "--format=%cI", commit], cwd=scratch)
    return (shown.stdout.decode().strip() or None) if shown.returncode == 0 else None

