"""Reliability, tried for real: concurrency, connection faults, remote faults, cancellation, nothing lost.

Real OpenSSH servers (tests/rig.py), the real `inv` command line in subprocesses, CPU smoke runs of the tiny task
(one small workload), fixture GPUs. A host that must vanish lives in network namespaces of our own, joined to the
client's namespace by a veth pair that the test takes down. docs/reliability.md lists each scenario, what happened
and the test that shows it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from kpremote.agent.lease import holders
from kpremote.agent.procfs import descendants
from kpremote.agent.run.runstate import TERMINAL
from kpremote.hosts.agentclient import Agent
from kpremote.hosts.config import parse_inventory
from kpremote.runs.remote import HEARTBEAT_GRACE_S
from kpremote.runs.sync import build_sync_request, plan_sync, sync_task
from kpremote.task.taskdir import find_task
from kpremote.task.taskscan import scan_task
from kpremote.transport import LocalTransport
from rig import REPO, SSHD, SshHost, idle_gpu
from waiting import alive, processes_mentioning, state_of, wait_for

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
SMALL = "grid_r1_c33"  # the tiny task's smallest workload: one row of 33 columns
CUT_HOST_CONNECT_TIMEOUT = 3  # seconds: the hosts.toml connect_timeout of the host whose link is cut
GATED_CANDIDATE = '''
import os as _os
import time as _time

_fast_rmsnorm = rmsnorm


def rmsnorm(*args, **kwargs):  # held at a gate the test opens: runs stay in flight exactly as long as it needs
    while _os.path.exists(GATE):
        _time.sleep(0.05)
    return _fast_rmsnorm(*args, **kwargs)
'''


# ------------------------------------------------------------------------------------------ the user's side


@dataclass
class Workdir:
    """A checkout-like folder: kernels/ holds the tiny task and `gated`, its twin whose candidate waits at a gate."""

    path: Path
    gate: Path

    @classmethod
    def make(cls, base: Path) -> "Workdir":
        kernels = base / "kernels"
        shutil.copytree(TINY, kernels / "tiny_rmsnorm")
        gated = kernels / "gated"
        shutil.copytree(TINY, gated)
        toml = gated / "task.toml"
        toml.write_text(toml.read_text().replace('name = "tiny_rmsnorm"', 'name = "gated"'))
        with open(gated / "solution" / "kernel.py", "a") as f:
            f.write(f"\nGATE = {str(base / 'gate')!r}\n{GATED_CANDIDATE}")
        return cls(base, base / "gate")

    def close_gate(self) -> None:
        self.gate.write_text("closed")

    def open_gate(self) -> None:
        self.gate.unlink(missing_ok=True)

    def command(self, *args: str, netns: Optional[str] = None) -> list[str]:
        argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args]
        return ["ip", "netns", "exec", netns, *argv] if netns else argv

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KPREMOTE_CACHE": str(self.path / ".cache"), "NO_COLOR": "1", "COLUMNS": "200"}

    def inv(self, *args: str, netns: Optional[str] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args, netns=netns), cwd=self.path, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def inv_background(self, *args: str, netns: Optional[str] = None) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args, netns=netns), cwd=self.path, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def fetched(self, task: str, host: str, run_id: str) -> Path:
        return self.path / "kernels" / task / "results" / host / run_id


@pytest.fixture
def work(tmp_path: Path) -> Workdir:
    return Workdir.make(tmp_path)


# ------------------------------------------------------------------------------------------ the host's side


def run_dirs(root: Path, task: str) -> list[Path]:
    """Runs that have a state.json (a start still waiting for a GPU has a folder but no state yet)."""
    return sorted(p for p in (Path(root) / "tasks" / task / "runs").glob("*") if (p / "state.json").is_file())


def blocked_at_gate(root: Path, task: str) -> list[Path]:
    return [d for d in run_dirs(root, task) if state_of(d).get("phase") == "workload"]


def all_over(root: Path, task: str, count: int) -> list[Path]:
    runs = run_dirs(root, task)
    return runs if len(runs) == count and all(state_of(d).get("status") in TERMINAL for d in runs) else []


def runner_lifetime(run_dir: Path) -> tuple[float, float]:
    """From the runner's first event to its "done": inside the span its GPU lease was held."""
    events = [json.loads(line) for line in (run_dir / "raw" / "events.jsonl").read_text().splitlines() if line]
    return events[0]["t"], next(e["t"] for e in events if e["event"] == "done")


