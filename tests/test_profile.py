"""`inv profile` and `inv fetch-results --raw-file` end to end: real SSH hosts, fixture GPUs, CPU smoke calls, and a
stand-in `ncu` (tests/fixtures/ncu/ncu) first on each host's PATH. Reports stay on the host, the summary comes back,
hashes are recorded, failures are one line and leave nothing that looks valid."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kpremote.agent.run import rawfiles
from kpremote.agent.run.records import seal_summary
from kpremote.agent.lease import BadRequest
from kpremote.agent.protocol import NotFound, NotTerminal
from rig import REPO, idle_gpu, run_inv

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
STAND_IN = REPO / "tests" / "fixtures" / "ncu"
WORKLOAD = "prod_r4_c64"
WRONG_CANDIDATE = '''
_right = rmsnorm


def rmsnorm(x, weight, out, eps):  # off by one everywhere: the gate must stop it before ncu
    _right(x, weight, out, eps)
    out.add_(1.0)
'''


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    kernels = tmp_path / "kernels"
    shutil.copytree(TINY, kernels / "tiny_rmsnorm")
    wrong = kernels / "wrong_rmsnorm"
    shutil.copytree(TINY, wrong)
    (wrong / "task.toml").write_text((wrong / "task.toml").read_text().replace('name = "tiny_rmsnorm"',
                                                                               'name = "wrong_rmsnorm"'))
    with open(wrong / "solution" / "kernel.py", "a") as f:
        f.write(WRONG_CANDIDATE)
    return tmp_path


def install_stand_in(host, mode: str = "ok") -> None:
    """The stand-in ncu and its sample CSV into the host's bin/ (first on its PATH), run by this interpreter."""
    script = (STAND_IN / "ncu").read_text().replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1)
    (host.bin_dir / "ncu").write_text(script)
    (host.bin_dir / "ncu").chmod(0o755)
    shutil.copy(STAND_IN / "raw.csv", host.bin_dir / "raw.csv")
    (host.bin_dir / "ncu.mode").write_text(mode + "\n")


