"""`inv fetch-results`: summaries come home safely, raw/ never does, and nothing fetched is ever lost."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from kpremote.agent.run.records import seal_summary
from kpremote.hosts.agentclient import Agent
from kpremote.hosts.config import load_inventory, parse_inventory
from kpremote.hosts.connect import open_transport
from kpremote.errors import HostError
from kpremote.errors import FetchRefused, UnsafeArchive
from kpremote.runs.fetch import fetch_results, fetch_run
from kpremote.task.taskdir import find_task
from kpremote.transport import LocalTransport

TASK = "demo"
RUN_A = "20260101-120000-aaaaaa"
RUN_B = "20260102-120000-bbbbbb"
RUN_LIVE = "20260103-120000-cccccc"


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    (tmp_path / "kernels" / TASK / "docs").mkdir(parents=True)
    return tmp_path / "kernels"


def local_agent(tmp_path: Path, **entry: object) -> Agent:
    spec = {"transport": "local", "remote_root": str(tmp_path / "remote"), **entry}
    inventory = parse_inventory({"hosts": {"local": spec}}, tmp_path / "hosts.toml")
    return Agent(inventory.hosts["local"], LocalTransport("local"))


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    return local_agent(tmp_path)


def make_run(root: Path, run_id: str, status: str = "passed", results_md: str = "| row | speedup |\n",
             extra: dict[str, bytes] | None = None) -> Path:
    """A run as the runner leaves it: state.json, summary/ (fetched) and raw/ (stays)."""
    run_dir = Path(root) / "tasks" / TASK / "runs" / run_id
    files = {"summary/results.md": results_md.encode(), "summary/results.json": b'{"ok": true}',
             "summary/plots/speedup.png": b"\x89PNG", "raw/events.jsonl": b'{"event": "x"}\n', **(extra or {})}
    for rel, data in files.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_bytes(data)
    sealed = seal_summary(run_dir) if status != "running" else {}  # as the runner seals it (records.py)
    (run_dir / "state.json").write_text(json.dumps({"run_id": run_id, "task": TASK, "status": status,
                                                    "headline": "geomean 1.23x", **sealed}))
    return run_dir


def fetched(kernels: Path, run_id: str, host: str = "local") -> Path:
    return kernels / TASK / "results" / host / run_id


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_latest_brings_only_the_summary_and_updates_the_docs(agent, kernels):
    root = Path(agent.host.remote_root)
    make_run(root, RUN_A, results_md="old table\n")
    make_run(root, RUN_B, results_md="new table\n")
    make_run(root, RUN_LIVE, status="running")
    [report] = fetch_results(agent, TASK, "latest", kernels, "local")
    assert (report.run_id, report.outcome, report.run_status) == (RUN_B, "fetched", "passed")
    assert files_under(fetched(kernels, RUN_B)) == {"results.md": b"new table\n", "results.json": b'{"ok": true}',
                                                    "plots/speedup.png": b"\x89PNG"}
    assert not list((kernels / TASK / "results").rglob("raw")) and not list(kernels.rglob("events.jsonl"))
    results_md = (kernels / TASK / "docs" / "results.md").read_text()
    assert results_md.splitlines()[0].startswith(f"_Fetched from host `local`, run `{RUN_B}`")
    assert results_md.endswith("new table\n")
    assert f"results/local/{RUN_B}/" in (kernels / TASK / "docs" / "run_log.md").read_text()


def test_refetch_is_a_no_op_and_never_duplicates_the_log_line(agent, kernels):
    make_run(Path(agent.host.remote_root), RUN_A)
    fetch_results(agent, TASK, RUN_A, kernels, "local")
    docs = {p.name: p.read_text() for p in (kernels / TASK / "docs").iterdir()}
    [again] = fetch_results(agent, TASK, RUN_A, kernels, "local")
    assert again.outcome == "unchanged"
    assert {p.name: p.read_text() for p in (kernels / TASK / "docs").iterdir()} == docs
    assert docs["run_log.md"].count(f"results/local/{RUN_A}/") == 1


def test_all_fetches_every_finished_run_and_results_md_follows_the_newest(agent, kernels):
    root = Path(agent.host.remote_root)
    make_run(root, RUN_B, results_md="newest\n")
    fetch_results(agent, TASK, RUN_B, kernels, "local")
    make_run(root, RUN_A, status="failed", results_md="older\n")
    make_run(root, RUN_LIVE, status="running")
    reports = fetch_results(agent, TASK, "all", kernels, "local")
    assert [(r.run_id, r.outcome) for r in reports] == [(RUN_A, "fetched"), (RUN_B, "unchanged")]
    assert not fetched(kernels, RUN_LIVE).exists()
    assert (kernels / TASK / "docs" / "results.md").read_text().endswith("newest\n")  # an older run never wins
    log = (kernels / TASK / "docs" / "run_log.md").read_text()
    assert log.count(RUN_A) == 1 and log.count(RUN_B) == 1 and "failed" in log


def test_a_different_summary_already_fetched_is_kept_and_the_fetch_refused(agent, kernels):
    make_run(Path(agent.host.remote_root), RUN_A, results_md="from the host\n")
    mine = fetched(kernels, RUN_A)
    mine.mkdir(parents=True)
    (mine / "results.md").write_text("already here\n")
    with pytest.raises(FetchRefused, match="already holds a different summary"):
        fetch_results(agent, TASK, RUN_A, kernels, "local")
    assert files_under(mine) == {"results.md": b"already here\n"}
    assert not (kernels / TASK / "docs" / "run_log.md").exists()


def test_unfinished_or_unknown_runs_are_refused_clearly(agent, kernels):
    make_run(Path(agent.host.remote_root), RUN_LIVE, status="running")
    with pytest.raises(FetchRefused, match="is running; its summary is not final"):
        fetch_results(agent, TASK, RUN_LIVE, kernels, "local")
    with pytest.raises(FetchRefused, match="no finished run of demo to fetch .1 still running"):
        fetch_results(agent, TASK, "latest", kernels, "local")
    with pytest.raises(FetchRefused, match="no run 20991231-000000-000000"):
        fetch_results(agent, TASK, "20991231-000000-000000", kernels, "local")
    with pytest.raises(FetchRefused, match="invalid run id"):
        fetch_results(agent, TASK, "../x", kernels, "local")
    assert not (kernels / TASK / "results").exists()


def test_a_summary_over_the_size_cap_is_refused_while_reading(tmp_path, kernels):
    agent = local_agent(tmp_path, max_summary_mb=0.01)
    make_run(Path(agent.host.remote_root), RUN_A, extra={"summary/big.bin": b"x" * 50_000})
    with pytest.raises(FetchRefused, match="larger than 0.01 MB; stopped reading"):
        fetch_results(agent, TASK, RUN_A, kernels, "local")
    assert not (kernels / TASK / "results").exists()


SEALED = {"summary_sha256": "0" * 64, "summary_mac": "0" * 64}  # a state that says its runner sealed its summary


def evil_tar(*members: tuple[str, bytes, bytes, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        good = tarfile.TarInfo("results.md")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"ok\n"))
        for name, data, kind, linkname in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, linkname, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


@pytest.mark.parametrize("member, message", [
    (("../escape.txt", b"x", tarfile.REGTYPE, ""), "climbs out"),
    (("sub/../../escape.txt", b"x", tarfile.REGTYPE, ""), "climbs out"),
    (("/tmp/kpremote-escape.txt", b"x", tarfile.REGTYPE, ""), "absolute"),
    (("link", b"", tarfile.SYMTYPE, "/etc"), "link, device or fifo"),
    (("hard", b"", tarfile.LNKTYPE, "results.md"), "link, device or fifo"),
    (("dev", b"", tarfile.CHRTYPE, ""), "link, device or fifo"),
    (("fifo", b"", tarfile.FIFOTYPE, ""), "link, device or fifo"),
    (("raw/events.jsonl", b"x", tarfile.REGTYPE, ""), "never travels"),
    (("results.md/inner", b"x", tarfile.REGTYPE, ""), "which is a file"),
])
def test_a_hostile_summary_archive_is_refused_whole_and_nothing_is_written(tmp_path, kernels, member, message):
    archive = tmp_path / "evil.tar"
    archive.write_bytes(evil_tar(member))
    fake_python = tmp_path / "hostile-python"  # a host that answers every command with that archive
    fake_python.write_text(f"#!/bin/sh\ncat '{archive}'\n")
    fake_python.chmod(0o755)
    agent = local_agent(tmp_path, python=str(fake_python))
    with pytest.raises(UnsafeArchive, match=message):
        fetch_run(agent, find_task(kernels, TASK), {"run_id": RUN_A, "status": "passed", **SEALED}, "local")
    assert not (kernels / TASK / "results").exists()
    assert list((kernels / TASK / "docs").iterdir()) == []
    assert not (kernels / TASK / "escape.txt").exists() and not (kernels / "escape.txt").exists()
    assert not Path("/tmp/kpremote-escape.txt").exists()


def test_a_run_id_from_the_host_that_could_leave_results_is_refused(agent, kernels):
    with pytest.raises(HostError, match="unusable run id"):
        fetch_run(agent, find_task(kernels, TASK), {"run_id": "../../x", "status": "passed", **SEALED}, "local")
    assert not (kernels / TASK / "results").exists()


def test_over_ssh_latest_then_refetch(rig, tmp_path, kernels):
    host = rig.add_host("fetch-ssh")
    entry = load_inventory(rig.write_hosts_toml(tmp_path / "hosts.toml", [host], local=False)).hosts["fetch-ssh"]
    make_run(host.root, RUN_A, results_md="over ssh\n")
    transport = open_transport(entry)
    try:
        agent = Agent(entry, transport)
        [first] = fetch_results(agent, TASK, "latest", kernels, "fetch-ssh")
        [again] = fetch_results(agent, TASK, "latest", kernels, "fetch-ssh")
    finally:
        transport.close()
    assert (first.outcome, again.outcome) == ("fetched", "unchanged")
    assert set(files_under(fetched(kernels, RUN_A, "fetch-ssh"))) == {"results.md", "results.json",
                                                                      "plots/speedup.png"}
    assert (kernels / TASK / "docs" / "run_log.md").read_text().count(RUN_A) == 1


def test_a_summary_forged_on_the_host_after_its_run_is_refused_by_inv_fetch_results(tmp_path: Path) -> None:
    """Issue 43, as a later process of the same user would try it on main: delete summary_sha256 from state.json (the
    "old run" path took the forged results.json as it was), or rewrite the hash beside the forged file. Now each is
    one line naming the run and what did not verify, exit 2, and nothing lands; the honest run still fetches."""
    from localproject import kp, make_project

    project = make_project(tmp_path / "project")
    root = project / ".kpremote" / "local"  # the local host's remote root (config.local_remote_root)
    honest, deleted, rewritten = RUN_A, RUN_B, "20260104-120000-dddddd"
    for run_id in (honest, deleted, rewritten):
        make_run(root, run_id)
    forged = b'{"schema": "kpremote.results/1", "status": "passed", "headline": {"geomean": 2.5}}'
    for run_id in (deleted, rewritten):
        run_dir = root / "tasks" / TASK / "runs" / run_id
        (run_dir / "summary" / "results.json").write_bytes(forged)
        state = json.loads((run_dir / "state.json").read_text())
        if run_id == deleted:
            del state["summary_sha256"]
        else:
            state["summary_sha256"] = hashlib.sha256(forged).hexdigest()
        (run_dir / "state.json").write_text(json.dumps(state))
    results = project / "kernels" / TASK / "results" / "local"
    for run_id, why in ((deleted, "its runner recorded no summary hash"),
                        (rewritten, "the summary MAC in its state.json does not verify with this host's key")):
        done = kp(project, "fetch-results", "--host", "local", "--task", TASK, "--run", run_id)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and f"run {run_id}" in done.stderr and why in done.stderr
        assert not (results / run_id).exists()
    done = kp(project, "fetch-results", "--host", "local", "--task", TASK, "--run", honest)
    assert done.returncode == 0, done.stderr
    assert (results / honest / "results.json").read_bytes() == b'{"ok": true}'
    [line] = [json.loads(text) for text in (project / "kernels" / TASK / "ledger.jsonl").read_text().splitlines()]
    assert line["summary_sha256"] == hashlib.sha256(b'{"ok": true}').hexdigest() and len(line["mac"]) == 64
