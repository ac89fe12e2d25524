"""`inv baseline` against a local upstream repository served by path."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kpremote.task import baseline, baselinedoc, staging
from kpremote.task.baseline import pin_baseline, split_file_list
from kpremote.task.baselinedoc import with_source_block
from kpremote.task.baselinetoml import edit_baseline_table
from kpremote.errors import BaselineError, KpremoteError

KERNEL = "python/pkg/kernel.py"
HELPER = "python/pkg/helper.py"

TASK_TOML = """\
[task]
name = "t"
arch = "h200"            # b200 | h200 | h100 | any
family = "fuse_scale_shift"

[baseline]               # provenance only; never executed
repo = "https://example.invalid/placeholder"
ref = "main"
commit = "unresolved"    # a 40-hex SHA once `inv baseline` resolved it
files = ["old/path.py"]
follows = "fuse_scale_shift_kernel in scale_shift.py"   # optional free text

[build]
kind = "triton"
flags = []
entry = "kernel"
"""


@dataclass
class Upstream:
    path: Path
    first: str   # tagged v1 (annotated) and v1-light (lightweight)
    second: str  # main


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    repo = tmp_path_factory.mktemp("upstream") / "sglang"
    (repo / "python" / "pkg").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / KERNEL).write_text("def kernel():\n    return 1\n")
    (repo / HELPER).write_text("HELPER = True\n")
    (repo / "run_me.sh").write_text("#!/bin/sh\necho upstream code ran > ran.txt\n")
    (repo / "run_me.sh").chmod(0o755)
    os.symlink("pkg/kernel.py", repo / "python" / "link.py")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "-a", "v1", "-m", "release 1")
    git(repo, "tag", "v1-light")
    (repo / KERNEL).write_text("def kernel():\n    return 2\n")
    git(repo, "commit", "-q", "-am", "second")
    second = git(repo, "rev-parse", "HEAD")
    (repo / KERNEL).write_text("uncommitted work in progress\n")  # never what gets copied
    return Upstream(repo, first, second)


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    task = tmp_path / "kernels" / "t"
    task.mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML)
    return task


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} | {
        p.relative_to(folder).as_posix() + "/": b"" for p in folder.rglob("*") if p.is_dir()}


def upstream_file(task: Path, rel: str) -> str:
    return (task / "baseline" / "upstream" / rel).read_text()


# ------------------------------------------------------------------------------------------------ resolving

def test_main_resolves_to_the_newest_commit_and_copies_its_content(upstream: Upstream, task_dir: Path) -> None:
    pin = pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, HELPER])
    assert pin.commit == upstream.second
    assert upstream_file(task_dir, KERNEL) == "def kernel():\n    return 2\n"  # the commit, not the working tree
    assert upstream_file(task_dir, HELPER) == "HELPER = True\n"
    copied = sorted(p.relative_to(task_dir).as_posix() for p in (task_dir / "baseline").rglob("*") if p.is_file())
    assert copied == [f"baseline/upstream/{HELPER}", f"baseline/upstream/{KERNEL}"]
    data = b"def kernel():\n    return 2\n"
    assert dataclasses.asdict(pin.files[0]) == {"path": KERNEL, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert not (task_dir / ".kpremote").exists()


@pytest.mark.parametrize("tag", ["v1", "v1-light"])
def test_a_tag_resolves_to_its_commit(upstream: Upstream, task_dir: Path, tag: str) -> None:
    pin = pin_baseline(task_dir, str(upstream.path), tag, [KERNEL])
    assert pin.commit == upstream.first  # an annotated tag is peeled to the commit, not the tag object
    assert upstream_file(task_dir, KERNEL) == "def kernel():\n    return 1\n"


def test_a_full_sha_is_fetched_directly(upstream: Upstream, task_dir: Path) -> None:
    pin = pin_baseline(task_dir, str(upstream.path), upstream.first.upper(), [KERNEL])
    assert pin.commit == upstream.first
    assert upstream_file(task_dir, KERNEL) == "def kernel():\n    return 1\n"


def test_a_ref_ls_remote_does_not_list_goes_through_a_fetch(upstream: Upstream, task_dir: Path) -> None:
    pin = pin_baseline(task_dir, str(upstream.path), "refs/tags/v1", [KERNEL])
    assert pin.commit == upstream.first
    with pytest.raises(BaselineError, match=r"could not fetch ref 'no-such-branch' .* from .*sglang"):
        pin_baseline(task_dir, str(upstream.path), "no-such-branch", [KERNEL], force=True)


def test_a_name_that_is_both_a_branch_and_a_tag_is_refused(tmp_path: Path, task_dir: Path) -> None:
    repo = tmp_path / "ambiguous"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f.py").write_text("x")
    git(repo, "add", "f.py")
    git(repo, "commit", "-q", "-m", "c")
    git(repo, "tag", "main")
    with pytest.raises(BaselineError, match="ambiguous.*refs/heads/main.*refs/tags/main"):
        pin_baseline(task_dir, str(repo), "main", ["f.py"])


# ------------------------------------------------------------------------------------------------ records

def test_writes_baseline_source_and_edits_only_the_pinned_keys(upstream: Upstream, task_dir: Path) -> None:
    pin = pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, HELPER])
    expected = TASK_TOML.replace('"https://example.invalid/placeholder"', f'"{upstream.path}"').replace(
        '"unresolved"', f'"{upstream.second}"').replace('["old/path.py"]', f'["{KERNEL}", "{HELPER}"]')
    assert (task_dir / "task.toml").read_text() == expected
    doc = (task_dir / "docs" / "baseline_source.md").read_text()
    for needed in (str(upstream.path), "`main`", upstream.second, pin.resolved_at, *(f.sha256 for f in pin.files),
                   f"| `{KERNEL}` | `{pin.files[0].sha256}` | {pin.files[0].size} |"):
        assert needed in doc
    assert pin.resolved_at.endswith("Z")


def test_refuses_to_replace_a_pin_without_force_and_replaces_it_with(upstream: Upstream, task_dir: Path) -> None:
    pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, HELPER])
    before = snapshot(task_dir)
    with pytest.raises(BaselineError, match=r"upstream/ exists \(2 files\).*commit = [0-9a-f]{40}.*--force"):
        pin_baseline(task_dir, str(upstream.path), "v1", [KERNEL])
    assert snapshot(task_dir) == before

    pin = pin_baseline(task_dir, str(upstream.path), "v1", [KERNEL], force=True)
    assert pin.commit == upstream.first
    assert upstream_file(task_dir, KERNEL) == "def kernel():\n    return 1\n"
    assert not (task_dir / "baseline" / "upstream" / HELPER).exists()  # the old pin's files do not linger
    assert f'commit = "{upstream.first}"' in (task_dir / "task.toml").read_text()
    assert (task_dir / "docs" / "baseline_source.md").read_text().count("## Upstream baseline") == 1


def test_a_sha_in_task_toml_alone_is_an_existing_pin(upstream: Upstream, task_dir: Path) -> None:
    toml = task_dir / "task.toml"
    toml.write_text(TASK_TOML.replace('"unresolved"', f'"{"a" * 40}"'))
    with pytest.raises(BaselineError, match=f"commit = {'a' * 40}"):
        pin_baseline(task_dir, str(upstream.path), "main", [KERNEL])
    (task_dir / "baseline" / "upstream").mkdir(parents=True)
    toml.write_text(TASK_TOML)
    with pytest.raises(BaselineError, match=r"upstream/ exists \(0 files\)"):
        pin_baseline(task_dir, str(upstream.path), "main", [KERNEL])


# ------------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("path, reason", [
    ("../etc/passwd", r"'\.\.'"), ("python/../../x.py", r"'\.\.'"), ("/etc/passwd", "absolute"),
    ("./python/pkg/kernel.py", "'.' path component"), ("python//pkg/kernel.py", "empty"), (".git/config", ".git"),
])
def test_refuses_paths_outside_the_repository(upstream: Upstream, task_dir: Path, path: str, reason: str) -> None:
    with pytest.raises(BaselineError, match=f"refused baseline file {re.escape(repr(path))}.*{reason}"):
        pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, path])
    assert snapshot(task_dir) == {"task.toml": TASK_TOML.encode()}


@pytest.mark.parametrize("path, what", [
    ("python/pkg/missing.py", "does not exist"), ("python/pkg", "is a folder"), ("python/link.py", "is a symlink"),
])
def test_refuses_what_is_not_a_file_at_that_commit(upstream: Upstream, task_dir: Path, path: str, what: str) -> None:
    with pytest.raises(BaselineError, match=f"{path} {what} at commit {upstream.second}"):
        pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, path])
    assert snapshot(task_dir) == {"task.toml": TASK_TOML.encode()}


def test_a_file_only_in_a_later_commit_is_missing_at_the_earlier_one(upstream: Upstream, task_dir: Path) -> None:
    with pytest.raises(BaselineError, match=f"does not exist at commit {upstream.first}"):
        pin_baseline(task_dir, str(upstream.path), "v1", ["python/pkg/missing.py"])


def test_an_unreachable_repository_is_one_line_naming_it(tmp_path: Path, task_dir: Path) -> None:
    url = str(tmp_path / "no-such-repo")
    with pytest.raises(BaselineError) as caught:
        pin_baseline(task_dir, url, "main", [KERNEL])
    assert str(caught.value).startswith(f"cannot reach repository {url}: ")
    assert "\n" not in str(caught.value)
    assert snapshot(task_dir) == {"task.toml": TASK_TOML.encode()}


def test_nothing_of_the_upstream_is_run_or_marked_executable(upstream: Upstream, task_dir: Path) -> None:
    assert git(upstream.path, "ls-tree", "HEAD", "run_me.sh").startswith("100755")
    pin_baseline(task_dir, str(upstream.path), "main", ["run_me.sh"])
    assert not (upstream.path / "ran.txt").exists() and not (task_dir / "ran.txt").exists()
    assert (task_dir / "baseline" / "upstream" / "run_me.sh").stat().st_mode & 0o111 == 0


def fail_once_moving_task_toml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last of the three moves into place fails (the undo's own moves then succeed)."""
    real_replace = os.replace
    failed = []

    def replace(src, dst):
        if Path(dst).name == "task.toml" and not failed:
            failed.append(dst)
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(staging.os, "replace", replace)


