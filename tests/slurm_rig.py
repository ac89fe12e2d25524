"""A real one-node Slurm for the tests: a private munged, slurmctld and slurmd with 8 fake GPUs, all on this machine.

Everything lives under one folder (config, munge key and socket, state, spool, logs) and listens on free ports, so
it never touches /etc/slurm or a Slurm the machine may already run. Clients reach it through SLURM_CONF (the login
node, one of tests/rig.py's loopback sshd hosts, gets it in its environment). The fake GPUs are character devices
with /dev/null's numbers (gres needs a file per GPU); the node declares more CPUs than the machine has, so 8 one-GPU
jobs run at once on 2 cores. The recipe it follows, shared/reference/slurm-one-node/README.md, lies beside the
checkout (recipe_dir() finds it from here).

To try kpremote on it by hand (docs/slurm.md, "Trying it on this machine"), as root:

    python tests/slurm_rig.py up [DIR]     # prints SLURM_CONF and a hosts.toml for it; Ctrl-C (or kill) stops it
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

GPUS = 8
PARTITION = "debug"
URGENT = "urgent"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}


def missing_tools() -> list[str]:
    """The daemons and client commands this rig needs that are not installed (scripts/test.sh installs them)."""
    needed = [*DAEMONS.values(), "sbatch", "squeue", "sinfo", "scancel", "scontrol"]
    return [tool for tool in needed if not (shutil.which(tool) or Path(tool).exists())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_fake_gpus(count: int = GPUS) -> list[Path]:
    """/dev/fakegpuN: character devices with /dev/null's numbers (1, 3), one per fake GPU."""
    paths = []
    for index in range(count):
        path = Path(f"/dev/fakegpu{index}")
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
        paths.append(path)
    return paths


