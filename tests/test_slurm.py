"""Slurm clusters behind the same commands (issue 15), on a real Slurm: tests/slurm_rig.py's one node with 8 fake GPUs,
its login node one of tests/rig.py's loopback sshd hosts. CPU smoke runs of the tiny task with one workload; a
`gated` twin whose candidate waits on a file holds a run in flight for as long as a test needs.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kpremote.hosts.config import parse_inventory
from kpremote.errors import ConfigError
from rig import REPO, idle_gpu
from slurm_rig import PACKAGES, SlurmRig, missing_tools
from waiting import alive, processes_mentioning, state_of, wait_for

TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
SMALL = "grid_r1_c33"
GATED_CANDIDATE = '''
import os as _os
import time as _time

_fast_rmsnorm = rmsnorm


def rmsnorm(*args, **kwargs):  # held at a gate the test opens: runs stay in flight exactly as long as it needs
    while _os.path.exists(GATE):
        _time.sleep(0.05)
    return _fast_rmsnorm(*args, **kwargs)
'''


# ------------------------------------------------------------------------------------------ hosts.toml


def parse(text: str):
    import tomllib

    return parse_inventory(tomllib.loads('[hosts.c]\nssh = "login"\n' + text), Path("hosts.toml"))


def test_a_cluster_host_takes_slurm_settings():
    host = parse('scheduler = "slurm"\npartition = "gpu"\naccount = "lab"\nqos = "normal"\ngres = "gpu:h200:1"\n'
                 'time_limit = "0:30:00"\nconstraint = "h200&ib"\nsbatch_args = ["--mem=64G", "--exclude=n3"]'
                 ).hosts["c"]
    assert host.is_cluster and host.slurm["gres"] == "gpu:h200:1" and host.slurm["sbatch_args"] == ["--mem=64G",
                                                                                                  "--exclude=n3"]
    assert not parse("").hosts["c"].is_cluster


@pytest.mark.parametrize("text, expected", [
    ('partition = "gpu"', '[hosts.c] partition: a Slurm setting, but the host has no scheduler = "slurm"'),
    ('scheduler = "pbs"', "[hosts.c] scheduler = 'pbs': allowed: 'slurm'"),
    ('scheduler = "slurm"\ngres = "gpu h200"', "[hosts.c] gres = 'gpu h200': expected NAME[:TYPE][:COUNT]"),
    ('scheduler = "slurm"\ntime_limit = "30 min"', "[hosts.c] time_limit = '30 min': expected Slurm's time"),
    ('scheduler = "slurm"\npartition = "gpu;rm"', "[hosts.c] partition = 'gpu;rm'"),
    ('scheduler = "slurm"\nsbatch_args = ["--output=/tmp/x"]', "'--output=/tmp/x': --output is not allowed"),
    ('scheduler = "slurm"\nsbatch_args = ["--time=5"]', "'--time=5': use the host's time_limit field instead"),
    ('scheduler = "slurm"\nsbatch_args = ["--mem 4G"]', "'--mem 4G': write each option as '--key=value'"),
    ('scheduler = "slurm"\nsbatch_args = ["--memm=4G"]', "--memm is not allowed — did you mean 'mem'?"),
    ('scheduler = "slurm"\nsbatch_args = "--mem=4G"', "[hosts.c] sbatch_args = '--mem=4G'"),
])
def test_bad_slurm_settings_name_file_table_and_field(text, expected):
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert str(caught.value).startswith("hosts.toml: [hosts.c]") and expected in str(caught.value), str(caught.value)


# ------------------------------------------------------------------------------------------ the agent's own checks


def test_the_agent_refuses_sbatch_settings_the_client_would_not_send():
    from kpremote.agent.lease import BadRequest
    from kpremote.agent.slurm.slurmsubmit import sbatch_options

    assert sbatch_options({"partition": "gpu", "gres": "gpu:h200:1", "sbatch_args": ["--mem=4G"]}) == [
        "--partition=gpu", "--gres=gpu:h200:1", "--mem=4G"]
    for bad in ({"partition": "gpu --wrap=x"}, {"sbatch_args": ["--output=/etc/x"]}, {"sbatch_args": ["--mem=4G\n"]},
                {"script": "x"}):
        with pytest.raises(BadRequest):
            sbatch_options(bad)


def test_allocated_gpus_are_matched_the_way_slurm_names_them():
    from kpremote.agent.nvml import GpuState, Snapshot
    from kpremote.agent.slurm.slurmstep import allocated_gpu_keys, allocated_only

    gpus = [GpuState.from_json(idle_gpu(i)) for i in range(4)]
    fixture = Snapshot("node", "580", "fixture", gpus)
    assert allocated_gpu_keys({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["1", "3"]
    assert allocated_gpu_keys({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) is None
    assert [g.index for g in allocated_only(fixture, ["1", "3"]).gpus] == [1, 3]
    assert allocated_only(fixture, None).gpus == []  # no gres asked for: no GPU, whatever NVML shows
    confined = Snapshot("node", "580", "nvml", gpus[:1])  # a cgroup shows the job only its own GPU, as index 0
    assert [g.uuid for g in allocated_only(confined, ["5"]).gpus] == [gpus[0].uuid]


def test_slurmstepd_says_why_it_signalled_the_job(tmp_path):
    from kpremote.agent.slurm.slurmjobs import _gpu_count
    from kpremote.agent.slurm.slurmsettle import stepd_verdict

    (tmp_path / "raw").mkdir()
    out = tmp_path / "raw" / "slurm-12.out"
    assert stepd_verdict(tmp_path, "12") is None
    for line, verdict in (("slurmstepd-vm: error: *** JOB 12 ON vm CANCELLED AT 2026-11-23T13:15:53 ***", "CANCELLED"),
                          ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-23T13:28:09 DUE TO TIME LIMIT ***",
                           "TIMEOUT"),
                          ("*** JOB 12 ON n1 CANCELLED AT 2026-11-23T13:28:09 DUE TO PREEMPTION ***", "PREEMPTED"),
                          ("*** JOB 12 ON n1 CANCELLED AT 2026-11-23T13:28:09 DUE TO NODE FAILURE ***", "NODE_FAIL"),
                          ("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-23T13:28:09 DUE TO NODE FAILURE, "
                           "SEE SLURMCTLD LOG FOR DETAILS ***", "NODE_FAIL")):
        out.write_text("some output\n" + line + "\n")
        assert stepd_verdict(tmp_path, "12") == verdict
    out.write_text("*** JOB 120 ON n1 CANCELLED AT 2026-11-23T13:28:09 DUE TO TIME LIMIT ***\n")
    assert stepd_verdict(tmp_path, "12") is None  # another job's line is not ours
    assert [_gpu_count(g) for g in ("gpu:8", "gpu:h200:4(S:0-1)", "gpu:(null):2(IDX:0-1)", "gpu:a:1,gpu:b:2", "")] == [
        8, 4, 2, 3, 0]


# ------------------------------------------------------------------------------------------ the cluster


@pytest.fixture(scope="session")
def slurm():
    if missing_tools():
        pytest.fail(f"Slurm is missing ({', '.join(missing_tools())}): run the README's test command (it installs "
                    f"{' '.join(PACKAGES)})")
    base = Path(tempfile.mkdtemp(prefix="kp-slurm-", dir="/tmp"))  # munged needs a path every user can traverse
    rig = SlurmRig(base).start()
    yield rig
    rig.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def login(rig, slurm):
    """The cluster's login node: a loopback sshd host whose sessions reach the test Slurm; its fixture NVML shows
    the node's 8 GPUs (a job sees the same file: the shared filesystem)."""
    return rig.add_host("login", gpus=[idle_gpu(i) for i in range(8)], extra_env=slurm.env)