def test_a_failure_while_moving_into_place_restores_the_earlier_pin(upstream: Upstream, task_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pin_baseline(task_dir, str(upstream.path), "main", [KERNEL, HELPER])
    (task_dir / "docs" / "notes.md").write_text("mine")
    before = snapshot(task_dir)
    fail_once_moving_task_toml(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        pin_baseline(task_dir, str(upstream.path), "v1", [KERNEL], force=True)
    assert snapshot(task_dir) == before


def test_a_failure_on_a_fresh_task_leaves_no_new_folders(upstream: Upstream, task_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fail_once_moving_task_toml(monkeypatch)
    with pytest.raises(OSError):
        pin_baseline(task_dir, str(upstream.path), "main", [KERNEL])
    assert snapshot(task_dir) == {"task.toml": TASK_TOML.encode()}


# ------------------------------------------------------------------------------------------------ task.toml edits

PIN = {"repo": "https://github.com/o/r", "ref": "main", "commit": "c" * 40, "files": ["a.py", "b/c.py"]}


def test_a_multi_line_files_array_and_missing_keys_are_handled() -> None:
    text = ('[task]\nname = "t"\n\n[baseline]\nrepo = "x"  # where\nfiles = [\n  "old.py",  # one\n  "[x]",\n]\n'
            'follows = """\n[not a table]\n"""\n\n# trailing comment\n[build]\nkind = "triton"\n')
    edited = edit_baseline_table(text, PIN, Path("task.toml"))
    assert edited == (
        '[task]\nname = "t"\n\n[baseline]\nrepo = "https://github.com/o/r"  # where\n'
        'files = ["a.py", "b/c.py"]\nfollows = """\n[not a table]\n"""\n'
        f'ref = "main"\ncommit = "{"c" * 40}"\n\n# trailing comment\n[build]\nkind = "triton"\n')


def test_a_missing_table_is_appended_and_crlf_is_kept() -> None:
    text = '[task]\r\nname = "t"\r\n\r\n[baseline]\r\nrepo = "x"'
    assert edit_baseline_table(text, PIN, Path("t")) == (
        '[task]\r\nname = "t"\r\n\r\n[baseline]\r\nrepo = "https://github.com/o/r"\r\nref = "main"\r\n'
        f'commit = "{"c" * 40}"\r\nfiles = ["a.py", "b/c.py"]\r\n')
    assert edit_baseline_table('[task]\nname = "t"', PIN, Path("t")).startswith('[task]\nname = "t"\n\n[baseline]\n')


def test_a_value_toml_cannot_hold_as_written_is_refused_not_garbled() -> None:
    with pytest.raises(BaselineError, match="set it by hand"):
        edit_baseline_table('[baseline]\nrepo = "x"\n[baseline.extra]\n', {**PIN, "ref": "a\x7fb"}, Path("t"))


def test_the_source_block_replaces_itself_and_keeps_a_persons_text() -> None:
    def block(body: str) -> str:
        return f"{baselinedoc.BLOCK_BEGIN}\n{body}\n{baselinedoc.BLOCK_END}\n"

    first = with_source_block("# Notes\n\nWhy this kernel.", block("A"))
    assert first == "# Notes\n\nWhy this kernel.\n\n" + block("A")
    second = with_source_block(first + "\nAfter.\n", block("B"))
    assert second == "# Notes\n\nWhy this kernel.\n\n" + block("B") + "\nAfter.\n"
    assert with_source_block(None, block("C")) == "# Baseline source\n\n" + block("C")


def test_split_file_list() -> None:
    assert split_file_list(" a.py, b/c.py ,,") == ["a.py", "b/c.py"]


# ------------------------------------------------------------------------------------------------ a local snapshot

@pytest.fixture(scope="module")
def bare_snapshot(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git directory with no work tree, as a mirror tool brings a repository (refs/heads/main and tags)."""
    target = tmp_path_factory.mktemp("mirror") / "sglang.git"
    git(upstream.path.parent, "clone", "-q", "--bare", str(upstream.path), str(target))
    return target


def test_a_local_snapshot_is_read_while_the_public_url_is_recorded(bare_snapshot: Path, upstream: Upstream,
                                                                    task_dir: Path) -> None:
    public = "https://github.com/sgl-project/sglang"
    pin = pin_baseline(task_dir, public, "main", [KERNEL], source=str(bare_snapshot))
    assert (pin.repo, pin.commit, pin.source) == (public, upstream.second, str(bare_snapshot.resolve()))
    assert pin.committed_at and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", pin.committed_at)
    assert upstream_file(task_dir, KERNEL) == "def kernel():\n    return 2\n"
    toml = (task_dir / "task.toml").read_text()
    assert f'repo = "{public}"' in toml and f'commit = "{upstream.second}"' in toml
    doc = (task_dir / "docs" / "baseline_source.md").read_text()
    assert f"- Repository: {public}\n" in doc and f"- Read from a local git snapshot of it: `{pin.source}`" in doc
    assert f"- Commit date: {pin.committed_at}\n" in doc
    assert hashlib.sha256(b"def kernel():\n    return 2\n").hexdigest() in doc


def test_a_source_that_is_not_a_git_repository_is_one_line(tmp_path: Path, task_dir: Path) -> None:
    with pytest.raises(BaselineError, match=r"^--source .*/nowhere: no such folder — give a local git repository"):
        pin_baseline(task_dir, "https://github.com/sgl-project/sglang", "main", [KERNEL], source=str(tmp_path / "nowhere"))
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(BaselineError, match=r"^--source .*/plain: not a git repository"):
        pin_baseline(task_dir, "https://github.com/sgl-project/sglang", "main", [KERNEL], source=str(plain))
    assert not (task_dir / "baseline").exists() and "unresolved" in (task_dir / "task.toml").read_text()


def test_inv_baseline_takes_a_local_snapshot(bare_snapshot: Path, upstream: Upstream, tmp_path: Path) -> None:
    from rig import run_inv

    kernels = tmp_path / "kernels"
    task = kernels / "t"
    task.mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML)
    done = run_inv("baseline", "--task", "t", "--repo", "https://github.com/sgl-project/sglang",
                   "--files", KERNEL, "--source", str(bare_snapshot), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    pin = json.loads(done.stdout)
    assert (pin["commit"], pin["source"], pin["repo"]) == (upstream.second, str(bare_snapshot.resolve()),
                                                           "https://github.com/sgl-project/sglang")
    assert upstream_file(task, KERNEL) == "def kernel():\n    return 2\n"


# ------------------------------------------------------------------------------------------------ release wheels

WHEEL_KERNEL = "fakepkg/kernels/kern.py"
WHEEL_HELPER = "fakepkg/common/helper.py"
WHEEL_FILES = {WHEEL_KERNEL: b"def kern():\n    return 'upstream'\n", WHEEL_HELPER: b"HELPER = 1\n"}


def make_wheel(folder: Path, name: str = "fakepkg-1.0-py3-none-any.whl", files: dict[str, bytes] = WHEEL_FILES,
               link: bool = True) -> Path:
    """A tiny wheel: the listed files, a folder entry, and (link=True) a member that is a symlink."""
    import stat
    import zipfile

    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("fakepkg/", b"")
        for rel, data in files.items():
            archive.writestr(rel, data)
        if link:
            info = zipfile.ZipInfo("fakepkg/link.py")
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, WHEEL_KERNEL)
        archive.writestr("fakepkg-1.0.dist-info/METADATA", b"Name: fakepkg\nVersion: 1.0\n")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private kpremote cache, and a pip that cannot reach any index (nothing here needs the network)."""
    monkeypatch.setenv("KPREMOTE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    return tmp_path / "cache" / "wheels"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_release_pin_copies_the_files_and_records_every_sha256(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    import tomllib

    wheel = make_wheel(tmp_path)
    pin = baseline.pin_release(task_dir, str(wheel), [WHEEL_KERNEL, WHEEL_HELPER],
                               repo="https://example.invalid/fakepkg")
    assert (pin.release, pin.wheel, pin.wheel_sha256) == ("fakepkg 1.0", wheel.name, sha(wheel.read_bytes()))
    for rel, data in WHEEL_FILES.items():
        assert (task_dir / "baseline" / "upstream" / rel).read_bytes() == data
    assert (cache / wheel.name).read_bytes() == wheel.read_bytes()  # kept for later materializations
    toml_text = (task_dir / "task.toml").read_text()
    table = tomllib.loads(toml_text)["baseline"]
    assert table["sha256"] == {rel: sha(data) for rel, data in WHEEL_FILES.items()}
    assert (table["repo"], table["ref"], table["release"], table["wheel"], table["wheel_sha256"], table["files"]) == (
        "https://example.invalid/fakepkg", "release", "fakepkg 1.0", wheel.name, pin.wheel_sha256,
        [WHEEL_KERNEL, WHEEL_HELPER])
    assert 'follows = "fuse_scale_shift_kernel in scale_shift.py"   # optional free text' in toml_text
    assert toml_text.index("[baseline.sha256]") < toml_text.index("[build]")  # right after its table
    assert "/upstream/" in (task_dir / "baseline" / ".gitignore").read_text().split()
    doc = (task_dir / "docs" / "baseline_source.md").read_text()
    assert f"- Wheel sha256: `{pin.wheel_sha256}`" in doc and "- Release: fakepkg 1.0" in doc
    assert all(sha(data) in doc for data in WHEEL_FILES.values())
    assert not (task_dir / ".kpremote").exists()


def test_a_second_release_pin_replaces_the_sha256_table_only_with_force(task_dir: Path, cache: Path,
                                                                        tmp_path: Path) -> None:
    import tomllib

    wheel = make_wheel(tmp_path)
    baseline.pin_release(task_dir, str(wheel), [WHEEL_KERNEL, WHEEL_HELPER])
    with pytest.raises(BaselineError, match="already pinned.*wheel_sha256"):
        baseline.pin_release(task_dir, str(wheel), [WHEEL_KERNEL])
    baseline.pin_release(task_dir, str(wheel), [WHEEL_KERNEL], force=True)
    text = (task_dir / "task.toml").read_text()
    assert tomllib.loads(text)["baseline"]["sha256"] == {WHEEL_KERNEL: sha(WHEEL_FILES[WHEEL_KERNEL])}
    assert text.count("[baseline.sha256]") == 1
    assert not (task_dir / "baseline" / "upstream" / WHEEL_HELPER).exists()


@pytest.mark.parametrize(("path", "reason"), [
    ("../escape.py", "'..' would leave"), ("/etc/passwd", "absolute path"), ("fakepkg/./kernels/kern.py", "'.' path"),
    ("fakepkg/", "empty or '.'"), ("fakepkg/link.py", "not a regular file"), ("fakepkg/absent.py", "not in"),
])
def test_a_release_pin_refuses_paths_that_escape_or_are_not_files(task_dir: Path, cache: Path, tmp_path: Path,
                                                                   path: str, reason: str) -> None:
    before = snapshot(task_dir)
    with pytest.raises(KpremoteError, match=re.escape(reason)):
        baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [path])
    assert snapshot(task_dir) == before


def test_materialize_recreates_upstream_from_the_cached_wheel(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL, WHEEL_HELPER])
    upstream = task_dir / "baseline" / "upstream"
    shutil.rmtree(upstream)
    (tmp_path / make_wheel(tmp_path).name).unlink()  # only the cache has it now
    assert baseline.materialize(task_dir).files == 2
    assert {rel: (upstream / rel).read_bytes() for rel in WHEEL_FILES} == WHEEL_FILES


def test_ensure_upstream_materializes_missing_files_and_refuses_changed_ones(task_dir: Path, cache: Path,
                                                                             tmp_path: Path) -> None:
    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL, WHEEL_HELPER])
    local = task_dir / "baseline" / "upstream" / WHEEL_KERNEL
    assert baseline.ensure_upstream(task_dir) is None  # all there: nothing to do
    local.unlink()
    line = baseline.ensure_upstream(task_dir)
    assert line and "materialized from fakepkg-1.0-py3-none-any.whl (2 file(s)" in line
    assert local.read_bytes() == WHEEL_FILES[WHEEL_KERNEL]
    local.write_bytes(b"edited by hand\n")
    with pytest.raises(BaselineError, match=f"differs from {WHEEL_KERNEL} in fakepkg-1.0-py3-none-any.whl.*--materialize"):
        baseline.ensure_upstream(task_dir)
    assert local.read_bytes() == b"edited by hand\n"  # refused, never overwritten silently


def test_an_upstream_file_edited_with_its_sha256_in_task_toml_is_refused_by_the_wheels_bytes(
        task_dir: Path, cache: Path, tmp_path: Path) -> None:
    """Issue 43: an agent that edits a pinned upstream file and writes its new sha256 into task.toml is refused on
    every run: the pin is the wheel's own bytes (the wheel itself checked against task.toml's wheel_sha256)."""
    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL, WHEEL_HELPER])
    local = task_dir / "baseline" / "upstream" / WHEEL_KERNEL
    edited = WHEEL_FILES[WHEEL_KERNEL] + b"\ndef faster(): pass\n"
    local.write_bytes(edited)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace(sha(WHEEL_FILES[WHEEL_KERNEL]), sha(edited)))
    with pytest.raises(BaselineError, match=rf"\[baseline.sha256\] '{WHEEL_KERNEL}' is {sha(edited)}, but "
                                            r"fakepkg-1.0-py3-none-any.whl holds sha256"):
        baseline.ensure_upstream(task_dir)
    assert local.read_bytes() == edited  # refused, nothing rewritten


