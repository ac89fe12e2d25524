"""Issue 27's hardware steps and issue 33's neighbours on one host of N GPUs, through `inv` over SSH as a user runs it.

Run by benchmarks/gpu/x4_host.sh (which makes the GPU machine an SSH host first), or with --dry on a machine without
a GPU: then the host is a real OpenSSH server on loopback whose GPUs are the NVML fixture (docs/nvml-fixture.md), the
runs run on the CPU, and a foreign process is a fixture entry naming a real, idle process. Six steps, each in its own
time box, each independent (a step that fails or times out is logged, its runs are cancelled, the next one runs):

  1. `inv gpu-status -u` at 80 columns and wide: every GPU with its UUID.
  2. N `inv run`s at once from N checkouts land on N GPUs and pass; an N+1th with --wait takes the first GPU that
     frees; one without --wait says which runs hold the GPUs.
  3. A foreign process on one GPU: a run skips it, gpu-status says why, `--gpu <its uuid>` is refused; started
     mid-run on a neighbouring GPU it voids nothing, on the run's own GPU it voids the run's rows.
  4. CUDA_VISIBLE_DEVICES=1 (client and host) changes no lease; a client killed with SIGKILL leaves its run going
     and the next run takes the GPU when it ends; a holder killed on the host leaves a stale lease that is reclaimed.
  5. The arch gate: copies of a task marked for the other models are refused with the reason; one marked for this
     model runs.
  6. Issue 33: a task's rows alone, N at once, alone again, audit on (benchmarks/gpu/neighbours.sh).

Steps 1 to 5 are one device call (the default; 358 s on 4 x H200, 2026-11-26). Step 6 does not fit after them (it
took 231 s for fuse_scale_shift's three rows that day) and is a second call: `X4_STEPS=6 bash
benchmarks/gpu/x4_host.sh`.

Writes at most 8 files under --out (the device tool's limit): summary.md (one table of checks, then each step's
table), step1.log ... step6.log (every command and its output, as a user saw it) and logs.tgz (the fetched results).
Exit code 0 only when every check that ran passed and none was left unrun.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[2]
TASK = "redteam_control_fast"
ROWS = "tiny,mid"  # a dry run (CPU) times only tiny, the smoke row
ALIAS = "x4"
FUSE = "h200_diffusion_fuse_scale_shift__multi_shape"
FUSE_ROWS = "qwen_s19_c3072_bcast11,qwen_s47_c3072_bcast11,qwen_s4096_c3072_bcast11"  # two small, one >= 15 us
# Seconds each step may take at most; the whole call is held to --budget on top (later steps get what is left).
# Step 6 runs as a call of its own (X4_STEPS=6): its box is most of that call (three rows took 231 s on 4 x H200).
BOXES = {1: 45, 2: 150, 3: 130, 4: 130, 5: 70, 6: 400}
STEPS_DEFAULT = "1,2,3,4,5"  # step 6 does not fit after them in one call
BUDGET_S = 470  # the steps' share of one device call of about 8 minutes (sshd's start comes before)
# What each step is asked to keep back for every step after it when the budget runs short.
RESERVE_S = 25
PROBE_EVERY_S = 0.5  # step 4: how often nvidia-smi's compute processes are sampled while its run runs
SETTLE_S = 30  # how long a step's end waits for every GPU to be idle again
DRY_SLOWER = 3  # a dry run's boxes and budget: its runs run on the CPU (Triton's interpreter), on a shared machine
FOREIGN_MIB = 8192
FOREIGN_SCRIPT = r"""
import sys, torch
sys.stdin.readline()                       # "go": the CUDA context appears only now, when the caller wants it
hold = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
print("foreign: holding", sys.argv[1], "MiB and spinning matrix products", flush=True)
while True:
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
"""


class StepTimeout(Exception):
    """A step's time box ran out."""


# ------------------------------------------------------------------------------------------------ bookkeeping


@dataclass
class Check:
    """One line of summary.md: what was checked, its result, and what showed it."""

    step: int
    what: str
    result: str  # "ok", "FAILED" or "not run: why"
    evidence: str = ""


@dataclass
class Box:
    """One step's deadline."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def check(self) -> None:
        if self.left() <= 0:
            raise StepTimeout(f"the step's time box of {self.seconds:.0f} s ran out")


class Log:
    """A step's log file under OUT; progress lines also go to stdout with the seconds since the call began."""

    def __init__(self, path: Path, began: float) -> None:
        self.path, self.began = path, began
        self.file = open(path, "a")

    def say(self, line: str) -> None:
        stamp = f"[{time.monotonic() - self.began:6.1f} s]"
        print(f"{stamp} {line}", flush=True)
        self.file.write(f"{stamp} {line}\n")
        self.file.flush()

    def block(self, title: str, text: str) -> None:
        self.file.write(f"--- {title}\n{text.rstrip()}\n---\n")
        self.file.flush()


@dataclass
class Done:
    """A command that ended: its output (stdout and stderr together) and exit code."""

    output: str
    code: Optional[int]
    seconds: float

    def last_line(self) -> str:
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def error(self) -> str:
        """From the `error:` line on, one line ("a / b / c"); else the last line."""
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
        return " / ".join(lines[start:]) if start is not None else self.last_line()


# ------------------------------------------------------------------------------------------------ the host