@pytest.fixture(scope="session")
def bare_login(rig):
    """A login node whose non-interactive sessions do not get SLURM_CONF: Slurm's commands there cannot reach it."""
    return rig.add_host("bare-login", gpus=[])


def bare_cluster(rig, bare_login, slurm, tmp_path: Path) -> "Cluster":
    toml = rig.write_hosts_toml(tmp_path / "bare.toml", [bare_login], local=False, overrides={
        bare_login.name: {"scheduler": "slurm", "partition": "debug"}})
    return Cluster(slurm, bare_login, tmp_path, toml, tmp_path / "gate")


def hangup_as_in_a_terminal() -> None:
    """SIGHUP at its default, as a shell in a terminal starts a command: a suite started under nohup (SIGHUP ignored,
    and inherited) would otherwise start clients that a closed terminal cannot end."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@dataclass
class Cluster:
    slurm: SlurmRig
    login: Any
    path: Path
    hosts_toml: Path
    gate: Path

    def inv(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), cwd=self.path, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def inv_background(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), cwd=self.path, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=hangup_as_in_a_terminal)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args[:1], "--hosts",
                str(self.hosts_toml), *args[1:]]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KPREMOTE_CACHE": str(self.path / ".cache"), "NO_COLOR": "1", "COLUMNS": "200"}

    def run_dirs(self, task: str = "gated") -> list[Path]:
        return sorted(p for p in (self.login.root / "tasks" / task / "runs").glob("*") if (p / "state.json").is_file())

    def run_dir(self, run_id: str, task: str = "gated") -> Path:
        return self.login.root / "tasks" / task / "runs" / run_id

    def detach(self, task: str = "gated", host: str = "cluster", count: int = 1) -> list[dict[str, Any]]:
        done = self.inv("run", "--host", host, "--task", ",".join([task] * count), "--workloads", SMALL,
                        "--detach", "--json")
        assert done.returncode == 0, done.stderr + done.stdout  # a run's error is in the JSON
        return json.loads(done.stdout)["runs"]

    def job(self, job_id: str) -> dict[str, str]:
        out = self.slurm.client("scontrol", "show", "job", "-o", job_id).stdout.decode()
        return dict(word.split("=", 1) for word in out.split() if "=" in word)


def make_cluster(base: Path, slurm: SlurmRig, login, rig, **settings: Any) -> Cluster:
    kernels = base / "kernels"
    shutil.copytree(TINY, kernels / "tiny_rmsnorm")
    gated = kernels / "gated"
    shutil.copytree(TINY, gated)
    toml = gated / "task.toml"
    toml.write_text(toml.read_text().replace('name = "tiny_rmsnorm"', 'name = "gated"'))
    with open(gated / "solution" / "kernel.py", "a") as f:
        f.write(f"\nGATE = {str(base / 'gate')!r}\n{GATED_CANDIDATE}")
    hosts_toml = rig.write_hosts_toml(base / "hosts.toml", [login], local=False, overrides={
        login.name: {"scheduler": "slurm", "partition": "debug", "gres": "gpu:1", **settings}})
    # the same login node once more: a cluster host with a one-minute limit and no GPU asked for
    text = hosts_toml.read_text().replace(f'[hosts."{login.name}"]', "[hosts.cluster]")
    short = text.split("[hosts.cluster]", 1)[1].replace('gres = "gpu:1"\n', "") + 'time_limit = "1"\n'
    hosts_toml.write_text(text + "\n[hosts.short]" + short)
    return Cluster(slurm, login, base, hosts_toml, base / "gate")


@pytest.fixture
def cluster(tmp_path, slurm, login, rig) -> Cluster:
    made = make_cluster(tmp_path, slurm, login, rig)
    yield made
    made.gate.unlink(missing_ok=True)
    slurm.cancel_all()


@pytest.fixture(scope="session")
def time_limited(tmp_path_factory, slurm, login, rig):
    """A run started with the first test in the foreground, as a user would, and checked after the others that need
    no node down: Slurm enforces a one-minute limit in its own time (60-90 s after the start), meanwhile the other
    tests run. (client, run folder, job id)"""
    made = make_cluster(tmp_path_factory.mktemp("time-limited"), slurm, login, rig)
    made.gate.write_text("closed")
    before = set(made.run_dirs())
    client = made.inv_background("run", "--host", "short", "--task", "gated", "--workloads", SMALL)
    def submitted() -> list[Path]:
        assert client.poll() is None, client.communicate()
        return [d for d in made.run_dirs() if d not in before and state_of(d).get("job_id")]

    [run_dir] = wait_for(submitted, 60, "the run is submitted")
    job_id = state_of(run_dir)["job_id"]
    slurm.kept.add(job_id)  # other tests' clean-up must not cancel it
    yield made, client, run_dir, job_id
    if client.poll() is None:
        client.kill()
        client.communicate()


def by_run(cluster: Cluster, outcomes: list[dict]) -> list[dict]:
    return [state_of(cluster.run_dir(o["run_id"])) for o in outcomes]


# ------------------------------------------------------------------------------------------ run, follow, cancel


def test_run_on_the_cluster_is_a_job_on_an_allocated_gpu(cluster, time_limited):
    done = cluster.inv("run", "--host", "cluster", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    [outcome] = json.loads(done.stdout)["runs"]
    assert outcome["status"] == "passed" and outcome["job_id"], outcome
    state = state_of(cluster.run_dir(outcome["run_id"], "tiny_rmsnorm"))
    assert state["job_id"] == outcome["job_id"] and state["scheduler"] == "slurm"
    assert str(state["gpu"]["index"]) in state["slurm"]["allocated_gpus"]  # the leased GPU is one Slurm gave
    job = wait_for(lambda: (j := cluster.job(outcome["job_id"]))["JobState"] == "COMPLETED" and j, 30,
                   "Slurm records the job COMPLETED")
    assert job["Partition"] == "debug", job
    assert job["TresPerNode"] == "gres:gpu:1", job
    fetched = cluster.path / outcome["summary_dir"]
    assert (fetched / "results.json").is_file() and "SMOKE RUN" in (fetched / "results.md").read_text()
    # gres gave a GPU, but the node's NVML does not answer (the rig's GPUs are fakes): the run says it smoke-ran
    logs = cluster.inv("logs", "--host", "cluster", "--run", outcome["run_id"]).stdout
    assert re.search(r"warning: job \d+ on \S+ was allocated GPU \d+ \(gres\), but NVML does not answer on this node "
                     r"\(GPU readings: fixture\): a CPU smoke run", logs), logs


def test_a_submission_says_how_far_it_is_then_the_job_id(cluster):
    done = cluster.inv("run", "--host", "cluster", "--task", "tiny_rmsnorm", "--workloads", SMALL, "--detach")
    assert done.returncode == 0, done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("cluster: tiny_rmsnorm: ")]
    phases = [line.split(": ", 2)[2] for line in lines]
    assert phases[0] == "connecting" and phases[1].startswith("syncing"), lines
    assert re.fullmatch(r"submitted as Slurm job \d+", phases[-1]), lines
    job_id = phases[-1].rsplit(" ", 1)[1]
    wait_for(lambda: cluster.job(job_id)["JobState"] == "COMPLETED", 60, "the submitted job runs to its end")


def test_sync_lines_agree_for_host_aliases_sharing_a_remote_root(cluster, slurm, login, rig, tmp_path):
    """`cluster` and `short` are one login node and one remote_root: what one synced, the other need not send. A
    client that remembers nothing (a fresh cache) sends its files, and says the workspace had them, not 'nothing'."""
    task = cluster.path / "kernels" / "aliased"
    shutil.copytree(TINY, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('name = "tiny_rmsnorm"', 'name = "aliased"'))

    def syncing(made: Cluster, host: str) -> list[str]:
        done = made.inv("run", "--host", host, "--task", "aliased", "--workloads", SMALL, "--detach")
        assert done.returncode == 0, done.stderr + done.stdout
        return [line.split(": ", 2)[2] for line in done.stderr.splitlines()
                if line.startswith(f"{host}: aliased: syncing")]

    [first] = syncing(cluster, "cluster")
    assert re.fullmatch(r"syncing \d+ files \(.*\)", first), first
    assert syncing(cluster, "short") == ["syncing: nothing changed"]
    fresh = make_cluster(tmp_path / "fresh", slurm, login, rig)
    shutil.copytree(task, fresh.path / "kernels" / "aliased")
    sent, answered = syncing(fresh, "cluster")
    assert sent == first and answered == "syncing: the workspace had them already (synced from elsewhere)", answered


def test_detached_run_status_logs_follow_and_gpu_status(cluster):
    cluster.gate.write_text("closed")
    [outcome] = cluster.detach()
    run_dir = cluster.run_dir(outcome["run_id"])
    wait_for(lambda: state_of(run_dir).get("phase") == "workload", 120, "the run reaches its workload")
    status = cluster.inv("status", "--host", "cluster", "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    [run] = [r for r in answer["runs"] if r["run_id"] == outcome["run_id"]]
    assert run["status"] == "running" and run["job_id"] == outcome["job_id"], run

    gpus = cluster.inv("gpu-status", "--host", "cluster", "--json")
    assert gpus.returncode == 0, gpus.stderr
    [report] = json.loads(gpus.stdout)["hosts"]
    [node] = report["nodes"]
    assert report["source"] == "slurm" and node["state"] in ("mixed", "mix") and "debug" in node["partitions"]
    assert (node["gpus_total"], node["gpus_allocated"]) == (8, 1), node
    assert outcome["run_id"] in [j["run_id"] for j in node["jobs"] if j.get("run_id")]  # (with the time-limited)
    table = cluster.inv("gpu-status", "--host", "cluster")
    assert "1/8 allocated" in table.stdout and outcome["run_id"] in table.stdout, table.stdout

    follower = cluster.inv_background("logs", "--host", "cluster", "--run", outcome["run_id"], "--follow")
    time.sleep(1)
    cluster.gate.unlink()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert f"[1/1] {SMALL}: PASSED" in out, out  # the row's verdict, followed from the shared filesystem
    assert f"run {outcome['run_id']}: passed" in out
    fetch = cluster.inv("fetch-results", "--host", "cluster", "--task", "gated", "--run", outcome["run_id"])
    assert fetch.returncode == 0, fetch.stderr
    assert (cluster.path / "kernels" / "gated" / "results" / "cluster" / outcome["run_id"] / "results.json").is_file()


def test_a_task_for_another_arch_is_refused_on_the_node(cluster):
    task = cluster.path / "kernels" / "b200_only"
    shutil.copytree(TINY, task)
    (task / "task.toml").write_text((task / "task.toml").read_text().replace('name = "tiny_rmsnorm"', 'name = '
                                    '"b200_only"').replace('arch = "any"', 'arch = "b200"'))
    done = cluster.inv("run", "--host", "cluster", "--task", "b200_only", "--workloads", SMALL, "--json")
    [outcome] = json.loads(done.stdout)["runs"]
    assert done.returncode != 0 and outcome["status"] == "error", outcome
    assert "b200" in outcome["error"] and outcome["job_id"], outcome  # the node's (fixture) GPUs are H200s
    assert not (cluster.run_dir(outcome["run_id"], "b200_only") / "raw" / "prepare.log").exists()  # nothing ran


def test_cancel_is_scancel_and_the_run_reads_cancelled(cluster):
    cluster.gate.write_text("closed")
    [outcome] = cluster.detach()
    run_dir = cluster.run_dir(outcome["run_id"])
    wait_for(lambda: state_of(run_dir).get("phase") == "workload", 120, "the run reaches its workload")
    done = cluster.inv("cancel", "--host", "cluster", "--run", outcome["run_id"])
    assert done.returncode == 0, done.stderr
    assert f"run {outcome['run_id']}: cancelled" in done.stdout
    assert state_of(run_dir)["status"] == "cancelled"
    wait_for(lambda: cluster.job(outcome["job_id"])["JobState"] == "CANCELLED", 30, "Slurm says CANCELLED")
    assert (run_dir / "raw" / "events.jsonl").stat().st_size > 0  # what it wrote is kept


def test_ctrl_c_in_inv_run_cancels_the_job(cluster):
    import signal

    cluster.gate.write_text("closed")
    before = set(cluster.run_dirs())  # the login node is shared by every test of the session
    client = cluster.inv_background("run", "--host", "cluster", "--task", "gated", "--workloads", SMALL)
    [run_dir] = wait_for(lambda: [d for d in cluster.run_dirs() if d not in before], 60, "the run is submitted")
    wait_for(lambda: state_of(run_dir).get("phase") == "workload", 120, "the run reaches its workload")
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=120)
    assert client.returncode == 130, err
    assert f"cancelled run {run_dir.name} on cluster" in err, err
    state = state_of(run_dir)
    assert state["status"] == "cancelled" and state["cancel_requested"], state
    wait_for(lambda: cluster.job(state["job_id"])["JobState"] == "CANCELLED", 30, "Slurm says CANCELLED")


def job_processes(job_id: str) -> list[int]:
    """Live processes of a Slurm job, by the SLURM_JOB_ID every one of them inherits (whoever its parent now is)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"\0SLURM_JOB_ID={job_id}\0".encode() in b"\0" + environ and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def test_nothing_of_a_job_outlives_its_step_and_runner_killed_with_sigkill(cluster):
    """proctrack/linuxproc (the rig's) loses a process whose parent died: the step's reaper empties its group. The
    candidate starts a process that watches nobody (as a build's compiler would not), then waits at the gate."""
    import signal

    task = cluster.path / "kernels" / "lingering"
    shutil.copytree(cluster.path / "kernels" / "gated", task)
    (task / "task.toml").write_text((task / "task.toml").read_text().replace('name = "gated"', 'name = "lingering"'))
    with open(task / "solution" / "kernel.py", "a") as f:
        f.write("\nimport subprocess as _subprocess\n_LINGERING = _subprocess.Popen(['sleep', '600'])\n")
    cluster.gate.write_text("closed")
    [outcome] = cluster.detach(task="lingering")
    run_dir = cluster.run_dir(outcome["run_id"], "lingering")
    state = wait_for(lambda: (s := state_of(run_dir)).get("phase") == "workload" and s, 120, "the run's workload")
    step, runner = state["pgid"], state["pid"]
    wait_for(lambda: [p for p in job_processes(outcome["job_id"]) if Path(f"/proc/{p}/cmdline").read_bytes()
                      .startswith(b"sleep")], 60, "the candidate's lingering process")
    for pid in (runner, step):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cluster.job(outcome["job_id"])["JobState"] not in ("RUNNING", "COMPLETING"), 30, "the job ends")
    wait_for(lambda: not job_processes(outcome["job_id"]), 30, "no process of the job is left", poll=0.5)