def assert_no_gpu_shared(runs: list[Path], host_of: Callable[[Path], str] = lambda run: "") -> dict:
    """Per GPU, the runs on it follow one another: no two runner lifetimes overlap. Returns runs per GPU."""
    per_gpu: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for run in runs:
        start, end = runner_lifetime(run)
        per_gpu.setdefault((host_of(run), state_of(run)["gpu"]["uuid"]), []).append((start, end, run.name))
    for gpu, spans in per_gpu.items():
        spans.sort()
        for (_, end, before), (start, _, after) in zip(spans, spans[1:]):
            assert start >= end, f"{after} started on {gpu} while {before} still ran there"
    return per_gpu


class LeaseWatch(threading.Thread):
    """Samples the lease holder records of some hosts (the same flock probe `inv gpu-status` uses) until stopped."""

    def __init__(self, roots: dict[str, Path]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.samples: list[dict[tuple[str, str], str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            sample = {(name, uuid): record.get("run_id") for name, root in self.roots.items()
                      for uuid, record in holders(root).items() if record.get("run_id")}
            self.samples.append(sample)
            time.sleep(0.05)

    def stop(self) -> list[dict[tuple[str, str], str]]:
        self.halt.set()
        self.join()
        return self.samples


def assert_leases_match_assignments(samples: list[dict], gpu_of: dict[tuple[str, str], str]) -> int:
    """Every lease seen was held by a run recorded on that very GPU, and no run held two; returns the most held."""
    for sample in samples:
        for (host, uuid), run_id in sample.items():
            assert gpu_of.get((host, run_id)) == uuid, f"lease on {host} {uuid} held by {run_id}, which ran elsewhere"
        assert len(set(sample.values())) == len(sample), f"a run held two leases at once: {sample}"
    return max(len(sample) for sample in samples)


def kill_sshd_and_sessions(host: SshHost) -> None:
    """SIGKILL sshd: the listener and every per-connection sshd (they setsid, so host.stop() alone spares them)."""
    for pid in descendants(host.proc.pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    host.stop()


def outcomes_of(result: subprocess.CompletedProcess | tuple[str, str]) -> list[dict]:
    """The list of a --json document: inv run's runs, inv fetch-results' fetched."""
    stdout = result[0] if isinstance(result, tuple) else result.stdout
    document = json.loads(stdout)
    return document["runs"] if "runs" in document else document["fetched"]


# ------------------------------------------------------------------------------------------ 1. concurrency


@dataclass
class Crowd:
    """Many runs started at once against fixture GPUs, with what was seen while they ran."""

    work: Workdir
    hosts_toml: Path
    roots: dict[str, Path]
    started: subprocess.CompletedProcess
    refused: subprocess.CompletedProcess
    refused_seconds: float
    runs: list[Path]
    lease_samples: list[dict]
    gpus_in_use_while_blocked: int
    host_of: dict[Path, str] = field(default_factory=dict)

    def gpu_of(self) -> dict[tuple[str, str], str]:
        return {(self.host_of[run], run.name): state_of(run)["gpu"]["uuid"] for run in self.runs}


def crowd_run(work: Workdir, hosts_toml: Path, target: str, roots: dict[str, Path], count: int) -> Crowd:
    """`inv run --task gated,gated,... --detach --wait` with the gate closed; once every GPU holds a run, an
    `inv run` without --wait; then the gate opens and every run goes to its end."""
    work.close_gate()
    watch = LeaseWatch(roots)
    watch.start()
    crowd = work.inv_background("run", "--hosts", str(hosts_toml), "--host", target, "--task",
                                ",".join(["gated"] * count), "--workloads", SMALL, "--detach", "--wait", "600",
                                "--json")
    gpus = sum(len(json.loads((root.parent / "nvml.json").read_text())["gpus"]) for root in roots.values())
    try:
        wait_for(lambda: sum(len(blocked_at_gate(root, "gated")) for root in roots.values()) == gpus, 240,
                 "every GPU holds a run blocked at the gate")
        in_use = sum(len(holders(root)) for root in roots.values())
        began = time.monotonic()
        refused = work.inv("run", "--hosts", str(hosts_toml), "--host", target, "--task", "tiny_rmsnorm",
                           "--workloads", SMALL, "--detach", "--json")
        refused_seconds = time.monotonic() - began
    finally:
        work.open_gate()
    out, err = crowd.communicate(timeout=300)
    started = subprocess.CompletedProcess(crowd.args, crowd.returncode, out, err)
    wait_for(lambda: sum(len(all_over(root, "gated", len(run_dirs(root, "gated")))) for root in roots.values())
             == count, 300, f"all {count} runs over")
    host_of = {run: name for name, root in roots.items() for run in run_dirs(root, "gated")}
    return Crowd(work, hosts_toml, roots, started, refused, refused_seconds, sorted(host_of, key=lambda r: r.name),
                 watch.stop(), in_use, host_of)


@pytest.fixture(scope="module")
def sixteen(rig, tmp_path_factory) -> Crowd:
    """16 runs at once against one host with 4 idle GPUs (12 of them wait for a GPU)."""
    work = Workdir.make(tmp_path_factory.mktemp("sixteen"))
    host = rig.add_host("quad", gpus=[idle_gpu(i) for i in range(4)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False)
    return crowd_run(work, hosts_toml, "quad", {"quad": host.root}, 16)


def test_sixteen_runs_at_once_on_four_gpus_all_finish(sixteen: Crowd) -> None:
    seconds = {run.name[:15] for run in sixteen.runs}
    print(f"16 runs: ids in {len(seconds)} distinct seconds; {len(sixteen.lease_samples)} lease samples")
    assert sixteen.started.returncode == 0, sixteen.started.stderr
    outcomes = outcomes_of(sixteen.started)
    assert [o["status"] for o in outcomes] == ["detached"] * 16
    assert len({o["run_id"] for o in outcomes}) == 16  # started together, never the same id
    assert {o["run_id"] for o in outcomes} == {run.name for run in sixteen.runs}
    assert [state_of(run)["status"] for run in sixteen.runs] == ["passed"] * 16


def test_sixteen_runs_never_share_a_gpu(sixteen: Crowd) -> None:
    per_gpu = assert_no_gpu_shared(sixteen.runs)
    assert len(per_gpu) == 4 and sum(len(spans) for spans in per_gpu.values()) == 16
    most_held = assert_leases_match_assignments(sixteen.lease_samples, sixteen.gpu_of())
    assert most_held == sixteen.gpus_in_use_while_blocked == 4  # all four busy at once, never a fifth lease


def test_without_wait_a_run_fails_fast_with_no_idle_gpu(sixteen: Crowd) -> None:
    refused = sixteen.refused
    print(f"refused in {sixteen.refused_seconds:.1f} s (the whole `inv run` process)")
    assert refused.returncode == 2, refused.stderr
    [outcome] = outcomes_of(refused)
    assert outcome["status"] == "not started" and outcome["run_id"] is None
    assert "no idle GPU" in outcome["error"] and outcome["error"].count("leased: run") == 4
    assert "Traceback" not in refused.stderr
    assert sixteen.refused_seconds < 15  # one channel, no waiting: the CLI's own start-up is most of it
    assert run_dirs(sixteen.roots["quad"], "tiny_rmsnorm") == []  # nothing left behind by the refused start


def test_a_group_of_two_hosts_shares_out_the_runs_and_never_a_gpu(rig, tmp_path) -> None:
    work = Workdir.make(tmp_path)
    one = rig.add_host("duo-1", gpus=[idle_gpu(0), idle_gpu(1)])
    two = rig.add_host("duo-2", gpus=[idle_gpu(0), idle_gpu(1)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [one, two], local=False,
                                      overrides={"duo-1": {"groups": ["duo"]}, "duo-2": {"groups": ["duo"]}})
    crowd = crowd_run(work, hosts_toml, "duo", {"duo-1": one.root, "duo-2": two.root}, 6)

    assert crowd.started.returncode == 0, crowd.started.stderr
    outcomes = outcomes_of(crowd.started)
    assert [o["status"] for o in outcomes] == ["detached"] * 6 and len({o["run_id"] for o in outcomes}) == 6
    assert sorted({o["host"] for o in outcomes}) == ["duo-1", "duo-2"]
    assert [state_of(run)["status"] for run in crowd.runs] == ["passed"] * 6
    assert_no_gpu_shared(crowd.runs, crowd.host_of.get)
    assert assert_leases_match_assignments(crowd.lease_samples, crowd.gpu_of()) == 4
    [refused] = outcomes_of(crowd.refused)
    assert crowd.refused.returncode == 1 and refused["status"] == "no idle GPU"
    assert refused["error"].startswith("no idle GPU on any host: duo-")
    assert crowd.refused_seconds < 15


# ------------------------------------------------------------------------------------------ 6. nothing lost


def test_a_fetch_of_other_runs_never_overwrites_results_already_fetched(sixteen: Crowd) -> None:
    work, first = sixteen.work, sixteen.runs[0].name
    one = work.inv("fetch-results", "--hosts", str(sixteen.hosts_toml), "--host", "quad", "--task", "gated",
                   "--run", first, "--json")
    assert one.returncode == 0, one.stderr
    mine = work.fetched("gated", "quad", first)
    as_fetched = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()}
    newest = work.inv("fetch-results", "--hosts", str(sixteen.hosts_toml), "--host", "quad", "--task", "gated",
                      "--run", "latest", "--json")
    assert newest.returncode == 0 and outcomes_of(newest)[0]["run_id"] == sixteen.runs[-1].name, newest.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()} == as_fetched
    (mine / "notes.md").write_text("my notes on this run\n")  # the user's own file next to the fetched summary
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()}

    every = work.inv("fetch-results", "--hosts", str(sixteen.hosts_toml), "--host", "quad", "--task", "gated",
                     "--run", "all", "--json")

    assert every.returncode == 2 and f"already holds a different summary of run {first}" in every.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in mine.iterdir()} == before
    others = sorted(p.name for p in mine.parent.iterdir() if p.name != first)
    assert others == sorted(run.name for run in sixteen.runs[1:])  # each run its own folder, all 15 landed
    log = (work.path / "kernels" / "gated" / "docs" / "run_log.md").read_text()
    assert all(log.count(run.name) == 1 for run in sixteen.runs)


# ------------------------------------------------------------------------------------------ 2. connection faults


def test_sshd_killed_mid_run_the_run_goes_on_and_comes_home_after_a_restart(rig, work) -> None:
    host = rig.add_host("phoenix", gpus=[idle_gpu(0)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False)
    work.close_gate()
    client = work.inv_background("run", "--hosts", str(hosts_toml), "--host", "phoenix", "--task", "gated",
                                 "--workloads", SMALL, "--json")
    [run] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "run blocked at the gate")

    kill_sshd_and_sessions(host)
    began = time.monotonic()
    out, err = client.communicate(timeout=60)
    print(f"sshd killed: the command failed {time.monotonic() - began:.1f} s later")
    [outcome] = outcomes_of((out, err))
    assert time.monotonic() - began < 10 and client.returncode == 1, err
    assert outcome["status"] == "connection lost" and "connection lost mid-command" in outcome["error"]
    assert f"inv logs --host phoenix --run {run.name} --follow" in outcome["error"]
    assert state_of(run)["status"] == "running" and processes_mentioning(run.name)  # the run did not notice

    host.start()
    work.open_gate()
    followed = work.inv("logs", "--hosts", str(hosts_toml), "--host", "phoenix", "--run", run.name, "--follow")
    assert followed.returncode == 0 and f"run {run.name}: passed" in followed.stdout, followed.stderr
    status = work.inv("status", "--hosts", str(hosts_toml), "--host", "phoenix", "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    assert [(r["run_id"], r["status"]) for r in answer["runs"]] == [(run.name, "passed")]
    fetched = work.inv("fetch-results", "--hosts", str(hosts_toml), "--host", "phoenix", "--task", "gated")
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads((work.fetched("gated", "phoenix", run.name) / "results.json").read_text())["status"] == "passed"


@dataclass
class Netns:
    """Two network namespaces of our own (client, host) joined by a veth pair in a private /30."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))

    def __post_init__(self) -> None:
        self.client, self.host = f"kpc-{self.tag}", f"kph-{self.tag}"
        self.client_if, self.host_if = f"kpc{self.tag}", f"kph{self.tag}"
        n = int(self.tag, 16)  # a /30 picked from the tag; only ever configured inside our two namespaces
        subnet, first = f"10.{200 + n % 50}.{(n >> 6) % 256}", (n % 64) * 4
        self.client_addr, self.host_addr = f"{subnet}.{first + 1}", f"{subnet}.{first + 2}"

    def create(self) -> "Netns":
        ip("netns", "add", self.client)
        ip("netns", "add", self.host)
        ip("-n", self.client, "link", "add", self.client_if, "type", "veth", "peer", "name", self.host_if,
           "netns", self.host)
        ip("-n", self.client, "addr", "add", f"{self.client_addr}/30", "dev", self.client_if)
        ip("-n", self.host, "addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        for namespace, device in ((self.client, self.client_if), (self.host, self.host_if)):
            ip("-n", namespace, "link", "set", "lo", "up")
            ip("-n", namespace, "link", "set", device, "up")
        return self

    def cut(self) -> None:
        ip("-n", self.host, "link", "set", self.host_if, "down")

    def restore(self) -> None:
        ip("-n", self.host, "link", "set", self.host_if, "up")
        ip("-n", self.client, "neigh", "flush", "dev", self.client_if)  # forget the ARP failures of the cut

    def slow(self, namespace: str, device: str, rate: str) -> None:
        subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                        "rate", rate, "burst", "32kbit", "latency", "400ms"], check=True, capture_output=True)

    def unslow(self) -> None:
        for namespace, device in ((self.client, self.client_if), (self.host, self.host_if)):
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", device, "root"],
                           capture_output=True)

    def destroy(self) -> None:
        for namespace in (self.client, self.host):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"ip {' '.join(args)}: {done.stderr.strip()} (these tests need root and iproute2)")


class NamespacedHost(SshHost):
    """An SSH host whose sshd lives in the host namespace: reachable only through the veth pair."""

    netns: Netns

    def start(self) -> None:
        self.write_config()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        log = open(self.home / "sshd.log", "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns.host, SSHD, "-D", "-e", "-f",
                                      str(self.home / "sshd_config")], stdout=log, stderr=log, start_new_session=True)
        self.wait_reachable()

    def wait_reachable(self, timeout: float = 15) -> None:
        probe = (f"import socket, sys\ns = socket.create_connection(({self.address!r}, {self.port}), timeout=1)\n"
                 f"sys.exit(0 if s.recv(4).startswith(b'SSH') else 1)")
        deadline = time.monotonic() + timeout
        while subprocess.run(["ip", "netns", "exec", self.netns.client, sys.executable, "-c", probe],
                             capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {self.netns.host} not reachable: "
                                   f"{(self.home / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)


@dataclass
class FarHost:
    """A host behind a link the test can cut, and the user's workdir reaching it from the client namespace."""

    netns: Netns
    host: NamespacedHost
    work: Workdir
    hosts_toml: Path
    connect_timeout: float = CUT_HOST_CONNECT_TIMEOUT

    def inv(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.work.inv(*args, "--hosts", str(self.hosts_toml), "--host", "far", netns=self.netns.client,
                             timeout=timeout)

    def inv_background(self, *args: str) -> subprocess.Popen:
        return self.work.inv_background(*args, "--hosts", str(self.hosts_toml), "--host", "far",
                                        netns=self.netns.client)

    def cut_and_time_the_failure(self, client: subprocess.Popen) -> tuple[float, str, str]:
        self.netns.cut()
        began = time.monotonic()
        out, err = client.communicate(timeout=60)
        return time.monotonic() - began, out, err

    def reconnect(self) -> None:
        self.netns.unslow()
        self.netns.restore()
        self.host.wait_reachable()

    @property
    def failure_limit(self) -> float:
        """The connect timeout, the heartbeat grace, and a little for a busy 2-core machine to notice."""
        return self.connect_timeout + HEARTBEAT_GRACE_S + 3


@pytest.fixture(scope="module")
def far(rig, tmp_path_factory) -> FarHost:
    netns = Netns().create()
    base = tmp_path_factory.mktemp("far")
    host = None
    try:
        home = base / "far-host"
        host = NamespacedHost(name="far", address=netns.host_addr, port=2222, home=home, client_key=rig.client_key)
        host.netns = netns
        (home / "bin").mkdir(parents=True)
        host.root.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "host_ed25519")], check=True)
        (home / "authorized_keys").write_text(Path(f"{rig.client_key}.pub").read_text())
        host.set_gpus([idle_gpu(0)])
        host.start()
        rig.trust(host)
        work = Workdir.make(base / "work")
        hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False,
                                          overrides={"far": {"connect_timeout": CUT_HOST_CONNECT_TIMEOUT}})
        yield FarHost(netns, host, work, hosts_toml)
    finally:
        if host is not None and host.proc is not None:
            kill_sshd_and_sessions(host)
            for pid in processes_mentioning(str(base)):  # agent commands a dead link left blocked on the host
                os.kill(pid, signal.SIGKILL)
        netns.destroy()