def test_a_wheel_whose_file_differs_from_the_pin_is_refused(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL])
    text = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(text.replace(sha(WHEEL_FILES[WHEEL_KERNEL]), "0" * 64))
    shutil.rmtree(task_dir / "baseline" / "upstream")
    with pytest.raises(BaselineError, match=f"{WHEEL_KERNEL} in fakepkg-1.0-py3-none-any.whl: sha256 .* differs"):
        baseline.materialize(task_dir)
    assert not (task_dir / "baseline" / "upstream").exists()


def test_a_cached_wheel_with_other_bytes_is_not_used(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL])
    make_wheel(cache, files={WHEEL_KERNEL: b"tampered\n"})  # same name, other bytes
    with pytest.raises(KpremoteError, match="cannot download fakepkg==1.0 with pip"):
        baseline.materialize(task_dir)


def test_the_pinned_tags_select_the_same_wheel_whatever_python_runs_pip() -> None:
    from kpremote.task import wheels

    fields = wheels.parse_name("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")
    assert wheels.tag_options(fields) == ["--implementation", "cp", "--python-version", "311", "--abi", "cp311",
                                          "--platform", "manylinux_2_34_x86_64"]
    assert wheels.tag_options(wheels.parse_name("x-1.0-py3-none-any.whl")) == []
    with pytest.raises(wheels.WheelError, match="not a wheel file name"):
        wheels.parse_name("x.tar.gz")