def test_pending_shows_slurms_reason_and_place_then_runs(cluster):
    blocker = cluster.slurm.client("sbatch", "--parsable", "--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 300",
                                   check=True).stdout.decode().strip()
    wait_for(lambda: cluster.job(blocker)["JobState"] == "RUNNING", 30, "the blocker holds all 8 GPUs")
    [outcome] = cluster.detach(task="tiny_rmsnorm")
    run_dir = cluster.run_dir(outcome["run_id"], "tiny_rmsnorm")

    def queued() -> dict:
        [answer] = json.loads(cluster.inv("status", "--host", "cluster", "--json").stdout)["hosts"]
        [run] = [r for r in answer["runs"] if r["run_id"] == outcome["run_id"]]
        return run if (run.get("queue") or {}).get("reason") == "Resources" else {}

    run = wait_for(queued, 30, "the run pending with reason Resources")
    assert run["status"] == "pending" and run["queue"]["position"] == 1, run
    assert run["phase"] == "queued: Resources, 1 of 1 pending"
    logs = cluster.inv("logs", "--host", "cluster", "--run", outcome["run_id"])
    assert "queued: Resources" in logs.stdout, logs.stdout
    cluster.slurm.client("scancel", blocker, check=True)
    wait_for(lambda: state_of(run_dir).get("status") == "passed", 120, "the run starts and passes once GPUs free up")