def inv(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_inv(*args, cwd=workdir, env={"KPREMOTE_CACHE": str(workdir / ".cache")})


def profile(workdir: Path, hosts: Path, host: str, *extra: str, task: str = "tiny_rmsnorm") -> subprocess.CompletedProcess:
    return inv(workdir, "profile", "--hosts", str(hosts), "--host", host, "--task", task, "--workload", WORKLOAD,
               "--warmup", "1", "--calls", "2", *extra)


def run_dir_of(host, run_id: str, task: str = "tiny_rmsnorm") -> Path:
    return host.root / "tasks" / task / "runs" / run_id


def only_run(host, task: str = "tiny_rmsnorm") -> Path:
    [run] = sorted((host.root / "tasks" / task / "runs").glob("*"))[-1:]
    return run


def sha256(path: Path) -> str:
    return sha256_of(path.read_bytes())


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_profile_brings_the_summary_home_and_leaves_the_reports_on_the_host(rig, workdir):
    host = rig.add_host("profiler-a", gpus=[idle_gpu(0)])
    install_stand_in(host)
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    done = profile(workdir, hosts, "profiler-a", "--json")
    assert done.returncode == 0, done.stderr
    assert "profiler-a: tiny_rmsnorm: connecting" not in done.stderr  # --json: nothing said on the way
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "passed" and outcome["error"] is None

    summary = workdir / outcome["summary_dir"]
    assert {"profile.md", "profile.csv", "profile.json", "results.json"} <= {p.name for p in summary.iterdir()}
    assert not [p for p in summary.rglob("*") if p.suffix in (".ncu-rep", ".csv") and p.name != "profile.csv"]
    seen = [json.loads(line) for line in (host.bin_dir / "ncu.seen").read_text().splitlines()]
    assert seen and all(s["judges"] == [] for s in seen), seen  # the gate's judge ended before ncu ran
    remote = run_dir_of(host, outcome["run_id"])
    reports = {side: remote / "raw" / "ncu" / f"{side}-{WORKLOAD}.ncu-rep" for side in ("baseline", "candidate")}
    assert all(report.is_file() for report in reports.values())  # the heavy files stay where they were made

    profile_md = (summary / "profile.md").read_text()
    for side, report in reports.items():
        assert f"| {side} | `{report}` | {report.stat().st_size} | `{sha256(report)}` |" in profile_md
    rows = list(csv.DictReader(io.StringIO((summary / "profile.csv").read_text())))
    assert {(r["side"], r["kernel"]) for r in rows} == {(s, k) for s in reports for k in ("_rmsnorm_row", "_rmsnorm_rows")}
    assert {r["report_sha256"] for r in rows if r["side"] == "baseline"} == {sha256(reports["baseline"])}
    assert float(next(r for r in rows if r["kernel"] == "_rmsnorm_row")["duration_us"]) == pytest.approx(8.308)
    kernels = json.loads((summary / "profile.json").read_text())  # the same records, for agents
    assert kernels["schema"] == "kpremote.profile-kernels/1" and len(kernels["kernels"]) == len(rows)
    assert [(k["side"], k["kernel"], k["bound"]) for k in kernels["kernels"]] == \
        [(r["side"], r["kernel"], r["bound"]) for r in rows]
    assert next(k for k in kernels["kernels"] if k["kernel"] == "_rmsnorm_row")["duration_us"] == pytest.approx(8.308)
    roofline = profile_md.split("## Roofline", 1)[1]
    lines = [line for line in roofline.splitlines() if line.startswith(("- baseline `", "- candidate `"))]
    assert len(lines) == 4 and all("GB/s copy bandwidth" in line and "-bound**" in line for line in lines)
    assert "correctness gate: **PASSED**" in profile_md

    # what ncu was asked: clocks untouched, only the marked region, no kernel filter; the calls ran on the CPU
    ncu_asked = json.loads(reports["candidate"].read_text())
    pairs = list(zip(ncu_asked["argv"], ncu_asked["argv"][1:]))
    assert ("--clock-control", "none") in pairs and ("--profile-from-start", "off") in pairs
    assert "--kernel-name" not in ncu_asked["argv"]
    assert ncu_asked["env"]["TRITON_INTERPRET"] == "1"
    # the profiled process is sandboxed: it writes its record into the candidate's scratch folder
    call = json.loads((remote / "raw" / "scratch" / "candidate" / f"candidate-{WORKLOAD}.call.json").read_text())
    assert (call["warmup"], call["calls"]) == (1, 2)
    state = json.loads((remote / "state.json").read_text())
    assert state["status"] == "passed" and state["mode"].startswith("profile:")


def test_profile_failures_are_one_line_and_leave_nothing_that_looks_valid(rig, workdir):
    host = rig.add_host("profiler-b", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])

    # no ncu on the host: refused before any build, the lease given back (the next runs get the only GPU)
    missing = profile(workdir, hosts, "profiler-b")
    assert missing.returncode == 1
    assert "ncu (Nsight Compute) not found on this host" in missing.stderr
    said = [line.split(": ", 2)[2] for line in missing.stderr.splitlines() if line.startswith("profiler-b: tiny_rmsnorm: ")]
    assert said[:2] == ["connecting", said[1]] and said[1].startswith("syncing") and "starting" in said, said
    assert not (only_run(host) / "raw" / "build").exists()

    install_stand_in(host, mode="no-permission")
    denied = profile(workdir, hosts, "profiler-b", "--side", "baseline")
    assert denied.returncode == 1
    [line] = [line for line in denied.stderr.splitlines() if line.startswith("error:")]
    assert ("baseline: no permission to GPU performance counters: run with --cap-add=SYS_ADMIN or set "
            "NVreg_RestrictProfilingToAdminUsers=0") in line
    run = only_run(host)
    assert not list((run / "raw" / "ncu").glob("*.ncu-rep"))
    fetched = workdir / "kernels" / "tiny_rmsnorm" / "results" / "profiler-b" / run.name
    assert not fetched.exists()  # a failed profile stays on the host: nothing to mistake for a run at home

    # a kernel regex that matches nothing, detached: the error is in the run's record, fetched like any summary
    install_stand_in(host, mode="ok")
    detached = profile(workdir, hosts, "profiler-b", "--side", "candidate", "--kernel", "no_such_kernel", "--json",
                       "--detach")
    assert detached.returncode == 0, detached.stderr
    run_id = json.loads(detached.stdout)["run_id"]
    followed = inv(workdir, "logs", "--hosts", str(hosts), "--host", "profiler-b", "--run", run_id, "--follow")
    assert f"run {run_id}: error" in followed.stdout
    state = json.loads((run_dir_of(host, run_id) / "state.json").read_text())
    assert "the kernel regex 'no_such_kernel' matched no kernel" in state["message"]
    assert not list((run_dir_of(host, run_id) / "raw" / "ncu").glob("*.ncu-rep"))
    results = inv(workdir, "fetch-results", "--hosts", str(hosts), "--host", "profiler-b", "--task", "tiny_rmsnorm",
                  "--run", run_id, "--json")
    assert results.returncode == 0
    assert not (Path(json.loads(results.stdout)["fetched"][0]["path"]) / "profile.md").exists()
    compared = inv(workdir, "compare", "--task", "tiny_rmsnorm")  # its one timed row is no timing run to compare
    assert compared.returncode == 2 and f"{run_id}: a profile run, error" in compared.stderr, compared.stderr

    # a row that fails the correctness gate is never profiled
    wrong = profile(workdir, hosts, "profiler-b", task="wrong_rmsnorm")
    assert wrong.returncode == 1
    assert f"not profiled: workload {WORKLOAD} is INCORRECT" in wrong.stderr
    assert not (only_run(host, "wrong_rmsnorm") / "raw" / "ncu").exists()