def test_inv_baseline_materialize_without_the_wheel_is_one_line_exit_2(task_dir: Path, cache: Path,
                                                                       tmp_path: Path) -> None:
    from rig import run_inv

    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL])
    shutil.rmtree(cache)
    shutil.rmtree(task_dir / "baseline" / "upstream")
    env = {"KPREMOTE_CACHE": str(cache.parent), "PIP_NO_INDEX": "1"}
    result = run_inv("baseline", "--task", "t", "--materialize", cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert "cannot download fakepkg==1.0 with pip" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_inv("check", "--task", "t", cwd=tmp_path, env=env)  # a run materializes first, and fails the same
    assert result.returncode == 2 and "cannot download fakepkg==1.0" in result.stderr
    assert "smoke" not in result.stdout  # nothing ran


def test_the_sync_carries_the_git_ignored_upstream_files(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    """baseline/.gitignore keeps them out of commits, not out of what `inv sync` sends (and the agent checks)."""
    from kpremote.agent.provenance import walk_task

    baseline.pin_release(task_dir, str(make_wheel(tmp_path)), [WHEEL_KERNEL, WHEEL_HELPER])
    warnings: list[str] = []
    synced = {rel for rel, _ in walk_task(task_dir, warnings)}
    assert {f"baseline/upstream/{rel}" for rel in WHEEL_FILES} <= synced and "baseline/.gitignore" in synced
    assert warnings == []


def test_inv_baseline_pypi_json_is_a_baseline_document(task_dir: Path, cache: Path, tmp_path: Path) -> None:
    import json

    import jsonschema
    from rig import REPO, run_inv

    env = {"KPREMOTE_CACHE": str(cache.parent), "PIP_NO_INDEX": "1"}
    result = run_inv("baseline", "--task", "t", "--pypi", str(make_wheel(tmp_path)), "--files", WHEEL_KERNEL, "--json",
                     cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    schema = json.loads((REPO / "docs" / "schemas" / "baseline.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    assert (document["schema"], document["task"], document["release"]) == ("kpremote.baseline/1", "t", "fakepkg 1.0")
    assert [f["path"] for f in document["files"]] == [WHEEL_KERNEL]


def test_inv_baseline_writes_the_digest_of_upstream_lines_with_each_pin_and_materialize(
        task_dir: Path, cache: Path, tmp_path: Path) -> None:
    """baseline/upstream_lines.sha256 (committed in place of the upstream files) follows the pin: written by a new
    --pypi pin and by --materialize, its header naming each pinned file's sha256 (tests/test_upstream_lines.py)."""
    from rig import run_inv

    from kpremote.task import upstreamlines

    env = {"KPREMOTE_CACHE": str(cache.parent), "PIP_NO_INDEX": "1"}
    result = run_inv("baseline", "--task", "t", "--pypi", str(make_wheel(tmp_path)), "--files", WHEEL_KERNEL,
                     cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    digest = task_dir / upstreamlines.DIGEST_FILE
    files, windows = upstreamlines.read_digest(digest)
    assert files == baseline.wheel_pin(task_dir)[2] and set(files) == {WHEEL_KERNEL}
    digest.unlink()
    result = run_inv("baseline", "--task", "t", "--materialize", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert upstreamlines.read_digest(digest) == (files, windows)
    assert "baseline/upstream_lines.sha256" in result.stdout