def test_a_run_cancelled_while_pending_logs_a_plain_cancel(cluster):
    blocker = cluster.slurm.client("sbatch", "--parsable", "--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 300",
                                   check=True).stdout.decode().strip()
    wait_for(lambda: cluster.job(blocker)["JobState"] == "RUNNING", 30, "the blocker holds all 8 GPUs")
    [outcome] = cluster.detach(task="tiny_rmsnorm")
    wait_for(lambda: cluster.job(outcome["job_id"])["JobState"] == "PENDING", 30, "the run's job waits")
    done = cluster.inv("cancel", "--host", "cluster", "--run", outcome["run_id"])
    assert done.returncode == 0 and f"run {outcome['run_id']}: cancelled" in done.stdout, done.stdout + done.stderr
    logs = cluster.inv("logs", "--host", "cluster", "--run", outcome["run_id"]).stdout
    [done_line] = [line for line in logs.splitlines() if "done: " in line]
    assert done_line.split("done: ", 1)[1] == "cancelled  scancel while queued: the job never started", logs
    assert "exit code" not in logs, logs  # it never ran: no exit code to show


def test_closing_the_terminal_of_a_foreground_run_leaves_its_job_queued(cluster):
    """docs/slurm.md: SIGHUP (the terminal closed) ends the client, not the job; only Ctrl-C cancels."""
    import signal

    blocker = cluster.slurm.client("sbatch", "--parsable", "--gres=gpu:8", "-o", "/dev/null", "--wrap", "sleep 300",
                                   check=True).stdout.decode().strip()
    wait_for(lambda: cluster.job(blocker)["JobState"] == "RUNNING", 30, "the blocker holds all 8 GPUs")
    before = set(cluster.run_dirs("tiny_rmsnorm"))
    client = cluster.inv_background("run", "--host", "cluster", "--task", "tiny_rmsnorm", "--workloads", SMALL)
    [run_dir] = wait_for(lambda: [d for d in cluster.run_dirs("tiny_rmsnorm") if d not in before
                                  and state_of(d).get("job_id")], 60, "the run is submitted")
    client.send_signal(signal.SIGHUP)
    client.communicate(timeout=60)
    assert client.returncode == -signal.SIGHUP
    job_id = state_of(run_dir)["job_id"]
    assert cluster.job(job_id)["JobState"] == "PENDING" and state_of(run_dir)["status"] == "pending"
    cluster.slurm.client("scancel", blocker, check=True)
    wait_for(lambda: state_of(run_dir).get("status") == "passed", 120, "the run goes on and passes")


