"""The agent end of sync: hostile and broken streams fed straight to apply_sync_stream."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kpremote.agent.sync import NOT_A_FILE, SyncError, apply_sync_stream, manifest_digest

REPO = Path(__file__).resolve().parents[2]
TASK = "demo"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tuple:
    return name, data, kind, linkname


def stream(
    base: dict[str, str],
    changed: dict[str, bytes],
    deleted: tuple[str, ...] = (),
    *,
    members: list[tuple] | None = None,
    full: bool = False,
    new_digest: str | None = None,
) -> bytes:
    """A sync stream: header line + tar. `members` overrides the tar (hostile streams); `base` is the client's view."""
    new = {p: s for p, s in base.items() if p not in deleted}
    new.update({p: sha(d) for p, d in changed.items()})
    header = {
        "version": 1,
        "base_digest": manifest_digest(base),
        "new_digest": new_digest or manifest_digest(new),
        "changed": sorted(changed),
        "deleted": list(deleted),
        "sizes": {p: len(d) for p, d in changed.items()},
        "full": full,
        "provenance": {"git_commit": "abc"},
    }
    out = io.BytesIO()
    out.write(json.dumps(header).encode() + b"\n")
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, kind, linkname in members if members is not None else map(member, changed, changed.values()):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = linkname
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return out.getvalue()


def apply(root: Path, data: bytes) -> dict:
    return apply_sync_stream(root, TASK, io.BytesIO(data))


def workspace(root: Path) -> Path:
    return root / "tasks" / TASK / "workspace"


def tree(root: Path) -> dict[str, bytes]:
    ws = workspace(root)
    return {
        p.relative_to(ws).as_posix(): p.read_bytes()
        for p in ws.rglob("*")
        if p.is_file() and not p.is_symlink() and ".kpremote" not in p.parts
    }


def manifest(root: Path) -> dict:
    return json.loads((workspace(root) / ".kpremote" / "manifest.json").read_text())


def everything(folder: Path) -> dict[str, bytes | str]:
    """Every file and link under folder (the root, the task folder beside the workspace, and what lies above), so a
    write that escaped the workspace shows wherever it landed; a link by its target."""
    return {p.relative_to(folder).as_posix(): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in folder.rglob("*") if p.is_symlink() or p.is_file()}