@dataclass
class SlurmRig:
    base: Path
    node: str = field(default_factory=socket.gethostname)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)  # job ids cancel_all leaves alone

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, ...) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> "SlurmRig":
        """Bring the cluster up; if any part fails, what did start is stopped again before the error goes on."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "SlurmRig":
        self.base.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "spool", "munge", "log"):
            (self.base / sub).mkdir(exist_ok=True)
        make_fake_gpus()
        self._start_munge()
        self._write_config()
        self._spawn("slurmctld", [DAEMONS["slurmctld"], "-D", "-f", str(self.conf)])
        self._wait(lambda: b"UP" in self.scontrol("ping").stdout, "slurmctld answers ping")
        self._spawn("slurmd", [DAEMONS["slurmd"], "-D", "-f", str(self.conf)])
        self._wait(lambda: self.node_state() == "idle", "the node is idle")
        return self

    def _start_munge(self) -> None:
        # munged insists: every folder on the socket's path traversable by all, the key private to munge.
        munge = self.base / "munge"
        secret = munge / "secret"
        secret.mkdir(exist_ok=True)
        key = secret / "munge.key"
        key.write_bytes(os.urandom(128))
        munge_user = pwd.getpwnam("munge")
        for path in (munge, secret, key):
            os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
        self.base.chmod(0o755)
        munge.chmod(0o755)
        secret.chmod(0o700)
        key.chmod(0o600)
        self._spawn("munged", ["runuser", "-u", "munge", "--", DAEMONS["munged"], "--foreground",
                               f"--socket={self.munge_socket}", f"--key-file={key}", f"--log-file={munge / 'log'}",
                               f"--pid-file={munge / 'pid'}", f"--seed-file={munge / 'seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "socket"

    def _write_config(self) -> None:
        lines = [
            "ClusterName=kptest",
            f"SlurmctldHost={self.node}",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill",
            "ReturnToService=1",  # a node set down by hand stays down until resumed, as on a real cluster
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            f"SlurmctldPidFile={self.base / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.base / 'slurmd.pid'}",
            f"SlurmdSpoolDir={self.base / 'spool'}",
            f"StateSaveLocation={self.base / 'state'}",
            f"SlurmctldLogFile={self.base / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.base / 'log' / 'slurmd.log'}",
            "SlurmdParameters=config_overrides",
            f"NodeName={self.node} CPUs=16 RealMemory=20000 Gres=gpu:{GPUS} State=UNKNOWN",
            # jobs of the `urgent` partition preempt (cancel) those of `debug`: preemption, tried for real
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO "
            "PriorityTier=1",
            f"PartitionName={URGENT} Nodes={self.node} MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=2",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (self.base / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={self.node} Name=gpu File=/dev/fakegpu[0-{GPUS - 1}]\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True,
                                            env={**os.environ, **self.env})

    def _wait(self, condition, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}: "
                                       f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm rig: {what}: not within {timeout:g} s")
            time.sleep(0.1)

    def log_tail(self, name: str) -> str:
        for path in (self.base / "log" / f"{name}.log", self.base / "log" / f"{name}.out"):
            if path.exists() and path.stat().st_size:
                return path.read_text(errors="replace")[-800:]
        return "(no log)"

    def client(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, env={**os.environ, **self.env}, timeout=60,
                              check=check)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.client("scontrol", *args)

    def node_state(self) -> str:
        done = self.client("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%t")  # one line per partition otherwise
        return done.stdout.decode().strip()

    def set_node(self, state: str, reason: Optional[str] = None) -> None:
        args = [f"nodename={self.node}", f"state={state}"]
        if reason:
            args.append(f"reason={reason}")
        self.scontrol("update", *args).check_returncode()

    def resume_node(self) -> None:
        """Back to service after a test set it down (ReturnToService=1 leaves that to an admin: here, the test)."""
        if self.node_state().rstrip("*") not in ("idle", "mix", "alloc"):
            self.set_node("resume")
        self._wait(lambda: self.node_state() in ("idle", "mix", "alloc"), "the node is back")

    def cancel_all(self) -> None:
        """Cancel every job but the kept ones (a test's job that outlives it on purpose), and wait until gone."""
        def others() -> list[str]:
            return [job for job in self.client("squeue", "-h", "-o", "%i").stdout.decode().split()
                    if job not in self.kept]

        if others():
            self.client("scancel", "--full", *others())
        self._wait(lambda: not others(), "the queue is empty", timeout=60)

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def recipe_dir(start: Path = Path(__file__).resolve()) -> Optional[Path]:
    """shared/reference/slurm-one-node beside the checkout (in a folder above it), None where there is none."""
    for ancestor in start.parents:
        candidate = ancestor / "shared" / "reference" / "slurm-one-node"
        if candidate.is_dir():
            return candidate
    return None


def hosts_toml(rig: SlurmRig) -> Path:
    """A hosts.toml whose one host is this machine as a Slurm login node (transport local: no SSH; its remote_root
    is shared with the node, the same machine), asking for one of the fake GPUs."""
    path = rig.base / "hosts.toml"
    path.write_text("[hosts.local-slurm]\n"
                    'transport = "local"\n'
                    'scheduler = "slurm"\n'
                    'arch = "any"\n'
                    f'remote_root = "{rig.base / "kpremote"}"\n'
                    f'partition = "{PARTITION}"\n'
                    'gres = "gpu:1"\n'
                    'time_limit = "10"\n')
    return path


def main(argv: list[str]) -> int:
    """`up [DIR]`: bring the rig up (in DIR, else a new folder under /tmp), say how to use it, stop it on Ctrl-C."""
    if not argv or argv[0] != "up" or len(argv) > 2:
        print("usage: python tests/slurm_rig.py up [DIR]   (as root; Ctrl-C or kill stops it)", file=sys.stderr)
        return 2
    if missing_tools():
        print(f"missing: {', '.join(missing_tools())} (apt-get install {' '.join(PACKAGES)})", file=sys.stderr)
        return 2
    import tempfile

    base = Path(argv[1]).resolve() if len(argv) == 2 else Path(tempfile.mkdtemp(prefix="kp-slurm-", dir="/tmp"))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it, even started in the background
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # and so does kill
    rig = SlurmRig(base).start()
    try:
        recipe = recipe_dir()
        print(f"up: a one-node Slurm (node {rig.node}, {GPUS} fake GPUs, partitions {PARTITION} and {URGENT}) "
              f"in {base}\n"
              f"  export SLURM_CONF={rig.conf}     # for sinfo, squeue, sbatch and inv in this shell\n"
              f"  hosts.toml: {hosts_toml(rig)}\n"
              f"  inv run --hosts {rig.base / 'hosts.toml'} --host local-slurm --task T\n"
              f"  recipe: {recipe / 'README.md' if recipe else 'shared/reference/slurm-one-node (not found)'}\n"
              "Ctrl-C (or kill) stops it.", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        rig.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