def test_eight_one_gpu_runs_at_once_on_the_eight_gpus(cluster):
    cluster.gate.write_text("closed")
    outcomes = cluster.detach(count=8)
    assert len({o["job_id"] for o in outcomes}) == 8
    run_dirs = [cluster.run_dir(o["run_id"]) for o in outcomes]
    wait_for(lambda: all(state_of(d).get("phase") == "workload" for d in run_dirs), 240,
             "all 8 runs in flight at once")
    states = [state_of(d) for d in run_dirs]
    assert sorted(s["gpu"]["index"] for s in states) == list(range(8))  # one GPU each, none shared
    assert all(str(s["gpu"]["index"]) in s["slurm"]["allocated_gpus"] for s in states)
    cluster.gate.unlink()
    wait_for(lambda: all(state_of(d).get("status") == "passed" for d in run_dirs), 240, "all 8 runs pass")


def test_a_preempted_run_reads_as_such(cluster):
    cluster.gate.write_text("closed")
    [outcome] = cluster.detach()
    run_dir = cluster.run_dir(outcome["run_id"])
    wait_for(lambda: state_of(run_dir).get("phase") == "workload", 120, "the run reaches its workload")
    cluster.slurm.client("sbatch", "--parsable", "--partition=urgent", "--gres=gpu:8", "-o", "/dev/null", "--wrap",
                         "sleep 300", check=True)  # a higher tier wants every GPU: ours is preempted
    run = wait_for(lambda: (s := state_of(run_dir)).get("slurm_settled") and s, 60, "the run is settled")
    assert run["status"] == "failed" and run["ended_by"] == "PREEMPTED", run
    assert "the job was preempted" in run["message"] and "what the run wrote is kept" in run["message"]
    assert '"phase": "workload"' in (run_dir / "raw" / "events.jsonl").read_text()