@pytest.fixture
def synced(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A root whose workspace holds a.py and pkg/b.py, and the client's view of it."""
    root = tmp_path / "root"
    files = {"a.py": b"print('a')\n", "pkg/b.py": b"B = 1\n"}
    answer = apply(root, stream({}, files))
    assert answer["received_files"] == 2 and not answer["need_full"]
    return root, {p: sha(d) for p, d in files.items()}


def test_first_stream_builds_workspace_manifest_and_provenance(synced):
    root, view = synced
    assert tree(root) == {"a.py": b"print('a')\n", "pkg/b.py": b"B = 1\n"}
    assert {p: e["sha256"] for p, e in manifest(root).items()} == view
    provenance = json.loads((workspace(root) / ".kpremote" / "provenance.json").read_text())
    assert provenance["git_commit"] == "abc" and provenance["manifest_digest"] == manifest_digest(view)


def test_changes_and_deletions_apply_and_empty_folders_go(synced):
    root, view = synced
    answer = apply(root, stream(view, {"a.py": b"print('A')\n"}, ("pkg/b.py",)))
    assert answer["received_files"] == 1 and answer["deleted"] == 1
    assert tree(root) == {"a.py": b"print('A')\n"}
    assert not (workspace(root) / "pkg").exists()


def test_stale_base_answers_need_full_with_real_hashes_and_touches_nothing(synced):
    root, view = synced
    before = (tree(root), manifest(root))
    answer = apply(root, stream({"a.py": sha(b"something else")}, {"c.py": b"c"}))
    assert answer == {"need_full": True, "have": view}
    assert (tree(root), manifest(root)) == before


def test_without_manifest_the_files_themselves_are_the_base(synced, tmp_path):
    root, view = synced
    (workspace(root) / ".kpremote" / "manifest.json").unlink()  # as a sync killed while moving files leaves it
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (workspace(root) / "link").symlink_to(outside)
    answer = apply(root, stream(view, {}))
    assert answer["need_full"] and answer["have"] == {**view, "link": NOT_A_FILE}
    answer = apply(root, stream(answer["have"], {}, ("link",), full=True))
    assert not answer["need_full"] and not (workspace(root) / "link").is_symlink()
    assert outside.read_text() == "secret" and manifest(root)


@pytest.mark.parametrize("cut", ["header", "member_header", "member_data", "before_second"])
def test_cut_stream_leaves_previous_workspace_and_manifest(synced, cut):
    root, view = synced
    before = (tree(root), manifest(root))
    data = stream(view, {"a.py": b"x" * 3000, "z.py": b"z" * 3000}, ("pkg/b.py",))
    header_end = data.index(b"\n") + 1
    cut_at = {"header": header_end - 5, "member_header": header_end + 100, "member_data": header_end + 2000,
              "before_second": header_end + 512 * 2 + 3072}[cut]
    with pytest.raises(SyncError, match="nothing was applied"):
        apply(root, data[:cut_at])
    assert (tree(root), manifest(root)) == before
    assert not list((root / "tasks" / TASK).glob(".sync-staging-*"))


# {tmp}: this test's tmp_path, so an absolute path names a place the test watches (and no other run shares).
@pytest.mark.parametrize("bad_path", ["../escape.py", "{tmp}/abs.py", "a/../../escape.py", ".kpremote/manifest.json",
                                      "./a.py", "a//b.py"])
def test_header_naming_an_unsafe_path_is_refused(synced, bad_path, tmp_path):
    root, view = synced
    bad_path = bad_path.format(tmp=tmp_path)
    before = (tree(root), manifest(root), everything(tmp_path))
    with pytest.raises(SyncError, match="refused path"):
        apply(root, stream(view, {bad_path: b"evil"}))
    assert (tree(root), manifest(root), everything(tmp_path)) == before


@pytest.mark.parametrize("evil", [
    member("../escape.py", b"evil"),
    member("{tmp}/escape.py", b"evil"),
    member("a.py", kind=tarfile.SYMTYPE, linkname="/etc/passwd"),
    member("a.py", kind=tarfile.LNKTYPE, linkname="pkg/b.py"),
    member("a.py", kind=tarfile.CHRTYPE),
    member("a.py", kind=tarfile.FIFOTYPE),
    member("a.py", kind=tarfile.DIRTYPE),
])
def test_tar_members_that_are_links_devices_or_elsewhere_are_refused(synced, evil, tmp_path):
    root, view = synced
    evil = member(evil[0].format(tmp=tmp_path), *evil[1:])
    before = (tree(root), manifest(root), everything(tmp_path))
    with pytest.raises(SyncError, match="refused tar member"):
        apply(root, stream(view, {"a.py": b""}, members=[evil]))  # sizes agree: only the kind can refuse it
    assert (tree(root), manifest(root), everything(tmp_path)) == before


def test_a_failure_while_moving_files_leaves_no_manifest_claiming_the_old_tree(synced, monkeypatch):
    root, view = synced
    import kpremote.agent.sync as syncrecv

    real_replace, calls = os.replace, []

    def replace_then_fail(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(syncrecv.os, "replace", replace_then_fail)
    with pytest.raises(SyncError, match="No space left on device"):
        apply(root, stream(view, {"a.py": b"new a", "pkg/b.py": b"new b"}))
    monkeypatch.undo()
    assert tree(root)["a.py"] == b"new a"  # half applied on disk...
    answer = apply(root, stream(view, {}))  # ...so the old view is no longer trusted
    assert answer["need_full"] and answer["have"]["a.py"] == sha(b"new a")


def test_content_that_does_not_match_the_announced_tree_is_refused(synced):
    root, view = synced
    before = (tree(root), manifest(root))
    with pytest.raises(SyncError, match="do not give the tree"):
        apply(root, stream(view, {"a.py": b"new"}, new_digest="0" * 64))
    assert (tree(root), manifest(root)) == before


def test_links_planted_in_the_workspace_are_replaced_never_written_through(synced, tmp_path):
    root, view = synced
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("outside b")
    (outside / "keep.py").write_text("keep")
    ws = workspace(root)
    for path in (ws / "pkg").iterdir():
        path.unlink()
    (ws / "pkg").rmdir()
    (ws / "pkg").symlink_to(outside)  # someone replaced the folder with a link out of the workspace
    (ws / "a.py").unlink()
    (ws / "a.py").symlink_to(outside / "keep.py")
    apply(root, stream(view, {"a.py": b"new a", "pkg/b.py": b"new b"}))
    assert tree(root) == {"a.py": b"new a", "pkg/b.py": b"new b"}
    assert (outside / "b.py").read_text() == "outside b" and (outside / "keep.py").read_text() == "keep"


def test_a_file_sent_where_the_workspace_kept_a_folder_replaces_the_folder(synced):
    root, view = synced
    leftovers = workspace(root) / "c.py"
    (leftovers / "old").mkdir(parents=True)  # empty folders left where the client now has a file: no listing
    apply(root, stream(view, {"c.py": b"C = 3\n"}))  # names them, so only the rename can find them in the way
    assert tree(root) == {"a.py": b"print('a')\n", "pkg/b.py": b"B = 1\n", "c.py": b"C = 3\n"}


def test_deleting_under_a_linked_folder_never_deletes_outside(synced, tmp_path):
    root, view = synced
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("outside b")
    ws = workspace(root)
    (ws / "pkg" / "b.py").unlink()
    (ws / "pkg").rmdir()
    (ws / "pkg").symlink_to(outside)
    (ws / ".kpremote" / "manifest.json").unlink()
    have = apply(root, stream(view, {}))["have"]
    apply(root, stream(have, {}, tuple(p for p in have if p != "a.py"), full=True))
    assert (outside / "b.py").read_text() == "outside b"
    assert not (ws / "pkg").is_symlink()


def test_command_line_reports_a_broken_stream_as_one_json_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kpremote.agent.sync", "--task", TASK, "--root", str(tmp_path)],
        input=b'{"version": 1, "base_d', capture_output=True, cwd=REPO, timeout=60,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["message"].startswith("sync stream ended inside its header")
    assert b"Traceback" not in done.stderr


def test_task_names_that_could_leave_the_root_are_refused(tmp_path):
    for task in ("..", "a/b", "x y", ".", ""):
        with pytest.raises(SyncError, match="invalid task name"):
            apply_sync_stream(tmp_path, task, io.BytesIO(stream({}, {})))
    assert os.listdir(tmp_path) == []