def test_one_raw_file_comes_home_on_request_only(rig, workdir):
    host = rig.add_host("profiler-c", gpus=[idle_gpu(0)])
    hosts = rig.write_hosts_toml(workdir / "hosts.toml", [host])
    run_id = "20260101-000000-cccccc"
    remote = host.root / "tasks" / "tiny_rmsnorm" / "runs" / run_id
    for rel, data in {"summary/results.md": b"# results\n", "summary/results.json": b"{}",
                      "raw/ncu/baseline-w.ncu-rep": b"R" * 300, "raw/ncu/candidate-w.ncu-rep": b"C" * 300}.items():
        (remote / rel).parent.mkdir(parents=True, exist_ok=True)
        (remote / rel).write_bytes(data)
    (remote / "state.json").write_text(json.dumps({"run_id": run_id, "task": "tiny_rmsnorm", "status": "passed",
                                                   **seal_summary(remote)}))  # as its runner seals it

    def fetch(*args: str, hosts_file: Path = hosts) -> subprocess.CompletedProcess:
        return inv(workdir, "fetch-results", "--hosts", str(hosts_file), "--host", "profiler-c", "--task",
                   "tiny_rmsnorm", *args)

    summary = fetch("--json")
    assert summary.returncode == 0 and not list(Path(json.loads(summary.stdout)["fetched"][0]["path"]).rglob("*.ncu-rep"))

    # its size is shown first; it lands beside the summaries, hidden, checked against the host's sha256
    fetched = fetch("--run", run_id, "--raw-file", "ncu/baseline-w.ncu-rep")
    assert fetched.returncode == 0, fetched.stderr
    first = fetched.stdout.splitlines()[0]
    assert first.startswith("profiler-c: raw/ncu/baseline-w.ncu-rep: 300 bytes") and sha256_of(b"R" * 300) in first
    local = workdir / "kernels" / "tiny_rmsnorm" / "results" / "profiler-c" / ".raw" / run_id / "ncu" / "baseline-w.ncu-rep"
    assert local.read_bytes() == b"R" * 300
    again = fetch("--raw-file", "raw/ncu/baseline-w.ncu-rep", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["raw_file"]["outcome"] == "unchanged"
    summary_again = fetch("--run", run_id, "--json")  # the raw file beside it does not disturb the summary
    assert summary_again.returncode == 0 and json.loads(summary_again.stdout)["fetched"][0]["outcome"] == "unchanged"

    # over the host's max_summary_mb: refused unless --force; names that climb out: refused before any transfer
    small = rig.write_hosts_toml(workdir / "small.toml", [host], overrides={"profiler-c": {"max_summary_mb": 0.0001}})
    refused = fetch("--raw-file", "ncu/candidate-w.ncu-rep", hosts_file=small)
    assert refused.returncode == 2 and "over this host's max_summary_mb" in refused.stderr and "--force" in refused.stderr
    assert not (local.parent / "candidate-w.ncu-rep").exists()
    forced = fetch("--raw-file", "ncu/candidate-w.ncu-rep", "--force", hosts_file=small)
    assert forced.returncode == 0, forced.stderr
    assert (local.parent / "candidate-w.ncu-rep").read_bytes() == b"C" * 300
    for bad in ("../state.json", "ncu/../../state.json"):
        climbing = fetch("--raw-file", bad)
        assert climbing.returncode == 2 and "invalid raw file name '..'" in climbing.stderr
    missing = fetch("--raw-file", "ncu/nothing.ncu-rep")
    assert missing.returncode == 2 and "has no file raw/ncu/nothing.ncu-rep" in missing.stderr


# --------------------------------------------------------------------------------------------- agent: raw files


def make_run(root: Path, run_id: str, status: str = "passed") -> Path:
    run = root / "tasks" / "demo" / "runs" / run_id
    (run / "raw" / "ncu").mkdir(parents=True)
    (run / "raw" / "ncu" / "b.ncu-rep").write_bytes(b"report")
    (run / "state.json").write_text(json.dumps({"run_id": run_id, "status": status}))
    return run


def test_raw_files_are_served_only_by_safe_name_from_finished_runs(tmp_path: Path):
    run = make_run(tmp_path, "20260101-000000-aaaaaa")
    info = rawfiles.raw_file_stat(tmp_path, "demo", run.name, "raw/ncu/b.ncu-rep")
    assert info == {"name": "ncu/b.ncu-rep", "path": str(run / "raw" / "ncu" / "b.ncu-rep"), "bytes": 6,
                    "sha256": hashlib.sha256(b"report").hexdigest()}
    out = io.BytesIO()
    rawfiles.send_raw_file(tmp_path, "demo", run.name, "ncu/b.ncu-rep", out)
    assert out.getvalue() == b"report"
    for bad in ("../state.json", "ncu/../../state.json", "", "/etc/passwd"):
        with pytest.raises((BadRequest, NotFound)):
            rawfiles.raw_file_path(tmp_path, "demo", run.name, bad)
    (run / "raw" / "link").symlink_to(run / "state.json")
    with pytest.raises(BadRequest, match="is a link"):
        rawfiles.raw_file_path(tmp_path, "demo", run.name, "link")
    with pytest.raises(NotFound):
        rawfiles.raw_file_path(tmp_path, "demo", run.name, "ncu/missing.ncu-rep")
    live = make_run(tmp_path, "20260101-000000-bbbbbb", status="running")
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", live.name])  # alive, and ours
    try:
        (live / "state.json").write_text(json.dumps({"run_id": live.name, "status": "running", "pid": runner.pid}))
        with pytest.raises(NotTerminal):
            rawfiles.raw_file_path(tmp_path, "demo", live.name, "ncu/b.ncu-rep")
    finally:
        runner.kill()
        runner.wait()