def test_a_job_slurm_no_longer_knows_ends_its_run_with_that_said(cluster):
    """A run whose job ended without a record (its node lost, squeue's memory gone, no accounting) is not left
    running forever: once Slurm has said for a few seconds that it knows nothing of the job, the run reads error."""
    run_dir = cluster.login.root / "tasks" / "ghost" / "runs" / "20261123-000000-abcdef"
    (run_dir / "raw").mkdir(parents=True)
    (run_dir / "state.json").write_text(json.dumps({"run_id": run_dir.name, "task": "ghost", "status": "running",
                                                    "phase": "workload", "scheduler": "slurm", "job_id": "999999"}))

    def ghost() -> dict:
        [answer] = json.loads(cluster.inv("status", "--host", "cluster", "--task", "ghost", "--json").stdout)["hosts"]
        return answer["runs"][0]

    assert ghost()["status"] == "running"  # the first look only notes that Slurm does not know the job
    run = wait_for(lambda: (r := ghost())["status"] != "running" and r, 30, "the run ends", poll=1)
    assert run["status"] == "error" and run["ended_by"] == "UNKNOWN", run
    assert "Slurm no longer knows the job" in run["message"] and "without recording an end" in run["message"]


def test_a_bad_sbatch_setting_is_refused_before_anything_is_submitted(cluster, slurm, login, rig, tmp_path):
    before = slurm.client("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()
    bad = make_cluster(tmp_path / "bad", slurm, login, rig, sbatch_args=["--output=/tmp/elsewhere"])
    done = bad.inv("run", "--host", "cluster", "--task", "tiny_rmsnorm")
    assert done.returncode == 2, done.stderr
    assert f"{bad.hosts_toml}: [hosts.cluster] sbatch_args" in done.stderr and "--output is not allowed" in done.stderr
    assert "Traceback" not in done.stderr
    refused = make_cluster(tmp_path / "refused", slurm, login, rig, partition="nosuch")
    runs = login.root / "tasks" / "tiny_rmsnorm" / "runs"
    earlier = set(runs.glob("*"))
    done = refused.inv("run", "--host", "cluster", "--task", "tiny_rmsnorm", "--json")
    assert done.returncode == 2 and "Invalid partition name" in done.stdout + done.stderr, done.stdout + done.stderr
    assert slurm.client("squeue", "-h", "-t", "all", "-o", "%i").stdout.split() == before  # nothing submitted
    # the refused run leaves a record that says why, where a user looks; the error names it
    [run_id] = [p.name for p in set(runs.glob("*")) - earlier]
    assert f"recorded as run {run_id}" in done.stdout, done.stdout
    status = refused.inv("status", "--host", "cluster", "--task", "tiny_rmsnorm", "--json")
    [answer] = json.loads(status.stdout)["hosts"]
    [run] = [r for r in answer["runs"] if r["run_id"] == run_id]
    assert run["status"] == "error" and "Invalid partition name" in run["message"], run
    table = refused.inv("status", "--host", "cluster", "--task", "tiny_rmsnorm").stdout
    lines = [line for line in table.splitlines() if run_id in line]  # its row, and why it ended on a line of its own
    assert "error" in lines[0] and any("Invalid partition name" in line for line in lines), table
    logs = refused.inv("logs", "--host", "cluster", "--run", run_id).stdout
    assert "done: error (exit code 2)" in logs and "Invalid partition name" in logs, logs


def test_hosts_check_asks_slurm_what_a_run_needs(cluster, slurm, login, rig, bare_login, tmp_path):
    """Reachable is not enough: sinfo must answer in the login node's non-interactive session, the partition exist,
    and sbatch --test-only take the host's settings."""
    def checked(made: Cluster) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
        done = made.inv("hosts", "--check", "--json")
        return done, {h["name"]: h["check"] for h in json.loads(done.stdout)["hosts"]}

    done, hosts = checked(cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c["check"] for c in hosts["cluster"]["slurm"]["checks"]] == ["sinfo", "partition", "sbatch"]
    assert "partition debug exists" in hosts["cluster"]["slurm"]["checks"][1]["detail"], hosts["cluster"]
    assert "to start at" in hosts["cluster"]["slurm"]["checks"][2]["detail"], hosts["cluster"]  # Slurm's own answer

    nosuch = make_cluster(tmp_path / "nosuch", slurm, login, rig, partition="nosuch")
    done, hosts = checked(nosuch)
    assert done.returncode == 1 and not hosts["cluster"]["ok"], done.stdout
    assert hosts["cluster"]["error"] == "cluster: Slurm: partition: partition nosuch is not one of this cluster's " \
                                       "(debug, urgent)", hosts["cluster"]
    table = nosuch.inv("hosts", "--check").stdout
    [line] = [line.split() for line in table.splitlines() if line.startswith("cluster ")]
    assert line[5:7] == ["yes", "no"], table  # reachable yes, slurm no
    assert "partition nosuch is not one of this cluster's" in table, table

    # a login node whose non-interactive sessions do not get SLURM_CONF: sinfo cannot reach Slurm
    done = bare_cluster(rig, bare_login, slurm, tmp_path).inv("hosts", "--check", "--json")
    [host] = json.loads(done.stdout)["hosts"]
    assert done.returncode == 1 and host["check"]["python"] and not host["check"]["ok"], done.stdout
    assert host["check"]["error"] == "bare-login: Slurm: sinfo: sinfo failed: Could not establish a configuration " \
                                     "source", host["check"]  # Slurm's own line


def test_the_rig_finds_its_recipe_beside_the_checkout(tmp_path):
    from slurm_rig import recipe_dir

    recipe = tmp_path / "shared" / "reference" / "slurm-one-node"
    recipe.mkdir(parents=True)
    assert recipe_dir(tmp_path / "wt" / "checkout" / "tests" / "slurm_rig.py") == recipe
    assert recipe_dir(tmp_path / "elsewhere" / "tests" / "slurm_rig.py") == recipe
    assert recipe_dir(Path("/nonexistent-root/checkout/tests/slurm_rig.py")) is None


def test_the_documented_one_node_slurm_runs_a_task(tmp_path):
    """docs/slurm.md's "Trying it on this machine", as written: `python tests/slurm_rig.py up DIR`, then the printed
    SLURM_CONF and hosts.toml: hosts --check, a run; kill stops every daemon."""
    base = Path(tempfile.mkdtemp(prefix="kp-slurm-up-", dir="/tmp"))
    up = subprocess.Popen([sys.executable, str(REPO / "tests" / "slurm_rig.py"), "up", str(base)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = [up.stdout.readline() for _ in range(6)]
        assert said[0].startswith("up: a one-node Slurm") and said[-1].startswith("Ctrl-C (or kill) stops it"), said
        [conf] = re.findall(r"export SLURM_CONF=(\S+)", "".join(said))
        [hosts] = re.findall(r"hosts.toml: (\S+)", "".join(said))
        project = tmp_path / "project"
        shutil.copytree(TINY, project / "kernels" / "tiny_rmsnorm")
        env = {**os.environ, "SLURM_CONF": conf, "KPREMOTE_CACHE": str(project / ".cache"), "NO_COLOR": "1"}

        def inv(*args: str) -> subprocess.CompletedProcess:
            argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "--hosts", hosts, *args[1:]]
            return subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300)

        check = inv("hosts", "--check", "--json")
        assert check.returncode == 0 and json.loads(check.stdout)["hosts"][0]["check"]["slurm"]["ok"], check.stdout
        done = inv("run", "--host", "local-slurm", "--task", "tiny_rmsnorm", "--workloads", SMALL)
        assert done.returncode == 0 and "submitted as Slurm job" in done.stderr, done.stdout + done.stderr
        assert "tiny_rmsnorm: passed (exit code 0)" in done.stdout, done.stdout
    finally:
        up.terminate()
        up.wait(timeout=60)
    assert up.returncode == 0
    assert not [pid for pid in processes_mentioning(str(base)) if pid != os.getpid()]  # the daemons are gone
    shutil.rmtree(base, ignore_errors=True)


def test_the_slurm_benchmark_runs_at_its_smallest_size():
    """benchmarks/bench_slurm.py keeps working (its own Slurm and login node; no timing assertion)."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_slurm.py"), "--repeats", "1",
                           "--parallel", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kpremote overhead" in done.stdout and "| 2 |" in done.stdout and "yes (" in done.stdout, done.stdout


# ------------------------------------------------------------------------------------------ last in this file
# The time-limited run (fixture time_limited) ends 60-90 s after the file's first cluster test: every test that
# needs no node down runs before its check (the two with Slurms of their own too), so the check rarely waits; a node
# set down or drained would end that run, so those two come after it.


def test_a_time_limit_reads_as_a_timeout_in_every_record(time_limited):
    """Slurm's TIMEOUT is what every record says: the run's own end line, state, `inv logs`, results.json,
    results.md and `inv history`; never a cancel."""
    made, client, run_dir, job_id = time_limited
    out, err = client.communicate(timeout=150)
    made.gate.unlink(missing_ok=True)
    printed = out + err
    assert client.returncode == 1, printed
    assert "cancelled" not in printed and "exit code 130" not in printed, printed
    assert "failed (exit code 1)" in printed and f"Slurm job {job_id} TIMEOUT" in printed, printed
    [answer] = json.loads(made.inv("status", "--host", "short", "--json").stdout)["hosts"]
    [run] = [r for r in answer["runs"] if r["run_id"] == run_dir.name]
    assert run["status"] == "failed" and run["ended_by"] == "TIMEOUT", run
    assert "reached its time limit" in run["message"] and "what the run wrote is kept" in run["message"], run
    assert made.job(job_id)["JobState"] == "TIMEOUT"
    logs = made.inv("logs", "--host", "short", "--run", run_dir.name).stdout
    [done_line] = [line for line in logs.splitlines() if "done: " in line]
    assert "done: failed (exit code 1)" in done_line and "reached its time limit" in done_line, logs
    events = (run_dir / "raw" / "events.jsonl").read_text()
    assert '"phase": "workload"' in events  # what it wrote before the limit is kept
    fetched = made.path / "kernels" / "gated" / "results" / "short" / run_dir.name
    results = json.loads((fetched / "results.json").read_text())
    assert (results["status"], results["ended_by"], results["exit_code"]) == ("failed", "TIMEOUT", 1), results
    markdown = (fetched / "results.md").read_text()
    assert "Status: **failed**" in markdown and "reached its time limit" in markdown, markdown
    history = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "history", "--task", "gated",
                              "--json"], cwd=made.path, env=made.env, capture_output=True, text=True, timeout=120)
    [entry] = [e for e in json.loads(history.stdout)["runs"] if e["run_id"] == run_dir.name]
    assert entry["status"] == "failed", entry


def test_a_node_set_down_mid_run_reads_as_such(cluster):
    cluster.gate.write_text("closed")
    [outcome] = cluster.detach()
    run_dir = cluster.run_dir(outcome["run_id"])
    wait_for(lambda: state_of(run_dir).get("phase") == "workload", 120, "the run reaches its workload")
    cluster.slurm.set_node("down", reason="kp-test-maintenance")
    try:
        def ended() -> dict:
            [answer] = json.loads(cluster.inv("status", "--host", "cluster", "--json").stdout)["hosts"]
            [run] = [r for r in answer["runs"] if r["run_id"] == outcome["run_id"]]
            return run if run["status"] in ("failed", "error", "cancelled", "passed") else {}

        run = wait_for(ended, 60, "the run ends")
    finally:
        cluster.slurm.resume_node()
    assert run["status"] == "failed" and run["ended_by"] == "NODE_FAIL", run
    assert "NODE_FAIL" in run["message"] and "what the run wrote is kept" in run["message"]
    assert "node vm: kp-test-maintenance" in run["message"].replace(cluster.slurm.node, "vm"), run["message"]
    assert (run_dir / "raw" / "events.jsonl").stat().st_size > 0


def test_gpu_status_shows_a_draining_node_and_a_slurm_it_cannot_reach_apart(cluster, rig, bare_login, tmp_path):
    blocker = cluster.slurm.client("sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300",
                                   check=True).stdout.decode().strip()
    wait_for(lambda: cluster.job(blocker)["JobState"] == "RUNNING", 30, "a job runs on the node")
    cluster.slurm.set_node("drain", reason="maintenance test")
    try:
        table = cluster.inv("gpu-status", "--host", "cluster").stdout
        [line] = [line for line in table.splitlines() if f"│ {cluster.slurm.node} " in line]
        assert "draining: maintenance test" in line, table  # jobs still on it: Slurm's "drng"
        cluster.slurm.client("scancel", blocker, check=True)
        wait_for(lambda: cluster.slurm.node_state() == "drain", 90, "the node is drained")  # a loaded slurmd ends the job late
        table = cluster.inv("gpu-status", "--host", "cluster").stdout
        assert "drained: maintenance test" in table, table
    finally:
        cluster.slurm.resume_node()

    done = bare_cluster(rig, bare_login, cluster.slurm, tmp_path).inv("gpu-status")
    assert done.returncode == 1, done.stdout + done.stderr
    [row] = [line.split("│")[1:-1] for line in done.stdout.splitlines() if line.startswith("│ bare-login ")]
    assert [cell.strip() for cell in row[:4]] == ["bare-login", "-", "", "no answer"], done.stdout
    assert "Could not establish a configuration source" in done.stdout.split("│ bare-login ", 1)[1].split("\n", 1)[1]
