"""`inv sync` end to end through the real agent: locally (LocalTransport) and over real OpenSSH on loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kpremote.hosts.agentclient import Agent
from kpremote.hosts.config import Host, load_inventory, parse_inventory
from kpremote.hosts.connect import open_transport
from kpremote.errors import ConfigError
from kpremote.runs.sync import build_sync_request, plan_sync, sync_task
from kpremote.task.taskdir import find_task
from kpremote.task.taskscan import HashCache, scan_task
from kpremote.transport import LocalTransport

TASK = "demo"
FILES = {
    "task.toml": "[task]\nname = 'demo'\n",
    "baseline/kernel.py": "def kernel(): return 'baseline'\n",
    "solution/kernel.py": "def kernel(): return 'solution'\n",
    "bench/adapter.py": "X = 1\n" * 2000,
    "docs/notes.md": "# notes\n",
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPREMOTE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        write(tmp_path / "kernels" / TASK / rel, text)
    return tmp_path / "kernels"


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    inventory = parse_inventory(
        {"hosts": {"local": {"transport": "local", "remote_root": str(tmp_path / "remote")}}}, tmp_path / "hosts.toml"
    )
    return Agent(inventory.hosts["local"], LocalTransport("local"))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def workspace(host: Host) -> Path:
    return Path(host.remote_root).expanduser() / "tasks" / TASK / "workspace"


def remote_tree(host: Host) -> dict[str, str]:
    ws = workspace(host)
    return {p.relative_to(ws).as_posix(): p.read_text() for p in sorted(ws.rglob("*"))
            if p.is_file() and ".kpremote" not in p.parts}


def local_tree(kernels: Path) -> dict[str, str]:
    return {p.relative_to(kernels / TASK).as_posix(): p.read_text() for p in sorted((kernels / TASK).rglob("*"))
            if p.is_file()}


def test_first_sync_sends_everything_and_a_repeat_sends_no_file_content(agent, kernels):
    first = sync_task(agent, find_task(kernels, TASK))
    assert first.files_sent == len(FILES) and remote_tree(agent.host) == FILES
    assert first.bytes_sent > sum(len(t) for t in FILES.values())
    again = sync_task(agent, find_task(kernels, TASK))
    assert (again.files_sent, again.deleted, again.channels, again.full) == (0, 0, 1, False)
    assert again.bytes_sent < 1000 and again.digest == first.digest


def test_one_changed_file_travels_alone_and_a_deleted_file_disappears(agent, kernels):
    sync_task(agent, find_task(kernels, TASK))
    write(kernels / TASK / "solution/kernel.py", "def kernel(): return 'faster'\n")
    (kernels / TASK / "docs/notes.md").unlink()
    report = sync_task(agent, find_task(kernels, TASK))
    assert (report.files_sent, report.deleted, report.channels) == (1, 1, 1)
    assert report.bytes_sent < 4000  # header + one small member, not the 12 kB adapter
    assert remote_tree(agent.host) == local_tree(kernels)
    assert not (workspace(agent.host) / "docs").exists()


def test_links_are_never_followed_and_excludes_and_kpremoteignore_apply(agent, kernels, tmp_path):
    task = kernels / TASK
    write(tmp_path / "secret" / "key.txt", "do not send")
    (task / "leak.txt").symlink_to(tmp_path / "secret" / "key.txt")
    (task / "leakdir").symlink_to(tmp_path / "secret")
    for rel in (".git/config", "bench/__pycache__/adapter.cpython-311.pyc", "bench/old.pyc", "results/h/1/r.md",
                ".kpremote/manifest.json", "run.log", "bench/deep/run.log", "build/x.o", "scratch.txt",
                "docs/scratch.txt", "data/big1.bin", "bench/results/kept.md"):
        write(task / rel, "excluded" if "kept" not in rel else "kept")
    write(task / ".kpremoteignore", "# comment\n*.log\nbuild/\n/scratch.txt\ndata/big*\n!run.log\n")
    report = sync_task(agent, find_task(kernels, TASK))
    synced = set(remote_tree(agent.host))
    assert synced == set(FILES) | {".kpremoteignore", "bench/results/kept.md", "docs/scratch.txt"}
    assert not any("do not send" in text for text in remote_tree(agent.host).values())
    assert any("leak.txt" in w for w in report.warnings) and any("leakdir" in w for w in report.warnings)
    assert any("'!run.log'" in w for w in report.warnings)


def test_a_workspace_changed_behind_our_back_takes_the_full_path_and_ends_correct(agent, kernels, tmp_path,
                                                                                monkeypatch):
    sync_task(agent, find_task(kernels, TASK))
    # another client (its own cache) syncs a different tree, and someone drops a stray file in the workspace
    other = tmp_path / "other-kernels"
    shutil.copytree(kernels, other)
    write(other / TASK / "solution/kernel.py", "other client\n")
    write(other / TASK / "extra.py", "only theirs\n")
    monkeypatch.setenv("KPREMOTE_CACHE", str(tmp_path / "other-cache"))
    sync_task(agent, find_task(other, TASK))
    write(workspace(agent.host) / "stray.txt", "stray")
    (workspace(agent.host) / ".kpremote" / "manifest.json").unlink()
    monkeypatch.setenv("KPREMOTE_CACHE", str(tmp_path / "cache"))
    write(kernels / TASK / "bench/adapter.py", "X = 2\n")
    report = sync_task(agent, find_task(kernels, TASK))
    assert report.full and report.channels == 2
    assert remote_tree(agent.host) == local_tree(kernels)
    assert report.files_sent == 2 and report.deleted == 2  # exactly the diff against what the host had
    assert sync_task(agent, find_task(kernels, TASK)).channels == 1


def test_a_cut_request_leaves_the_previous_workspace_and_manifest(agent, kernels):
    sync_task(agent, find_task(kernels, TASK))
    manifest = (workspace(agent.host) / ".kpremote" / "manifest.json").read_bytes()
    write(kernels / TASK / "solution/kernel.py", "new\n" * 500)
    request = build_sync_request(plan_sync(agent.host, scan_task(find_task(kernels, TASK))))
    result = agent.call("sync-apply", "--task", TASK, stdin=request[: len(request) - 1500])
    assert result.exit_code == 1 and b"nothing was applied" in result.stdout
    assert remote_tree(agent.host) == FILES
    assert (workspace(agent.host) / ".kpremote" / "manifest.json").read_bytes() == manifest
    assert sync_task(agent, find_task(kernels, TASK)).files_sent == 1  # the client did not record the failed sync


def test_provenance_names_commit_dirty_flag_diff_and_side_hashes(agent, kernels):
    git = ["git", "-C", str(kernels), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    sync_task(agent, find_task(kernels, TASK))
    clean = json.loads((workspace(agent.host) / ".kpremote" / "provenance.json").read_text())
    assert clean["git_commit"] == head and clean["git_dirty"] is False
    write(kernels / TASK / "solution/kernel.py", "def kernel(): return 'dirty'\n")
    sync_task(agent, find_task(kernels, TASK))
    dirty = json.loads((workspace(agent.host) / ".kpremote" / "provenance.json").read_text())
    assert dirty["git_dirty"] is True and dirty["diff_sha256"] != clean["diff_sha256"]
    assert dirty["solution_sha256"] != clean["solution_sha256"]
    assert dirty["baseline_sha256"] == clean["baseline_sha256"]
    assert dirty["synced_at"] and dirty["client_hostname"]


def test_outside_a_git_repo_the_git_fields_are_null(agent, kernels):
    sync_task(agent, find_task(kernels, TASK))
    stamp = json.loads((workspace(agent.host) / ".kpremote" / "provenance.json").read_text())
    assert (stamp["git_commit"], stamp["git_dirty"], stamp["diff_sha256"]) == (None, None, None)


def test_unchanged_files_are_not_hashed_again(kernels):
    task = kernels / TASK
    old = time.time() - 3600
    for path in task.rglob("*"):
        os.utime(path, (old, old))
    scan_task(find_task(kernels, TASK))
    assert HashCache(task).old  # the cache was written
    cache = HashCache(task)
    files = {rel: cache.local_file(task / rel, rel, (task / rel).lstat()) for rel in FILES}
    assert cache.hashed == 0
    write(task / "docs/notes.md", "# changed notes\n")
    cache = HashCache(task)
    changed = cache.local_file(task / "docs/notes.md", "docs/notes.md", (task / "docs/notes.md").lstat())
    assert cache.hashed == 1 and changed.sha256 != files["docs/notes.md"].sha256


@pytest.mark.parametrize("task, message", [("demi", "did you mean 'demo'"), ("../demo", "invalid task name"),
                                           ("de mo", "invalid task name"), ("..", "invalid task name")])
def test_unknown_or_unsafe_task_names_are_refused(agent, kernels, task, message):
    with pytest.raises(ConfigError, match=message):
        sync_task(agent, find_task(kernels, task))
    assert not (Path(agent.host.remote_root) / "tasks").exists()


def test_a_task_folder_that_is_a_link_is_refused(agent, kernels, tmp_path):
    shutil.move(kernels / TASK, tmp_path / "elsewhere")
    (kernels / TASK).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="unknown task"):
        sync_task(agent, find_task(kernels, TASK))


def test_over_ssh_incremental_sync_deletes_and_recovers(rig, tmp_path, kernels, monkeypatch):
    host = rig.add_host("sync-ssh")
    hosts_toml = rig.write_hosts_toml(tmp_path / "hosts.toml", [host], local=False)
    entry = load_inventory(hosts_toml).hosts["sync-ssh"]
    transport = open_transport(entry)
    try:
        agent = Agent(entry, transport)
        outside = tmp_path / "outside.txt"
        outside.write_text("never synced")
        (kernels / TASK / "link.txt").symlink_to(outside)
        first = sync_task(agent, find_task(kernels, TASK))
        assert first.files_sent == len(FILES) and remote_tree(entry) == FILES
        again = sync_task(agent, find_task(kernels, TASK))
        assert (again.files_sent, again.channels) == (0, 1) and again.bytes_sent < 1000
        write(kernels / TASK / "solution/kernel.py", "def kernel(): return 'v2'\n")
        (kernels / TASK / "docs/notes.md").unlink()
        changed = sync_task(agent, find_task(kernels, TASK))
        assert (changed.files_sent, changed.deleted) == (1, 1)
        expected = {k: v for k, v in local_tree(kernels).items() if k != "link.txt"}
        assert remote_tree(entry) == expected
        (workspace(entry) / ".kpremote" / "manifest.json").write_text("{}")  # behind the client's back
        recovered = sync_task(agent, find_task(kernels, TASK))
        assert recovered.full and remote_tree(entry) == expected
        assert (transport.channels.opened, agent.shipped) == (1 + 1 + 1 + 1 + 2 + 1, 1)  # +1: the ship
    finally:
        transport.close()