def workspace_files(root: Path, task: str) -> dict[str, bytes]:
    workspace = root / "tasks" / task / "workspace"
    return {str(p.relative_to(workspace)): p.read_bytes() for p in sorted(workspace.rglob("*")) if p.is_file()}


def test_link_cut_during_a_sync_fails_in_time_and_a_retry_completes(far: FarHost) -> None:
    synced = far.inv("sync", "--task", "tiny_rmsnorm")
    assert synced.returncode == 0, synced.stderr
    before = workspace_files(far.host.root, "tiny_rmsnorm")
    task = far.work.path / "kernels" / "tiny_rmsnorm"
    (task / "data").mkdir()
    (task / "data" / "blob.bin").write_bytes(os.urandom(2 << 20))  # 8 s at 2 Mbit/s: long enough to cut
    (task / "bench" / "workloads.toml").write_text((task / "bench" / "workloads.toml").read_text() + "\n# edited\n")
    far.netns.slow(far.netns.client, far.netns.client_if, "2mbit")
    client = far.inv_background("run", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--json")
    staging = far.host.root / "tasks" / "tiny_rmsnorm"
    wait_for(lambda: sum(f.stat().st_size for f in staging.glob(".sync-staging-*/*") if f.exists()) > 100_000,
             60, "part of the sync received")

    seconds, out, err = far.cut_and_time_the_failure(client)

    print(f"sync cut: the command failed {seconds:.1f} s after the cut")  # docs/reliability.md quotes these
    [outcome] = outcomes_of((out, err))
    assert seconds < far.failure_limit and client.returncode == 2, err
    assert outcome["status"] == "not started" and outcome["error"].startswith("far: connection lost")
    assert "Traceback" not in err
    assert workspace_files(far.host.root, "tiny_rmsnorm") == before  # the previous workspace, manifest and all
    assert run_dirs(far.host.root, "tiny_rmsnorm") == []
    # The host's side still waits on the dead link: it may linger for hours (see the next test) or, when the host
    # had bytes of its own in flight, be reset once the link is back.
    assert processes_mentioning(str(far.host.root), "start --task tiny_rmsnorm")

    far.reconnect()
    retry = far.inv("run", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--json", timeout=120)
    assert retry.returncode == 0, retry.stderr
    [outcome] = outcomes_of(retry)
    assert outcome["status"] == "passed"
    after = workspace_files(far.host.root, "tiny_rmsnorm")
    assert after["data/blob.bin"] == (task / "data" / "blob.bin").read_bytes()
    assert after["bench/workloads.toml"].endswith(b"# edited\n")


def test_a_sync_stalled_on_a_dead_link_blocks_no_other_sync(tmp_path, work) -> None:
    """A stream that stops mid-way and never ends (the host's view of a cut link until sshd notices, hours later)
    must not hold the task's sync lock: the next sync of that task completes."""
    entry = parse_inventory({"hosts": {"local": {"transport": "local", "remote_root": str(tmp_path / "root")}}},
                            tmp_path / "hosts.toml").hosts["local"]
    stalled_agent, agent = Agent(entry, LocalTransport()), Agent(entry, LocalTransport())
    agent.call_json("status")  # ships the agent first: the stalled call below must reach the sync itself
    tree = scan_task(find_task(work.path / "kernels", "tiny_rmsnorm"))
    request = build_sync_request(plan_sync(entry, tree))
    most = iter([request[:-2048]])  # all but the end: the agent is inside the stream when it stalls
    link_back = threading.Event()

    def most_then_silence() -> bytes | None:
        chunk = next(most, None)
        if chunk is None:
            link_back.wait()
        return chunk

    stalled = threading.Thread(target=stalled_agent.call, args=("sync-apply", "--task", "tiny_rmsnorm"),
                               kwargs={"stdin": most_then_silence}, daemon=True)
    stalled.start()
    task_root = tmp_path / "root" / "tasks" / "tiny_rmsnorm"
    wait_for(lambda: any(task_root.glob(".sync-staging-*")), 30, "the stalled sync is receiving")
    finished: list[Any] = []
    other = threading.Thread(target=lambda: finished.append(sync_task(agent, find_task(work.path / "kernels", "tiny_rmsnorm"))),
                             daemon=True)
    other.start()
    other.join(timeout=30)
    done_while_stalled = list(finished)
    link_back.set()  # let the stalled one see its end of stream either way
    stalled.join(timeout=30)

    assert done_while_stalled, "the second sync waited on the stalled one's lock"
    assert done_while_stalled[0].files_sent == len(tree.files)
    assert not list(task_root.glob(".sync-staging-*"))  # the stalled sync's partial files went with it


def test_link_cut_while_following_a_run_fails_in_time_and_logs_reattach(far: FarHost) -> None:
    far.work.close_gate()
    client = far.inv_background("run", "--task", "gated", "--workloads", SMALL, "--json")
    [run] = wait_for(lambda: blocked_at_gate(far.host.root, "gated"), 120, "run blocked at the gate")

    seconds, out, err = far.cut_and_time_the_failure(client)

    print(f"follow cut: the command failed {seconds:.1f} s after the cut")
    [outcome] = outcomes_of((out, err))
    assert seconds < far.failure_limit and client.returncode == 1, err
    assert outcome["status"] == "connection lost" and "far: connection lost" in outcome["error"]
    assert f"inv logs --host far --run {run.name} --follow" in outcome["error"]
    far.reconnect()
    far.work.open_gate()
    followed = far.inv("logs", "--run", run.name, "--follow")
    assert followed.returncode == 0 and f"run {run.name}: passed" in followed.stdout, followed.stderr
    fetched = far.inv("fetch-results", "--task", "gated", "--run", run.name)
    assert fetched.returncode == 0, fetched.stderr
    assert (far.work.fetched("gated", "far", run.name) / "results.json").is_file()


def test_link_cut_during_a_fetch_leaves_nothing_half_fetched_and_a_retry_completes(far: FarHost) -> None:
    if not run_dirs(far.host.root, "tiny_rmsnorm"):
        assert far.inv("run", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--detach").returncode == 0
    run = wait_for(lambda: all_over(far.host.root, "tiny_rmsnorm", 1), 120, "a finished run")[0]
    fetched = far.work.fetched("tiny_rmsnorm", "far", run.name)
    shutil.rmtree(fetched, ignore_errors=True)
    (run / "summary" / "speedup.png").write_bytes(os.urandom(3 << 20))  # a summary big enough to be cut mid-way
    far.netns.slow(far.netns.host, far.netns.host_if, "2mbit")
    client = far.inv_background("fetch-results", "--task", "tiny_rmsnorm", "--run", run.name)
    wait_for(lambda: processes_mentioning(f"pack-summary --task tiny_rmsnorm --run {run.name}"), 60, "fetch begun")
    time.sleep(1.0)

    seconds, out, err = far.cut_and_time_the_failure(client)

    print(f"fetch cut: the command failed {seconds:.1f} s after the cut")
    assert seconds < far.failure_limit and client.returncode == 2, err
    assert "far: connection lost" in err and "Traceback" not in err
    assert not fetched.exists() and list(fetched.parent.glob(f".{run.name}*")) == []  # nothing half written
    far.reconnect()
    again = far.inv("fetch-results", "--task", "tiny_rmsnorm", "--run", run.name)
    assert again.returncode == 0, again.stderr
    assert (fetched / "speedup.png").read_bytes() == (run / "summary" / "speedup.png").read_bytes()


# ------------------------------------------------------------------------------------------ 3. remote faults


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 4 MiB tmpfs to be a host's remote_root."""
    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.fail(f"mount tmpfs: {done.stderr.strip()} (this test needs root)")
    yield mount
    for pid in processes_mentioning(str(mount)):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill_up(folder: Path) -> Path:
    """Write until the filesystem says ENOSPC, the way another user's job would."""
    filler = folder / "someone-elses-data.bin"
    with open(filler, "ab", buffering=0) as f:
        for chunk in (65536, 512):
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError:
                pass
    return filler


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_disk_full_during_a_run_is_named_frees_the_gpu_and_corrupts_nothing(rig, work, tiny_disk) -> None:
    host = rig.add_host("cramped", gpus=[idle_gpu(0)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False,
                                      overrides={"cramped": {"remote_root": str(tiny_disk)}})
    hosts = ("--hosts", str(hosts_toml), "--host", "cramped")
    earlier = work.inv("run", *hosts, "--task", "gated", "--workloads", SMALL, "--json")
    assert earlier.returncode == 0, earlier.stderr
    [earlier_run] = run_dirs(tiny_disk, "gated")
    work.close_gate()
    client = work.inv_background("run", *hosts, "--task", "gated", "--workloads", SMALL, "--json")
    [run] = wait_for(lambda: blocked_at_gate(tiny_disk, "gated"), 120, "run blocked at the gate")
    kept = {"earlier run": tree_bytes(earlier_run), "workspace": tree_bytes(tiny_disk / "tasks" / "gated" / "workspace")}

    filler = fill_up(tiny_disk)
    work.open_gate()
    out, err = client.communicate(timeout=120)

    [outcome] = outcomes_of((out, err))
    state = state_of(run)
    assert client.returncode == 1 and outcome["status"] == "error", err
    assert state["status"] == "error" and state["message"].startswith(f"disk full on {tiny_disk} ")
    assert outcome["error"] == state["message"] and "\n" not in state["message"]
    assert holders(tiny_disk) == {} and not processes_mentioning(run.name)  # GPU free, nothing left running
    assert {"earlier run": tree_bytes(earlier_run),
            "workspace": tree_bytes(tiny_disk / "tasks" / "gated" / "workspace")} == kept

    fill_up(tiny_disk)  # the reserve the failed run gave back, taken too
    refused = work.inv("run", *hosts, "--task", "gated", "--workloads", SMALL, "--json")
    [outcome] = outcomes_of(refused)
    assert refused.returncode == 2 and outcome["status"] == "not started", refused.stderr
    # whichever write fails first (the sync's manifest, or the run's state) names the disk that is full
    assert str(tiny_disk) in outcome["error"] and any(words in outcome["error"] for words in (
        f"disk full on {tiny_disk}", "No space left on device"))
    assert "\n" not in outcome["error"] and "Traceback" not in refused.stderr
    filler.unlink()
    status = work.inv("status", *hosts, "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    assert [r["status"] for r in answer["runs"]] == ["passed", "error"]


def test_runner_killed_on_the_host_is_marked_failed_and_its_gpu_taken_by_the_next_run(rig, work) -> None:
    host = rig.add_host("fragile", gpus=[idle_gpu(0)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False)
    hosts = ("--hosts", str(hosts_toml), "--host", "fragile")
    work.close_gate()
    assert work.inv("run", *hosts, "--task", "gated", "--workloads", SMALL, "--detach").returncode == 0
    [run] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "run blocked at the gate")
    worker = [pid for pid in processes_mentioning(run.name) if pid != state_of(run)["pid"]]
    assert worker  # the workload's process, a child of the runner

    os.kill(state_of(run)["pid"], signal.SIGKILL)

    status = work.inv("status", *hosts, "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    assert [(r["status"], r.get("error")) for r in answer["runs"]] == [("failed", "agent process died")]
    assert not processes_mentioning(run.name)  # its worker went with it: nothing keeps using the GPU
    work.open_gate()
    after = work.inv("run", *hosts, "--task", "tiny_rmsnorm", "--workloads", SMALL, "--json")
    assert after.returncode == 0, after.stderr
    [next_run] = run_dirs(host.root, "tiny_rmsnorm")
    assert state_of(next_run)["gpu"]["uuid"] == state_of(run)["gpu"]["uuid"] == idle_gpu(0)["uuid"]


def test_remote_python_without_torch_or_without_cuda_is_one_line(rig, work, tmp_path) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    host = rig.add_host("torchless", gpus=[idle_gpu(0)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False,
                                      overrides={"torchless": {"python": str(bare / "bin" / "python")}})
    no_torch = work.inv("run", "--hosts", str(hosts_toml), "--host", "torchless", "--task", "tiny_rmsnorm",
                        "--workloads", SMALL, "--json")
    cpu_torch = work.inv("run", "--hosts", str(rig.write_hosts_toml(work.path / "cpu.toml", [host], local=False)),
                         "--host", "torchless", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--device", "cuda",
                         "--json")

    for result, expected in ((no_torch, f"torch is not installed for {bare / 'bin' / 'python'} on "),
                             (cpu_torch, f"the torch of {sys.executable} on ")):
        [outcome] = outcomes_of(result)
        assert result.returncode == 2 and outcome["status"] == "not started", result.stderr
        assert outcome["error"].startswith(f"torchless: could not start the run: {expected}")
        assert "\n" not in outcome["error"] and "Traceback" not in result.stderr
    assert "has no CUDA (a CPU-only build)" in outcomes_of(cpu_torch)[0]["error"]
    assert run_dirs(host.root, "tiny_rmsnorm") == [] and holders(host.root) == {}  # refused before any lease


# ------------------------------------------------------------------------------------------ 4. cancellation


def test_inv_cancel_leaves_no_process_frees_the_gpu_and_says_cancelled(rig, work) -> None:
    host = rig.add_host("cancelled", gpus=[idle_gpu(0)])
    hosts_toml = rig.write_hosts_toml(work.path / "hosts.toml", [host], local=False)
    hosts = ("--hosts", str(hosts_toml), "--host", "cancelled")
    work.close_gate()
    assert work.inv("run", *hosts, "--task", "gated", "--workloads", SMALL, "--detach").returncode == 0
    [run] = wait_for(lambda: blocked_at_gate(host.root, "gated"), 120, "run blocked at the gate")
    # the row's phase is written as its judge starts: the runner, then the judge and its sides, held at the gate
    def runner_and_judge() -> list[int] | None:
        found = processes_mentioning(run.name)
        return found if len(found) >= 2 else None

    group = wait_for(runner_and_judge, 60, "the runner and its judge")
    assert holders(host.root)  # the GPU leased

    cancelled = work.inv("cancel", *hosts, "--run", run.name)

    assert cancelled.returncode == 0 and f"run {run.name}: cancelled" in cancelled.stdout, cancelled.stderr
    assert state_of(run)["status"] == "cancelled"
    assert not processes_mentioning(run.name) and not any(map(alive, group))
    assert holders(host.root) == {}
    work.open_gate()