class Host:
    """The SSH host `x4` (this machine), its GPUs, its remote root, and how a foreign process is made on it."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.dry = args.dry
        self.work = work
        self.hosts_toml = work / "hosts.toml"
        self.gpus: list[dict[str, Any]] = []
        self.model = "?"
        self.driver = "?"
        self.rig = None
        self.rig_host = None
        self.foreign: Optional[subprocess.Popen] = None
        self.foreign_gpu: Optional[dict[str, Any]] = None
        if self.dry:
            self._start_rig(args.gpus, args.model)
        else:
            self.remote_root = Path.home() / "kpremote-x4"
            shutil.rmtree(self.remote_root, ignore_errors=True)
        self.python_cvd = work / "python-cvd1"
        self.python_cvd.write_text(f'#!/bin/sh\nCUDA_VISIBLE_DEVICES=1 exec {self.python} "$@"\n')
        self.python_cvd.chmod(0o755)

    @property
    def python(self) -> str:
        return sys.executable

    def _start_rig(self, count: int, model: str) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        import rig  # the test rig: a real sshd on loopback with an NVML fixture

        (self.work / "rig").mkdir()
        self.rig = rig.Rig(self.work / "rig")
        name, memory = {"h100": ("NVIDIA H100 80GB HBM3", 81559), "h200": ("NVIDIA H200", 143771)}[model]
        self.fixture_gpus = [rig.idle_gpu(i, name=name, memory_total_mib=memory,
                                          uuid=f"GPU-{i:08x}-dry0-{model}-fixture") for i in range(count)]
        self.rig_host = self.rig.add_host(ALIAS, gpus=self.fixture_gpus)
        self.remote_root = self.rig_host.root

    def write_hosts(self, arch: str) -> None:
        """hosts.toml: `x4` (this host, `arch` as detected), `x4-cvd` (its python run with CUDA_VISIBLE_DEVICES=1)
        and `x4-other` (the other model's arch: its GPUs show "wrong arch")."""
        other = {"h100": "h200", "h200": "h100"}.get(arch, "b200")
        if self.dry:
            entry = self.rig_host.hosts_entry()
            defaults = f'[defaults]\nknown_hosts = "{self.rig.known_hosts}"\n\n'
        else:
            entry = {"ssh": "root@127.0.0.1:2222", "identity_file": "~/.ssh/kpremote_test", "python": self.python,
                     "remote_root": "~/kpremote-x4"}
            defaults = ""
        tables = []
        for alias, changes in ((ALIAS, {"arch": arch}), (f"{ALIAS}-cvd", {"arch": arch, "python": str(self.python_cvd)}),
                               (f"{ALIAS}-other", {"arch": other})):
            values = {**entry, **changes}
            tables.append(f"[hosts.{alias}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
        self.hosts_toml.write_text(defaults + "\n".join(tables))

    # -- reading the host's records (this machine is the host: its remote root is a local folder)

    def states(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.remote_root.glob("tasks/*/runs/*/state.json")):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return found

    def lock_record(self, uuid: str) -> str:
        path = self.remote_root / "locks" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', uuid)}.lock"
        try:
            return path.read_text().strip() or "(empty: released)"
        except OSError:
            return "(no lock file)"

    def compute_apps(self) -> str:
        """Which GPU each compute process is on, by UUID (nvidia-smi; nothing to ask in a dry run)."""
        if self.dry:
            return "(dry run: no nvidia-smi)"
        done = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return (done.stdout + done.stderr).strip() or "(no compute processes)"

    # -- a foreign process: another user's job, started outside kpremote

    def start_foreign(self, gpu: dict[str, Any], log: Log) -> None:
        self.stop_foreign(log)
        if self.dry:  # a real process that does nothing; the fixture names it on its GPU at "go"
            self.foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        else:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu["uuid"]}
            self.foreign = subprocess.Popen([sys.executable, "-c", FOREIGN_SCRIPT, str(FOREIGN_MIB)], env=env,
                                            stdin=subprocess.PIPE, stdout=log.file, stderr=subprocess.STDOUT,
                                            text=True)
        self.foreign_gpu = gpu
        log.say(f"foreign process pid {self.foreign.pid} made ready for GPU {gpu['index']} ({gpu['uuid']})")

    def go_foreign(self, log: Log) -> None:
        """Let the ready foreign process take its GPU (real: it creates its CUDA context and allocates now)."""
        if self.dry and self.foreign is not None:
            entry = {"pid": self.foreign.pid, "name": "python3", "used_mib": FOREIGN_MIB}
            self._set_fixture(self.foreign_gpu["index"], processes=[entry], memory_used_mib=FOREIGN_MIB + 500,
                              util_pct=100)
        elif self.foreign is not None and self.foreign.stdin is not None:
            self.foreign.stdin.write("go\n")
            self.foreign.stdin.flush()
        log.say("foreign process: go")

    def stop_foreign(self, log: Log) -> None:
        if self.foreign is None:
            return
        self.foreign.kill()
        self.foreign.wait()
        if self.dry and self.foreign_gpu is not None:
            self._set_fixture(self.foreign_gpu["index"], processes=[], memory_used_mib=1, util_pct=0)
        log.say(f"foreign process pid {self.foreign.pid} stopped")
        self.foreign = self.foreign_gpu = None

    def _set_fixture(self, index: int, **values: Any) -> None:
        self.fixture_gpus[index].update(values)
        self.rig_host.set_gpus(self.fixture_gpus)

    def close(self, log: Log) -> None:
        self.stop_foreign(log)
        if self.rig is not None:
            self.rig.stop_all()


# ------------------------------------------------------------------------------------------------ the checkouts


class Panes:
    """N+2 copies of the project (the users' panes), each its own kernels/ and results."""

    def __init__(self, work: Path, count: int) -> None:
        self.work = work
        self.folders = [work / f"pane-{i}" for i in range(1, count + 1)]
        skip = shutil.ignore_patterns("__pycache__")
        sys.path.insert(0, str(REPO / "tests" / "fixtures" / "redteam"))
        import redteam_kit

        control = next(a for a in redteam_kit.load_attacks() if a.id == "control_fast")
        for folder in self.folders:  # what a user's checkout needs for `inv`: kpremote, tasks.py, the project files
            shutil.copytree(REPO / "kpremote", folder / "kpremote", ignore=skip)
            for name in ("tasks.py", "pyproject.toml", "hosts.toml"):
                shutil.copy(REPO / name, folder / name)
            redteam_kit.assemble(control, folder / "kernels")

    def __getitem__(self, i: int) -> Path:
        return self.folders[i]

    def copy_task(self, pane: Path, name: str, arch: str) -> None:
        """kernels/<name>: the control task marked for `arch` (the arch gate's subject)."""
        target = pane / "kernels" / name
        shutil.copytree(pane / "kernels" / TASK, target, dirs_exist_ok=True)
        toml = target / "task.toml"
        text = re.sub(r'(?m)^name = ".*"$', f'name = "{name}"', toml.read_text())
        toml.write_text(re.sub(r'(?m)^arch = .*$', f'arch = "{arch}"', text))

    def fetched(self, pane: Path, task: str = TASK) -> list[dict[str, Any]]:
        """Every results.json fetched into this pane for the task, oldest first."""
        found = sorted(pane.glob(f"kernels/{task}/results/*/*/results.json"))
        return [json.loads(p.read_text()) for p in found]


# ------------------------------------------------------------------------------------------------ running inv


class Inv:
    """`python -m invoke` in a pane, against hosts.toml, as a user types it; every call logged."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.background: list[subprocess.Popen] = []

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "invoke", *args, "--hosts", str(self.host.hosts_toml)]

    def env(self, columns: int = 160, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        return {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", **(extra or {})}

    def run(self, pane: Path, *args: str, log: Log, box: Box, columns: int = 160,
            extra_env: Optional[dict[str, str]] = None, quiet: bool = False) -> Done:
        """quiet: a poll, logged as one line (its output only when it failed)."""
        shown = " ".join(args)
        if not quiet:
            log.say(f"{pane.name}$ inv {shown}")
        t0 = time.monotonic()
        try:
            done = subprocess.run(self.command(*args), cwd=pane, env=self.env(columns, extra_env), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=max(1.0, box.left()))
            result = Done(done.stdout, done.returncode, time.monotonic() - t0)
        except subprocess.TimeoutExpired as exc:
            output = exc.output.decode() if isinstance(exc.output, bytes) else (exc.output or "")
            log.block(f"inv {shown} (cut off by the time box)", output)
            raise StepTimeout(f"`inv {shown}` outlasted the step's time box") from None
        if quiet and result.code == 0:
            log.file.write(f"(poll) inv {shown}  -> exit 0 in {result.seconds:.1f} s\n")
        else:
            log.block(f"inv {shown}  -> exit {result.code} in {result.seconds:.1f} s", result.output)
        return result

    def start(self, pane: Path, *args: str, log: Log, extra_env: Optional[dict[str, str]] = None) -> "Started":
        path = self.host.work / f"{pane.name}-{len(self.background)}.out"
        log.say(f"{pane.name}$ inv {' '.join(args)} &")
        proc = subprocess.Popen(self.command(*args), cwd=pane, env=self.env(160, extra_env), text=True,
                                stdout=open(path, "w"), stderr=subprocess.STDOUT)
        self.background.append(proc)
        return Started(pane, " ".join(args), proc, path, time.monotonic())

    def stop_all(self, log: Log) -> None:
        """Ctrl-C for every client still going (that cancels its run), SIGKILL for one that ignores it."""
        alive = [p for p in self.background if p.poll() is None]
        for proc in alive:
            proc.send_signal(signal.SIGINT)
        for proc in alive:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if alive:
            log.say(f"stopped {len(alive)} client(s) still running at the step's end")
        self.background = []


@dataclass
class Started:
    """An `inv` started in the background."""

    pane: Path
    shown: str
    proc: subprocess.Popen
    path: Path
    t0: float
    ended_at: Optional[float] = None

    def wait(self, box: Box, log: Log) -> Done:
        try:
            code = self.proc.wait(timeout=max(1.0, box.left()))
        except subprocess.TimeoutExpired:
            log.block(f"{self.pane.name}: inv {self.shown} (still running when the time box ran out)", self.output())
            raise StepTimeout(f"`inv {self.shown}` outlasted the step's time box") from None
        self.ended_at = self.ended_at or time.monotonic()
        done = Done(self.output(), code, self.ended_at - self.t0)
        log.block(f"{self.pane.name}: inv {self.shown}  -> exit {code} in {done.seconds:.1f} s", done.output)
        return done

    def output(self) -> str:
        try:
            return self.path.read_text()
        except OSError:
            return ""


class StepFailed(Exception):
    """Something the step waits for cannot come any more."""


def poll(box: Box, what: Callable[[], Any], every: float = 0.5, clients: tuple["Started", ...] = ()) -> Any:
    """what()'s first truthy answer, polling until the box runs out or one of `clients` ends first."""
    while True:
        answer = what()
        if answer:
            return answer
        ended = next((c for c in clients if c.proc.poll() is not None), None)
        if ended is not None:
            raise StepFailed(f"`inv {ended.shown}` ended (exit {ended.proc.returncode}) before the step could go on: "
                             f"{Done(ended.output(), ended.proc.returncode, 0).error()[:400]}")
        box.check()
        time.sleep(every)


def watch_ends(started: list[Started], box: Box) -> None:
    """Note when each background client ends (to order them), until all have."""
    while any(s.ended_at is None for s in started):
        for s in started:
            if s.ended_at is None and s.proc.poll() is not None:
                s.ended_at = time.monotonic()
        box.check()
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------ reading results


def run_id(results: Optional[dict[str, Any]]) -> Optional[str]:
    return ((results or {}).get("provenance") or {}).get("run_id")


def leased(host: "Host", results: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The GPU the run's lease named (its record on the host: a dry run leases a fixture GPU and runs on the CPU)."""
    return state_of(host, run_id(results)).get("gpu") or ((results or {}).get("provenance") or {}).get("gpu") or {}


def row_cells(results: dict[str, Any]) -> str:
    """ "tiny PASSED FASTER; mid PASSED FASTER (invalid: ...)" """
    cells = []
    for row in results.get("rows", []):
        verdict = (row.get("verdict") or {}).get("verdict") or "-"
        invalid = f" (invalid: {row['invalid']})" if row.get("invalid") else ""
        cells.append(f"{row['workload']} {row['status']} {verdict}{invalid}")
    return "; ".join(cells)


def newest(results: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    return results[-1] if results else None


def state_of(host: Host, run_id: Optional[str]) -> dict[str, Any]:
    return next((s for s in host.states() if s.get("run_id") == run_id), {})


def running_on(host: Host, uuid: str, in_row: bool = True, excluding: frozenset = frozenset()) -> Optional[dict[str, Any]]:
    """The run now running on this GPU (and, with in_row, already timing a workload), other than `excluding`'s (a
    run whose runner was killed reads "running" until something looks at it)."""
    for state in host.states():
        if state.get("run_id") in excluding:
            continue
        if state.get("status") == "running" and (state.get("gpu") or {}).get("uuid") == uuid:
            if not in_row or state.get("workload"):
                return state
    return None


def seconds_between(earlier: Optional[str], later: Optional[str]) -> Optional[float]:
    from datetime import datetime

    if not earlier or not later:
        return None
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def ok(condition: bool) -> str:
    return "ok" if condition else "FAILED"


# ------------------------------------------------------------------------------------------------ the steps


@dataclass
class Context:
    """What every step works with: the host, the panes, `inv`, the GPU count, and what the summary gathers."""

    host: Host
    panes: Panes
    inv: Inv
    n: int
    rows: str = ROWS
    tables: dict[int, list[str]] = field(default_factory=dict)
    found: list[Check] = field(default_factory=list)  # a step's checks so far: kept when a later part stops it

    def gpu(self, index: int) -> dict[str, Any]:
        return self.host.gpus[index]


def step1_gpu_status(ctx: Context, log: Log, box: Box) -> list[Check]:
    """`inv gpu-status -u` at 80 columns and wide; the GPUs' list for the other steps."""
    pane = ctx.panes[0]
    narrow = ctx.inv.run(pane, "gpu-status", "--host", ALIAS, "-u", log=log, box=box, columns=80)
    wide = ctx.inv.run(pane, "gpu-status", "--host", ALIAS, "-u", "-p", "-a", log=log, box=box, columns=160)
    other = ctx.inv.run(pane, "gpu-status", "--host", f"{ALIAS}-other", "-a", log=log, box=box, columns=160)
    uuids = [g["uuid"] for g in ctx.host.gpus]
    shown = [u for u in uuids if u in narrow.output]
    too_wide = [line for line in narrow.output.splitlines() if len(line) > 80]
    return [
        Check(1, "`inv gpu-status -u` at 80 columns: every GPU's UUID whole, no line over 80",
              ok(narrow.code == 0 and len(shown) == len(uuids) and not too_wide),
              f"exit {narrow.code}; {len(shown)} of {len(uuids)} UUIDs; {len(too_wide)} lines over 80"),
        Check(1, "`inv gpu-status -u -p -a` wide", ok(wide.code == 0 and all(u in wide.output for u in uuids)),
              f"exit {wide.code}"),
        Check(1, "a host whose arch is the other model's shows its GPUs as wrong arch",
              ok("wrong arch" in other.output), f"exit {other.code}; {other.last_line()[:200]}"),
    ]


def step2_concurrent(ctx: Context, log: Log, box: Box) -> list[Check]:
    """N runs at once from N panes; an N+1th with --wait; one without --wait."""
    n = ctx.n
    args = ("run", "--host", ALIAS, "--task", TASK, "--workloads", ctx.rows)
    runs = [ctx.inv.start(ctx.panes[i], *args, log=log) for i in range(n)]
    poll(box, lambda: len([s for s in ctx.host.states() if s.get("status") == "running"]) >= n, clients=tuple(runs))
    log.say(f"{n} runs hold GPUs")
    waiter = ctx.inv.start(ctx.panes[n], *args, "--wait=300", log=log)
    poll(box, lambda: any(s.get("status") == "waiting" for s in ctx.host.states()), clients=(waiter,))
    refused = ctx.inv.run(ctx.panes[n + 1], *args, log=log, box=box)
    watch_ends(runs + [waiter], box)  # each client's own seconds, not the order we wait in
    done = [r.wait(box, log) for r in runs]
    waited = waiter.wait(box, log)
    results = [newest(ctx.panes.fetched(ctx.panes[i])) for i in range(n)]
    waiter_results = newest(ctx.panes.fetched(ctx.panes[n]))
    ctx.tables[2] = runs_table(ctx, [*zip(done, results), (waited, waiter_results)], waiter=n)
    gpus = [leased(ctx.host, r).get("uuid") for r in results]
    # The GPU that freed first: the run that finished first by its record (whole seconds: ties all count).
    finished = [state_of(ctx.host, run_id(r)).get("finished") or "9" for r in results]
    freed_first = {gpus[i] for i in range(n) if finished[i] == min(finished)}
    waiter_gpu = leased(ctx.host, waiter_results)
    lag = seconds_between(min(finished), state_of(ctx.host, run_id(waiter_results)).get("started"))
    holders = [run_id(r) for r in results]
    named = [h for h in holders if h and h in refused.output]
    return [
        Check(2, f"{n} runs started at once from {n} checkouts land on {n} different GPUs",
              ok(all(gpus) and len(set(gpus)) == n), ", ".join(str(leased(ctx.host, r).get("index")) for r in results)),
        Check(2, f"all {n} pass (exit 0)", ok(all(d.code == 0 for d in done)), ", ".join(str(d.code) for d in done)),
        Check(2, "the run with --wait takes the GPU that freed first, as soon as it frees",
              ok(waited.code == 0 and waiter_gpu.get("uuid") in freed_first and lag is not None and lag < 10),
              f"GPU {waiter_gpu.get('index')} (freed first: "
              f"{', '.join(str(g['index']) for g in ctx.host.gpus if g['uuid'] in freed_first)}); its run started "
              f"{lag if lag is None else round(lag, 1)} s after that run finished; exit {waited.code}"),
        Check(2, "the run without --wait is refused and names the runs holding the GPUs",
              ok(refused.code not in (0, None) and len(named) == n),
              f"exit {refused.code}, names {len(named)} of {n} runs: {refused.error()[:600]}"),
    ]


def runs_table(ctx: Context, runs: list[tuple[Done, Optional[dict[str, Any]]]], waiter: int) -> list[str]:
    """One line per pane's run: its id, the GPU its lease named, its exit code and seconds, each row's verdict."""
    table = ["| pane | run | GPU | exit | s | rows |", "|---|---|---|---:|---:|---|"]
    for i, (done, results) in enumerate(runs):
        gpu = leased(ctx.host, results)
        table.append(f"| pane-{i + 1}{' (--wait)' if i == waiter else ''} | {run_id(results) or '-'} | "
                     f"{gpu.get('index')} {str(gpu.get('uuid'))[:12]} | {done.code} | {done.seconds:.0f} | "
                     f"{row_cells(results or {})} |")
    return table


def step3_foreign(ctx: Context, log: Log, box: Box) -> list[Check]:
    """A foreign process: skipped, shown, refused by UUID; mid-run on a neighbour's GPU and on the run's own."""
    host, pane, n = ctx.host, ctx.panes[0], ctx.n
    foreign = ctx.gpu(n - 1)
    host.start_foreign(foreign, log)
    host.go_foreign(log)
    poll(box, lambda: foreign_seen(ctx, foreign["uuid"], log, box), every=1.0)
    status = ctx.inv.run(pane, "gpu-status", "--host", ALIAS, "-u", "-p", "-a", log=log, box=box)
    reason_line = next((line for line in status.output.splitlines() if "busy:" in line), "")  # -a: "busy: why"
    named = ctx.inv.run(pane, "run", "--host", ALIAS, "--task", TASK, "--workloads", "tiny", "--gpu",
                        foreign["uuid"], log=log, box=box)
    skipped = ctx.inv.run(pane, "run", "--host", ALIAS, "--task", TASK, "--workloads", "tiny", log=log, box=box)
    skip_gpu = leased(host, newest(ctx.panes.fetched(pane)))
    host.stop_foreign(log)
    ctx.found += [
        Check(3, "gpu-status says why the foreign process's GPU is busy", ok(bool(reason_line)), reason_line.strip()),
        Check(3, "`inv run --gpu <its uuid>` is refused with the reason",
              ok(named.code not in (0, None) and ("busy" in named.output or "compute process" in named.output)),
              f"exit {named.code}: {named.error()[:400]}"),
        Check(3, "a run without --gpu skips that GPU", ok(skipped.code == 0 and skip_gpu.get("uuid") not in (None, foreign["uuid"])),
              f"exit {skipped.code}, GPU {skip_gpu.get('index')} (foreign on {foreign['index']})"),
    ]
    poll(box, lambda: not foreign_seen(ctx, foreign["uuid"], log, box), every=1.0)
    return mid_run_foreign(ctx, log, box)


def foreign_seen(ctx: Context, uuid: str, log: Log, box: Box) -> bool:
    """Whether gpu-status calls the GPU busy (its process list, or its memory where a container hides the pids)."""
    done = ctx.inv.run(ctx.panes[0], "gpu-status", "--host", ALIAS, "--json", log=log, box=box, quiet=True)
    try:
        doc = json.loads(done.output[done.output.index("{"):])
    except ValueError:
        return False
    gpu = next((g for h in doc["hosts"] for g in h["gpus"] if g["uuid"] == uuid), {})
    return gpu.get("idle") is False and gpu.get("lease") is None


def mid_run_foreign(ctx: Context, log: Log, box: Box) -> list[Check]:
    """Run A on GPU 0, run B on the last GPU; once both time a row, a foreign process starts on B's GPU."""
    host, n = ctx.host, ctx.n
    own, neighbour = ctx.gpu(n - 1), ctx.gpu(0)
    host.start_foreign(own, log)  # made ready now: its torch import must not fall in the runs' rows
    args = ("run", "--host", ALIAS, "--task", TASK, "--workloads", ctx.rows)
    a = ctx.inv.start(ctx.panes[1], *args, "--gpu", neighbour["uuid"], log=log)
    b = ctx.inv.start(ctx.panes[2], *args, "--gpu", own["uuid"], log=log)
    poll(box, lambda: running_on(host, own["uuid"]), clients=(b,))
    host.go_foreign(log)
    log.say(f"the neighbour's run is {'timing a row' if running_on(host, neighbour['uuid']) else 'not in a row'} now")
    log.block("compute processes after the foreign one started", host.compute_apps())
    done_a, done_b = a.wait(box, log), b.wait(box, log)
    host.stop_foreign(log)
    ra, rb = newest(ctx.panes.fetched(ctx.panes[1])) or {}, newest(ctx.panes.fetched(ctx.panes[2])) or {}
    ctx.tables[3] = ["| run | GPU | foreign process | exit | rows |", "|---|---|---|---:|---|",
                     f"| {run_id(ra)} | {neighbour['index']} | on GPU {own['index']} (a neighbour) | "
                     f"{done_a.code} | {row_cells(ra)} |",
                     f"| {run_id(rb)} | {own['index']} | on its own GPU | {done_b.code} | {row_cells(rb)} |"]
    timed_a = [r for r in ra.get("rows", []) if r.get("timing")]
    timed_b = [r for r in rb.get("rows", []) if r.get("timing")]
    # Only a GPU run watches its GPU for foreign processes (runner.py's ForeignWatch): a CPU run proves nothing here.
    unwatched = "not run: a dry run's rows run on the CPU, where no run watches a GPU" if host.dry else None
    return [
        Check(3, "a foreign process started on a neighbouring GPU mid-run voids none of the run's rows",
              unwatched or ok(bool(timed_a) and not any("foreign" in str(r.get("invalid")) for r in ra["rows"])),
              f"exit {done_a.code}: {row_cells(ra)}"),
        Check(3, "one started on the run's own GPU mid-run voids its rows",
              unwatched or ok(any("foreign" in str(r.get("invalid")) for r in timed_b) and done_b.code != 0),
              f"exit {done_b.code}: {row_cells(rb)}"),
    ]


def step4_cvd_and_kill(ctx: Context, log: Log, box: Box) -> list[Check]:
    """CUDA_VISIBLE_DEVICES changes no lease; killed clients and holders leave leases the next runs take."""
    ctx.found += cuda_visible_devices(ctx, log, box)
    return killed_client(ctx, log, box)


def cuda_visible_devices(ctx: Context, log: Log, box: Box) -> list[Check]:
    """CUDA_VISIBLE_DEVICES=1 on the client and in the host's python: `--gpu 0` still leases and uses GPU 0. Where the
    work runs is read from nvidia-smi's compute processes, sampled every PROBE_EVERY_S from the start to the client's
    end: the run's side processes open CUDA only after its sync and build, so one look when the lease appears can come
    before any of them (2026-11-26, 4 x H200: it saw none)."""
    host, pane, gpu0, gpu1 = ctx.host, ctx.panes[0], ctx.gpu(0), ctx.gpu(1)
    run = ctx.inv.start(pane, "run", "--host", f"{ALIAS}-cvd", "--task", TASK, "--workloads", "tiny", "--gpu", "0",
                        log=log, extra_env={"CUDA_VISIBLE_DEVICES": "1"})
    state, record, samples = watch_run(host, run, gpu0["uuid"], box)
    log.block("GPU 0's lock file while it runs", record)
    done = run.wait(box, log)
    results = newest(ctx.panes.fetched(pane)) or {}
    seen = where_processes_ran(samples)
    others = "".join(f", {uuid} in {count}" for uuid, count in seen.items() if uuid not in (gpu0["uuid"], gpu1["uuid"]))
    probe = ("dry run: no nvidia-smi" if host.dry else
             f"compute processes in {len(samples)} samples every {PROBE_EVERY_S} s: GPU 0 in "
             f"{seen.get(gpu0['uuid'], 0)}, GPU 1 in {seen.get(gpu1['uuid'], 0)}{others}")
    log.block("compute processes while it ran",
              "\n".join([probe, *(["each different sample:", *dict.fromkeys(samples)] if samples else [])]))
    on_gpu0 = host.dry or worked_on(seen, gpu0["uuid"], not_on=gpu1["uuid"])
    return [Check(4, "CUDA_VISIBLE_DEVICES=1 (client and host) with --gpu 0: the lease and the work are on GPU 0",
                  ok(done.code == 0 and leased(host, results).get("uuid") == gpu0["uuid"] and state is not None
                     and state["run_id"] in record and on_gpu0),
                  f"exit {done.code}; results' GPU {leased(host, results).get('index')} {leased(host, results).get('uuid')}; "
                  f"{probe}" + ("" if state else "; the run was never seen running on GPU 0"))]


def watch_run(host: Host, run: Started, uuid: str, box: Box) -> tuple[Optional[dict[str, Any]], str, list[str]]:
    """Until the client ends: the run's state once it runs on this GPU, the GPU's lock record then, and nvidia-smi's
    compute processes every PROBE_EVERY_S (none in a dry run)."""
    state, record, samples = None, "(not seen: the run ended before it ran on this GPU)", []
    while run.proc.poll() is None:
        if state is None:
            state = running_on(host, uuid)
            record = host.lock_record(uuid) if state else record
        if not host.dry:
            samples.append(host.compute_apps())
        box.check()
        time.sleep(PROBE_EVERY_S)
    return state, record, samples


def where_processes_ran(samples: list[str]) -> dict[str, int]:
    """For each GPU UUID, in how many samples of nvidia-smi's compute processes ("uuid, pid, MiB" lines) it had one."""
    counts: dict[str, int] = {}
    for sample in samples:
        for uuid in sorted({line.split(",")[0].strip() for line in sample.splitlines() if line.startswith("GPU-")}):
            counts[uuid] = counts.get(uuid, 0) + 1
    return counts


def worked_on(seen: dict[str, int], uuid: str, not_on: str) -> bool:
    """The work ran on `uuid`: some sample had a compute process there, and none had one on `not_on`."""
    return seen.get(uuid, 0) > 0 and seen.get(not_on, 0) == 0


def killed_client(ctx: Context, log: Log, box: Box) -> list[Check]:
    """Clients A (GPU 0) and B (GPU 1) killed with SIGKILL mid-run; then B's runner too (a holder that dies on the
    host). The next run on each GPU: A's waits for the orphaned run to end; B's reclaims the dead holder's lease."""
    host = ctx.host
    g0, g1 = ctx.gpu(0), ctx.gpu(1)
    state_a, state_b, a_going = kill_mid_run(ctx, log, box)
    quick = ("run", "--host", ALIAS, "--task", TASK, "--workloads", "tiny")  # the next runs: only their leases matter
    next_a = ctx.inv.start(ctx.panes[3], *quick, "--gpu", g0["uuid"], "--wait=120", log=log)
    next_b = ctx.inv.start(ctx.panes[4], *quick, "--gpu", g1["uuid"], "--wait=60", log=log)
    killed = {state_a["run_id"], state_b["run_id"]}
    for gpu, record in next_leases(host, [(g0, next_a), (g1, next_b)], killed, box):
        log.block(f"GPU {gpu['index']}'s lock file once the next run holds it", record)
    done_a, done_b = next_a.wait(box, log), next_b.wait(box, log)
    lease_a = state_of(host, run_id(newest(ctx.panes.fetched(ctx.panes[3]))))
    lease_b = state_of(host, run_id(newest(ctx.panes.fetched(ctx.panes[4]))))
    status = ctx.inv.run(ctx.panes[0], "status", "--host", ALIAS, "--all", log=log, box=box)
    orphan, dead = state_of(host, state_a["run_id"]), state_of(host, state_b["run_id"])
    wait_a = seconds_between(orphan.get("finished"), lease_a.get("started"))
    ctx.tables[4] = ["| GPU | killed run | what was killed | its end | next run | its lease | next exit |",
                     "|---|---|---|---|---|---|---:|",
                     f"| 0 | {state_a['run_id']} | the client (SIGKILL) | {orphan.get('status')} | "
                     f"{lease_a.get('run_id')} | GPU {(lease_a.get('gpu') or {}).get('index')}, "
                     f"{wait_a if wait_a is None else round(wait_a, 1)} s after the orphan ended | {done_a.code} |",
                     f"| 1 | {state_b['run_id']} | the client, then the runner's process group | {dead.get('status')} "
                     f"| {lease_b.get('run_id')} | GPU {(lease_b.get('gpu') or {}).get('index')} | {done_b.code} |"]
    return [
        Check(4, "a client killed with SIGKILL leaves its run going, holding its GPU, to its end",
              ok(a_going.get("status") == "running" and orphan.get("status") == "passed"),
              f"2 s later: {a_going.get('status')}; at the end: {orphan.get('status')}"),
        Check(4, "the next run (--wait) takes that GPU once the orphaned run ends",
              ok(done_a.code == 0 and (lease_a.get("gpu") or {}).get("uuid") == g0["uuid"] and wait_a is not None
                 and wait_a < 10),
              f"{lease_a.get('run_id')} on GPU {(lease_a.get('gpu') or {}).get('index')}, "
              f"{wait_a if wait_a is None else round(wait_a, 1)} s after {state_a['run_id']} ended; exit {done_a.code}"),
        Check(4, "a holder killed on the host leaves a lease the next run reclaims",
              ok(done_b.code == 0 and (lease_b.get("gpu") or {}).get("uuid") == g1["uuid"]),
              f"{lease_b.get('run_id')} on GPU {(lease_b.get('gpu') or {}).get('index')}; the killed run is "
              f"{dead.get('status')!r} (`inv status` {'names' if state_b['run_id'] in status.output else 'omits'} "
              f"it); exit {done_b.code}"),
    ]


def kill_mid_run(ctx: Context, log: Log, box: Box) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Runs on GPUs 0 and 1, their clients SIGKILLed once each times a row, then the second's runner's process group
    on the host. Returns both runs' records as they began and the first's 2 s after its client died."""
    host, g0, g1 = ctx.host, ctx.gpu(0), ctx.gpu(1)
    args = ("run", "--host", ALIAS, "--task", TASK, "--workloads", ctx.rows)
    a = ctx.inv.start(ctx.panes[1], *args, "--gpu", g0["uuid"], log=log)
    b = ctx.inv.start(ctx.panes[2], *args, "--gpu", g1["uuid"], log=log)
    state_a = poll(box, lambda: running_on(host, g0["uuid"]), clients=(a,))
    state_b = poll(box, lambda: running_on(host, g1["uuid"]), clients=(b,))
    for client in (a, b):
        client.proc.kill()
        client.proc.wait()
    log.say(f"SIGKILL: clients of {state_a['run_id']} and {state_b['run_id']}")
    time.sleep(2)
    a_going = state_of(host, state_a["run_id"])
    log.block("lock records 2 s after the clients died",
              f"GPU 0: {host.lock_record(g0['uuid'])}\nGPU 1: {host.lock_record(g1['uuid'])}")
    os.killpg(int(state_b["pgid"]), signal.SIGKILL)
    log.say(f"SIGKILL: the runner's process group of {state_b['run_id']} (pgid {state_b['pgid']}) on the host")
    time.sleep(1)
    log.block("GPU 1's lock file after its holder died", host.lock_record(g1["uuid"]))
    return state_a, state_b, a_going


def next_leases(host: Host, pairs: list[tuple[dict[str, Any], Started]], killed: set[str],
                box: Box) -> list[tuple[dict[str, Any], str]]:
    """Each GPU's lock record once a run other than the killed ones holds it (or why it was not seen)."""
    records: dict[int, str] = {}
    while len(records) < len(pairs):
        for i, (gpu, client) in enumerate(pairs):
            if i in records:
                continue
            if running_on(host, gpu["uuid"], in_row=False, excluding=frozenset(killed)):
                records[i] = host.lock_record(gpu["uuid"])
            elif client.proc.poll() is not None:
                records[i] = f"(not seen: `inv {client.shown}` ended first; its run is in the table)"
        box.check()
        time.sleep(0.2)
    return [(gpu, records[i]) for i, (gpu, _) in enumerate(pairs)]


def step5_arch(ctx: Context, log: Log, box: Box) -> list[Check]:
    """Copies of the control task marked for the other models are refused with the reason; this model's runs."""
    pane, model = ctx.panes[0], ctx.host.model
    others = {"h100": ["h200"], "h200": ["h100", "b200"]}.get(model, ["b200"])
    checks = []
    for arch in others:
        name = f"redteam_arch_{arch}"
        ctx.panes.copy_task(pane, name, arch)
        done = ctx.inv.run(pane, "run", "--host", ALIAS, "--task", name, "--workloads", "tiny", log=log, box=box)
        checks.append(Check(5, f"a task marked `arch = \"{arch}\"` is refused on this {model.upper()} host",
                            ok(done.code not in (0, None) and "arch" in done.output),
                            f"exit {done.code}: {done.error()[:400]}"))
    if model in ("h100", "h200"):
        name = f"redteam_arch_{model}"
        ctx.panes.copy_task(pane, name, model)
        done = ctx.inv.run(pane, "run", "--host", ALIAS, "--task", name, "--workloads", "tiny", "--no-audit",
                           log=log, box=box)
        checks.append(Check(5, f"a task marked `arch = \"{model}\"` runs here", ok(done.code == 0),
                            f"exit {done.code}: {done.last_line()[:200]}"))
    return checks


def step6_neighbours(ctx: Context, log: Log, box: Box) -> list[Check]:
    """Issue 33: benchmarks/gpu/neighbours.sh alone, N at once, alone again, audit on; medians alone vs together."""
    task, rows, label = neighbours_task(ctx, log)
    out = ctx.host.work / "neighbours"
    env = {**os.environ, "OUT": str(out), "NEIGHBOURS_AGAIN": "1", "TASK_DIR": str(task), "WORKLOADS": rows,
           "PYTHONUNBUFFERED": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # its python3: the one with torch
    if ctx.host.dry:
        env.update(KPREMOTE_NVML_FIXTURE=str(ctx.host.rig_host.nvml_fixture), NEIGHBOURS_DEVICE="cpu")
    log.say(f"neighbours.sh: {label}, rows {rows}")
    script = subprocess.Popen(["bash", str(REPO / "benchmarks/gpu/neighbours.sh")], env=env, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = script.communicate(timeout=max(1.0, box.left()))
    except subprocess.TimeoutExpired:  # its runs too: they are in its process group, and hold GPUs
        os.killpg(script.pid, signal.SIGKILL)
        output, _ = script.communicate()
        log.block("neighbours.sh (stopped: out of time)", output)
        ctx.tables[6] = [f"{label}, rows {rows}: neighbours.sh ran out of time; the runs that ended:", "",
                         (out / "steps.txt").read_text() if (out / "steps.txt").exists() else "(none)"]
        raise StepTimeout("neighbours.sh outlasted the step's time box") from None
    log.block(f"neighbours.sh -> exit {script.returncode}", output)
    table = (out / "neighbours.md").read_text() if (out / "neighbours.md").exists() else ""
    ctx.tables[6] = [f"{label}, rows {rows}", "", *table.splitlines()]
    statuses = (out / "steps.txt").read_text() if (out / "steps.txt").exists() else ""
    runs = re.findall(r"(\S+) exit (\d+)", statuses)
    audit = "CPU: no audit" if ctx.host.dry else "audit on"
    return [Check(6, f"{label}: alone, {ctx.n} at once, alone again; every run exit 0 ({audit})",
                  ok(bool(runs) and all(code == "0" for _, code in runs)),
                  ", ".join(f"{name} {code}" for name, code in runs) or "no runs")]


def neighbours_task(ctx: Context, log: Log) -> tuple[Path, str, str]:
    """fuse_scale_shift's qwen_s19 and qwen_s47 (small) and qwen_s4096 (~17 us) production rows where its upstream
    files are here (on an H100 a copy marked h100), else the control task's tiny and mid rows."""
    fuse = REPO / "kernels" / FUSE
    if (fuse / "baseline" / "upstream").is_dir() and not ctx.host.dry:
        if ctx.host.model == "h200":
            return fuse, FUSE_ROWS, "fuse_scale_shift"
        copy = ctx.host.work / "kernels" / FUSE
        shutil.copytree(fuse, copy, ignore=shutil.ignore_patterns("results", "ledger.jsonl"), dirs_exist_ok=True)
        toml = copy / "task.toml"
        toml.write_text(re.sub(r'(?m)^arch = .*$', f'arch = "{ctx.host.model}"', toml.read_text()))
        return copy, FUSE_ROWS, f"fuse_scale_shift (a copy marked arch {ctx.host.model})"
    log.say("fuse_scale_shift's upstream files are not here (or a dry run): the control task instead")
    return ctx.panes[0] / "kernels" / TASK, ctx.rows, "control_fast"


# ------------------------------------------------------------------------------------------------ the call


STEPS: dict[int, tuple[str, Callable[[Context, Log, Box], list[Check]]]] = {
    1: ("gpu-status", step1_gpu_status),
    2: ("N runs at once, --wait, no wait", step2_concurrent),
    3: ("a foreign process", step3_foreign),
    4: ("CUDA_VISIBLE_DEVICES, SIGKILL", step4_cvd_and_kill),
    5: ("the arch gate", step5_arch),
    6: ("neighbours (issue 33)", step6_neighbours),
}


def settle(ctx: Context, log: Log) -> None:
    """After a step: no client of it left, no run of it left on the host, the foreign process gone."""
    ctx.inv.stop_all(log)
    ctx.host.stop_foreign(log)
    going = [s for s in ctx.host.states() if s.get("status") in ("running", "starting", "waiting")]
    for state in going:
        subprocess.run(ctx.inv.command("cancel", "--host", ALIAS, "--run", state["run_id"], "--task", state["task"]),
                       cwd=ctx.panes[0], env=ctx.inv.env(), capture_output=True, timeout=60)
        log.say(f"cancelled {state['run_id']} (left running by the step)")
    try:  # the next step starts on idle GPUs: a killed process's memory takes a moment to go
        poll(Box(SETTLE_S), lambda: all_idle(ctx, log), every=1.0)
    except StepTimeout:
        log.say(f"GPUs still not all idle {SETTLE_S} s after the step (the next step may find them busy)")


def all_idle(ctx: Context, log: Log) -> bool:
    done = ctx.inv.run(ctx.panes[0], "gpu-status", "--host", ALIAS, "--json", log=log, box=Box(60), quiet=True)
    try:
        doc = json.loads(done.output[done.output.index("{"):])
    except ValueError:
        return False
    return all(g.get("idle") for h in doc["hosts"] for g in h["gpus"])


def run_step(number: int, ctx: Context, out: Path, began: float, deadline: float, later: int) -> list[Check]:
    """One step in its time box (a dry run's CPU runs are slower: DRY_SLOWER times as long), then settled."""
    name, body = STEPS[number]
    log = Log(out / f"step{number}.log", began)
    seconds = min(BOXES[number] * (DRY_SLOWER if ctx.host.dry else 1), deadline - time.monotonic() - RESERVE_S * later)
    if seconds < 10:
        log.say(f"step {number} ({name}): not run, the call's budget is spent")
        return [Check(number, name, f"not run: {seconds + RESERVE_S * later:.0f} s of the budget left")]
    log.say(f"step {number} ({name}): time box {seconds:.0f} s")
    box = Box(seconds)
    ctx.found = []
    try:
        checks = ctx.found + body(ctx, log, box)
    except StepTimeout as exc:
        log.say(f"step {number}: {exc}")
        checks = ctx.found + [Check(number, name, f"not run to its end: {exc}")]
    except StepFailed as exc:
        log.say(f"step {number}: {exc}")
        checks = ctx.found + [Check(number, name, "FAILED", str(exc))]
    except Exception as exc:  # a failing step must not stop the next one: its error is its result
        log.say(f"step {number} failed: {type(exc).__name__}: {exc}")
        import traceback

        log.block("traceback", traceback.format_exc())
        checks = ctx.found + [Check(number, name, f"FAILED: {type(exc).__name__}: {exc}")]
    finally:
        settle(ctx, log)
    for check in checks:
        log.say(f"  {check.result}: {check.what} ({check.evidence})")
    log.say(f"step {number}: {time.monotonic() - box.started:.0f} s")
    return checks


def discover(ctx: Context, log: Log) -> None:
    """The GPUs (gpu-status --json through SSH, as a user asks) and their model; hosts.toml's arch set from it."""
    ctx.host.write_hosts("any")
    done = ctx.inv.run(ctx.panes[0], "gpu-status", "--host", ALIAS, "--json", log=log, box=Box(120))
    doc = json.loads(done.output[done.output.index("{"):])
    report = doc["hosts"][0]
    ctx.host.gpus = sorted(report["gpus"], key=lambda g: g["index"])
    ctx.host.driver = report.get("driver") or "?"
    names = {g["name"] for g in ctx.host.gpus}
    ctx.host.model = next((m for m in ("h200", "h100", "b200") if all(m.upper() in n.upper() for n in names)), "any")
    ctx.host.write_hosts(ctx.host.model)
    ctx.n = len(ctx.host.gpus)
    log.say(f"{ctx.n} GPUs ({', '.join(sorted(names))}), model {ctx.host.model}, driver {ctx.host.driver}")


def write_summary(out: Path, ctx: Context, checks: list[Check], header: list[str]) -> None:
    lines = [*header, "", "| step | check | result | evidence |", "|---:|---|---|---|"]
    for c in checks:
        evidence = c.evidence.replace("|", "/").replace("\n", " ")
        lines.append(f"| {c.step} | {c.what} | {c.result} | {evidence} |")
    for number, table in sorted(ctx.tables.items()):
        lines += ["", f"## Step {number}: {STEPS[number][0]}", "", *table]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def pack_logs(out: Path, ctx: Context) -> None:
    """logs.tgz: every pane's fetched results, the clients' outputs, the neighbours' run folders' summaries."""
    work = ctx.host.work
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        for path in sorted(work.glob("pane-*/kernels/*/results")) + sorted(work.glob("*.out")):
            tar.add(path, arcname=str(path.relative_to(work)))
        for path in sorted(work.glob("neighbours/*")):
            tar.add(path, arcname=str(path.relative_to(work)))
        for path in sorted(Path("/tmp/kp-neighbours/runs").glob("*/summary")) if 6 in ctx.tables else []:
            tar.add(path, arcname=f"neighbours-runs/{path.parent.name}/summary")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/kp-x4-out")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/kp-x4"))
    parser.add_argument("--steps", default=os.environ.get("X4_STEPS") or STEPS_DEFAULT)
    parser.add_argument("--budget", type=float, default=float(os.environ.get("X4_BUDGET_S", 0)) or None,
                        help=f"seconds for the whole call (the steps share what is left; {BUDGET_S}, a dry run {DRY_SLOWER}x)")
    parser.add_argument("--dry", action="store_true", help="no GPU: an sshd on loopback and the NVML fixture")
    parser.add_argument("--gpus", type=int, default=2, help="--dry: how many fixture GPUs")
    parser.add_argument("--model", choices=("h100", "h200"), default="h200", help="--dry: the fixture GPUs' model")
    args = parser.parse_args()
    began = time.monotonic()
    args.budget = args.budget or BUDGET_S * (DRY_SLOWER if args.dry else 1)
    deadline = began + args.budget
    names = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in names if not s.isdigit() or int(s) not in STEPS]
    if unknown or not names:
        print(f"x4_host: X4_STEPS/--steps {args.steps!r}: no step {unknown[0] if unknown else ''!r} (steps are 1 to 6, "
              "comma-separated)", file=sys.stderr)
        return 2
    steps = [int(s) for s in names]
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "step1.log", began)
    host = Host(args, args.work)
    ctx = Context(host, Panes(args.work, 6), Inv(host), 0, rows="tiny" if args.dry else ROWS)
    checks: list[Check] = []
    try:
        try:
            discover(ctx, log)
        except Exception as exc:  # no host, no steps: say so where the lead looks
            log.say(f"the host did not answer: {type(exc).__name__}: {exc}")
            checks.append(Check(0, "`inv gpu-status --json` over SSH lists the GPUs", "FAILED", f"{exc} (step1.log)"))
            steps = []
        header = [f"# {ctx.n} GPUs, one host: issue 27's steps and issue 33's neighbours",
                  "", f"{'Dry run (NVML fixture, CPU)' if host.dry else 'GPU host'}: {ctx.n} x "
                  f"{ctx.host.gpus[0]['name'] if ctx.host.gpus else '?'}, driver {host.driver}, "
                  f"`bash benchmarks/gpu/x4_host.sh`, steps {args.steps}, budget {args.budget:.0f} s"]
        if ctx.n < 2:
            checks.append(Check(0, "a host of two or more GPUs", f"not run: {ctx.n} GPU(s) here"))
            steps = []
        for i, number in enumerate(steps):
            checks += run_step(number, ctx, args.out, began, deadline, len(steps) - i - 1)
            write_summary(args.out, ctx, checks, header)
        header[-1] += f"; the whole call took {time.monotonic() - began:.0f} s"
        write_summary(args.out, ctx, checks, header)
    finally:
        pack_logs(args.out, ctx)
        host.close(log)
    print((args.out / "summary.md").read_text() if (args.out / "summary.md").exists() else "no summary")
    return 0 if checks and all(c.result == "ok" for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
