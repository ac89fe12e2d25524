"""The sandbox (kpremote/agent/sandbox/) for real on this kernel: Landlock, the seccomp filter, the judge's PID
namespace with its leftovers, the schedule guard, and what a run says when a host cannot build it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kpremote.agent import sandbox
from kpremote.agent.task import build
from kpremote.agent.run import report, resultsmd
from kpremote.agent.harness import guard
from kpremote.agent.task.taskspec import TaskSpecError, load_task

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def sandboxed(code: str, scratch: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run `code` in a fresh interpreter that entered the sandbox first; its last stdout line, as JSON."""
    script = "import json, os, sys\nfrom kpremote.agent import sandbox\napplied = sandbox.enter()\n" + code
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60,
                          env={**(env or ENV), **sandbox.scratch_env(sandbox.make_scratch(scratch))})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


TRY = textwrap.dedent('''
    def attempt(call):
        try:
            call()
            return "allowed"
        except OSError as exc:
            return exc.strerror
''')


def test_this_host_can_build_the_whole_sandbox() -> None:
    support = sandbox.support()
    assert support.level == "sandboxed", support.why_not
    assert support.landlock_abi >= 6  # signals scoped by Landlock itself


def test_a_sandboxed_process_changes_only_its_scratch_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "summary").mkdir(parents=True)
    (run / "state.json").write_text("{}")
    other = sandbox.make_scratch(tmp_path / "other-side")
    code = TRY + textwrap.dedent('''
        scratch, run, other = (sys.argv[1], sys.argv[2], sys.argv[3])
        print(json.dumps({
            "applied": applied,
            "scratch": attempt(lambda: open(os.path.join(scratch, "tmp", "mine"), "w").write("x")),
            "state": attempt(lambda: open(os.path.join(run, "state.json"), "w").write("forged")),
            "new_file": attempt(lambda: open(os.path.join(run, "summary", "results.json"), "w")),
            "other_side": attempt(lambda: open(os.path.join(other, "tmp", "x"), "w")),
            "tmp": attempt(lambda: open("/tmp/kp-sandbox-escape-%d" % os.getpid(), "w")),
            "dev_null": attempt(lambda: open("/dev/null", "w").write("x")),
        }))
    ''')
    scratch = tmp_path / "scratch"
    seen = sandboxed(code, scratch, str(scratch), str(run), str(other))
    assert "landlock" in seen["applied"] and "seccomp" in seen["applied"]
    assert seen["scratch"] == "allowed" and seen["dev_null"] == "allowed"
    assert seen["state"] == seen["new_file"] == seen["other_side"] == seen["tmp"] == "Permission denied"
    assert (run / "state.json").read_text() == "{}"


def test_a_sandboxed_process_cannot_signal_renice_or_repin_another(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = TRY + textwrap.dedent('''
            import signal
            victim = int(sys.argv[1])
            print(json.dumps({
                "stop": attempt(lambda: os.kill(victim, signal.SIGSTOP)),
                "renice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, victim, 19)),
                "idle": attempt(lambda: os.sched_setscheduler(victim, os.SCHED_IDLE, os.sched_param(0))),
                "pin": attempt(lambda: os.sched_setaffinity(victim, {0})),
                "self_nice": attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
                "self_pin": attempt(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
            }))
        ''')
        seen = sandboxed(code, tmp_path / "scratch", str(victim.pid))
        assert seen["stop"] == seen["renice"] == seen["idle"] == seen["pin"] == "Operation not permitted", seen
        assert seen["self_nice"] == seen["self_pin"] == "allowed"
        assert os.getpriority(os.PRIO_PROCESS, victim.pid) == 0
        assert "T" not in Path(f"/proc/{victim.pid}/stat").read_text().split(")")[1].split()[0]
    finally:
        victim.kill()
        victim.wait()


LIBC_CALLS = textwrap.dedent('''
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    def syscall_errno(result):
        return "allowed" if result >= 0 else os.strerror(ctypes.get_errno())
    def capability_sets():
        lines = open("/proc/self/status").read().splitlines()
        return {line.split(":")[0]: int(line.split(":")[1], 16) for line in lines if line.startswith("Cap")}
''')


@pytest.mark.skipif(os.geteuid() != 0, reason="what root loses: this test runs as root (CI does)")
def test_a_sandboxed_root_process_holds_no_capability(tmp_path: Path) -> None:
    """uid 0 stays, every capability goes: no reading another uid's private file, no chown, no setting the clock."""
    private = tmp_path / "private"
    private.write_text("another user's")
    private.chmod(0o600)
    os.chown(private, 4321, 4321)
    code = TRY + LIBC_CALLS + textwrap.dedent('''
        scratch = os.environ["KPREMOTE_SCRATCH"]
        print(json.dumps({
            "applied": applied, "uid": os.getuid(), "sets": capability_sets(),
            "read_private": attempt(lambda: open(sys.argv[1]).read()),
            "chown": attempt(lambda: os.chown(os.path.join(scratch, "tmp"), 4321, 4321)),
            # settimeofday(NULL, NULL) changes nothing and still asks for CAP_SYS_TIME (glibc's wrapper needs a time)
            "set_time": syscall_errno(libc.syscall(164 if os.uname().machine == "x86_64" else 170, None, None)),
            "own_scratch": attempt(lambda: open(os.path.join(scratch, "tmp", "mine"), "w").write("x")),
        }))
    ''')
    seen = sandboxed(code, tmp_path / "scratch", str(private))
    assert seen["applied"].endswith("no capabilities") and seen["uid"] == 0, seen
    assert set(seen["sets"]) == {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
    assert not any(seen["sets"].values()), seen["sets"]
    assert seen["read_private"] == "Permission denied" and seen["chown"] == "Operation not permitted", seen
    assert seen["set_time"] == "Operation not permitted" and seen["own_scratch"] == "allowed", seen
    # the same calls outside the sandbox, as root: each is a capability's, not a mode's or the filter's
    assert private.read_text() == "another user's"
    from kpremote.agent.sandbox import privileges

    assert privileges.holds_any(privileges.held())


@pytest.mark.skipif(os.geteuid() != 0, reason="what root loses: this test runs as root (CI does)")
def test_root_without_setpcap_still_ends_with_nothing_usable_and_says_what_it_kept() -> None:
    """A container that withholds CAP_SETPCAP: the bounding set and securebits stay (said so in the row), nothing is
    left permitted or effective, and under no_new_privs a root exec gains nothing back."""
    code = textwrap.dedent('''
        import ctypes, json, os, subprocess, sys
        from kpremote.agent.sandbox import privileges as p
        libc = ctypes.CDLL(None, use_errno=True)
        header, data = p._Header(p.LINUX_CAPABILITY_VERSION_3, 0), (p._Data * 2)()
        libc.capget(ctypes.byref(header), data)
        data[0].effective &= ~(1 << 8); data[0].permitted &= ~(1 << 8)  # no CAP_SETPCAP
        assert libc.capset(ctypes.byref(header), data) == 0
        said = p.drop_all()
        child = subprocess.run(["grep", "^Cap[EP]", "/proc/self/status"], capture_output=True, text=True).stdout
        print(json.dumps({"said": said, "held": p.held(), "child": child}))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["said"] == ("no capabilities (kept: securebits: Operation not permitted; bounding set: Operation not "
                            "permitted)"), seen
    assert seen["held"]["CapEff"] == seen["held"]["CapPrm"] == 0 and seen["held"]["CapBnd"] != 0
    assert seen["child"].split() == ["CapPrm:", "0000000000000000", "CapEff:", "0000000000000000"], seen["child"]


def test_a_sandboxed_process_cannot_change_the_host_but_still_works(tmp_path: Path) -> None:
    """The seccomp filter's host calls (each below works for an ordinary user unfiltered); threads, processes and
    the personality query still work."""
    code = TRY + LIBC_CALLS + textwrap.dedent('''
        import subprocess, threading
        class Timex(ctypes.Structure):
            _fields_ = [("modes", ctypes.c_uint), ("rest", ctypes.c_char * 204)]
        ran = []
        thread = threading.Thread(target=lambda: ran.append(True))
        thread.start(); thread.join()
        print(json.dumps({
            "read_clock_adjustment": syscall_errno(libc.adjtimex(ctypes.byref(Timex(0)))),
            "user_namespace": syscall_errno(libc.unshare(0x10000000)),
            "session_keyring": syscall_errno(libc.syscall(250 if os.uname().machine == "x86_64" else 219, 0, -3, 0)),
            "no_aslr": syscall_errno(libc.personality(0x0040000)),
            "query_personality": syscall_errno(libc.personality(0xFFFFFFFF)),
            "thread": ran == [True],
            "subprocess": subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout,
        }))
    ''')
    seen = sandboxed(code, tmp_path / "scratch")
    refused = ("read_clock_adjustment", "user_namespace", "session_keyring", "no_aslr")
    assert all(seen[name] == "Operation not permitted" for name in refused), seen
    assert seen["query_personality"] == "allowed" and seen["thread"] and seen["subprocess"] == "7\n", seen


def test_off_says_unsandboxed_and_restricts_nothing(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    code = TRY + "print(json.dumps({'applied': applied, 'write': attempt(lambda: open(sys.argv[1], 'w'))}))"
    seen = sandboxed(code, tmp_path / "scratch", str(outside), env={**ENV, sandbox.DISABLE_ENV: "off"})
    assert seen["applied"].startswith("unsandboxed") and seen["write"] == "allowed"


def _run_tree(top: Path) -> Path:
    """A kpremote root with a run in it: records, both sides' folders, another run, the keys; the run folder."""
    run = top / "tasks" / "t" / "runs" / "r1"
    for folder in ("task/t", "raw/scratch/candidate", "raw/scratch/baseline/tmp", "raw/build/candidate",
                   "raw/build/baseline", "raw/workloads", "summary"):
        (run / folder).mkdir(parents=True, exist_ok=True)
    for name in ("state.json", "state.lock", "raw/events.jsonl", "raw/workloads/w.log", "task/t/adapter.py",
                 "raw/build/candidate/kernel.py", "raw/build/baseline/kernel.py", "raw/scratch/baseline/tmp/x"):
        (run / name).write_text("x")
    for other in (top / "tasks" / "t" / "runs" / "r0", top / "keys", top / "agent"):
        other.mkdir(parents=True)
        (other / "file").write_text("x")
    return run


def test_readable_except_allows_everything_but_the_denied_trees_save_their_allowed_parts(tmp_path: Path) -> None:
    from kpremote.agent.sandbox.landlock import readable_except

    run = _run_tree(tmp_path)
    denied, allowed = [run, tmp_path / "keys", tmp_path / "nowhere"], [run / "task" / "t", run / "raw" / "scratch" / "candidate"]
    grants = readable_except(denied, allowed)
    for path in [*allowed, tmp_path / "agent", tmp_path / "tasks" / "t" / "runs" / "r0", Path("/usr")]:
        assert path in grants, path  # a sibling of an ancestor, or an allowed part, is allowed whole
    for grant in grants:  # nothing granted is, lies in, or holds a denied tree, save the allowed parts
        assert not any(grant == d or d in grant.parents or grant in d.parents for d in denied[:2]) or \
            any(grant == a or a in grant.parents for a in allowed), grant
    assert tmp_path not in grants and Path("/") not in grants  # an ancestor of a denied tree is walked, not allowed


def test_a_sandboxed_process_cannot_read_its_runs_records_other_runs_or_the_keys(tmp_path: Path) -> None:
    """reads_env as the judge sets it for the candidate: its task copy, scratch and build folder readable; the run's
    state (even its lock, read-only, so no flock can stall the runner), events, workload logs, the other side's
    folders' files, another run and the keys not; everything outside the root still is, and folders stay listable."""
    run = _run_tree(tmp_path)
    code = TRY + textwrap.dedent('''
        import fcntl
        run, top = sys.argv[1], sys.argv[2]
        def read(path):
            return attempt(lambda: open(os.path.join(run, path)).read())
        seen = {name: read(name) for name in ("state.json", "state.lock", "raw/events.jsonl", "raw/workloads/w.log",
                                             "raw/build/baseline/kernel.py", "task/t/adapter.py",
                                             "raw/build/candidate/kernel.py")}
        seen["flock"] = attempt(lambda: fcntl.flock(os.open(os.path.join(run, "state.lock"), os.O_RDONLY),
                                                    fcntl.LOCK_EX | fcntl.LOCK_NB))
        seen["other_scratch"] = read("raw/scratch/baseline/tmp/x")
        seen["listing"] = attempt(lambda: os.listdir(run))  # names stay listable (a task folder holding its run)
        seen["own_scratch"] = attempt(lambda: os.listdir(os.path.join(run, "raw", "scratch", "candidate")))
        seen["other_run"] = attempt(lambda: open(os.path.join(top, "tasks", "t", "runs", "r0", "file")).read())
        seen["keys"] = attempt(lambda: open(os.path.join(top, "keys", "file")).read())
        seen["agent"] = attempt(lambda: open(os.path.join(top, "agent", "file")).read())
        seen["etc"] = attempt(lambda: open("/etc/hostname").read())
        print(json.dumps(seen))
    ''')
    env = {**ENV, **build.side_reads(run, "candidate", run / "task" / "t")}
    seen = sandboxed(code, run / "raw" / "scratch" / "candidate", str(run), str(tmp_path), env=env)
    refused = ("state.json", "state.lock", "raw/events.jsonl", "raw/workloads/w.log", "raw/build/baseline/kernel.py",
               "flock", "other_scratch", "other_run", "keys")
    assert {name: seen[name] for name in refused} == {name: "Permission denied" for name in refused}, seen
    allowed = ("task/t/adapter.py", "raw/build/candidate/kernel.py", "own_scratch", "agent", "etc", "listing")
    assert {name: seen[name] for name in allowed} == {name: "allowed" for name in allowed}, seen


def test_a_local_checks_side_reads_its_task_but_no_run_in_its_results(tmp_path: Path) -> None:
    """`inv check` runs in the task folder's results/check/<id>: the task (its ancestor) stays readable, the runs
    and fetched results beside it do not."""
    task = tmp_path / "kernels" / "t"
    run, fetched = task / "results" / "check" / "r1", task / "results" / "host" / "r0"
    for folder in (run / "raw" / "scratch" / "candidate", fetched, task / "solution"):
        folder.mkdir(parents=True)
    (fetched / "results.json").write_text("{}")
    (task / "solution" / "kernel.py").write_text("x")
    code = TRY + textwrap.dedent('''
        task, fetched = sys.argv[1], sys.argv[2]
        print(json.dumps({"task": attempt(lambda: os.listdir(task)),
                          "kernel": attempt(lambda: open(os.path.join(task, "solution", "kernel.py")).read()),
                          "fetched": attempt(lambda: open(os.path.join(fetched, "results.json")).read())}))
    ''')
    seen = sandboxed(code, run / "raw" / "scratch" / "candidate", str(task), str(fetched),
                     env={**ENV, **build.side_reads(run, "candidate", task)})
    assert seen == {"task": "allowed", "kernel": "allowed", "fetched": "Permission denied"}


def test_a_sandboxed_process_writes_no_proc_file_but_its_own_and_no_node_but_the_gpus(tmp_path: Path) -> None:
    """Its own /proc folder (a thread's name) and /dev/null stay writable; another process's /proc files, a sysctl,
    /dev/kmsg and the host's /dev/shm do not; nor does its own child's /proc folder (it has no rule of its own).
    core_pattern is opened to write its own value back: were the sandbox to fail, nothing would change."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    leftover = Path("/dev/shm") / f"kp-test-{os.getpid()}-{tmp_path.name}"
    try:
        code = TRY + textwrap.dedent('''
            import subprocess
            victim, leftover = sys.argv[1], sys.argv[2]
            def write(path, text):
                return attempt(lambda: open(path, "w").write(text))
            core = open("/proc/sys/kernel/core_pattern").read()
            child = subprocess.run([sys.executable, "-c", "open('/proc/self/comm', 'w').write('kp-child')"],
                                   capture_output=True, text=True)
            print(json.dumps({
                "own_comm": write("/proc/self/comm", "kp-side"),
                "thread_comm": write("/proc/thread-self/comm", "kp-side"),
                "other_oom": write(f"/proc/{victim}/oom_score_adj", "0"),
                "other_autogroup": write(f"/proc/{victim}/autogroup", "19"),
                "other_clear_refs": write(f"/proc/{victim}/clear_refs", "1"),
                "core_pattern": write("/proc/sys/kernel/core_pattern", core),
                "kmsg": write("/dev/kmsg", "kpremote sandbox test\\n"),
                "null": write("/dev/null", "x"),
                "shm": write(leftover, "x"),
                "child_comm": "Permission denied" if "PermissionError" in child.stderr else child.stderr or "allowed",
            }))
        ''')
        seen = sandboxed(code, tmp_path / "scratch", str(victim.pid), str(leftover))
        assert seen["own_comm"] == seen["thread_comm"] == seen["null"] == "allowed", seen
        for name in ("other_oom", "other_autogroup", "other_clear_refs", "core_pattern", "kmsg", "shm", "child_comm"):
            assert seen[name] == "Permission denied", (name, seen)
        assert not leftover.exists()
    finally:
        victim.kill()
        victim.wait()
        leftover.unlink(missing_ok=True)


def test_dev_shm_in_the_judges_namespace_is_its_own_and_gone_with_it(tmp_path: Path) -> None:
    """A sandboxed side in the judge's namespace may use /dev/shm (Python's semaphores live there), but what it
    leaves there is in the namespace's own tmpfs: the host's /dev/shm never holds it, and it ends with the run."""
    name = f"kp-test-{os.getpid()}-{tmp_path.name}"
    code = ("import os, sys\nfrom kpremote.agent import sandbox\nprint(sandbox.enter(sys.argv[1]))\n"
            "open('/dev/shm/' + sys.argv[2], 'w').write('x')\nprint(os.listdir('/dev/shm'))\n")
    scratch = sandbox.make_scratch(tmp_path / "scratch")
    done = subprocess.run([sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--", sys.executable, "-c", code,
                           str(scratch), name], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    assert "landlock" in done.stdout and name in done.stdout
    assert not (Path("/dev/shm") / name).exists()


LEAVE_A_DAEMON = textwrap.dedent('''
    import json, os, sys, time
    from kpremote.agent.sandbox import members
    side = os.fork()
    if side == 0:  # a "side" that double-forks a daemon into a session of its own, then waits
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        os.waitpid(middle, 0)
        time.sleep(60)
    time.sleep(0.5)
    print(json.dumps({"pid": os.getpid(), "members": len(members.member_pids()),
                      "killed": members.kill_leftovers({side}), "after": len(members.member_pids())}))
''')


def test_the_judges_namespace_finds_and_kills_what_a_side_left_behind() -> None:
    done = subprocess.run([sys.executable, "-m", "kpremote.agent.sandbox.namespace", "--", sys.executable, "-c",
                           LEAVE_A_DAEMON], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pid"] == 1 and seen["members"] == 3  # the judge, the side, the daemon: nothing of the host
    assert len(seen["killed"]) == 1 and seen["killed"][0].startswith("pid 4 ")  # the side 2, the middle fork 3
    assert seen["after"] == 2  # the side stays


def test_outside_a_namespace_kill_leftovers_touches_nothing() -> None:
    from kpremote.agent.sandbox import members

    assert members.kill_leftovers(set()) == []


def _schedule_around(change) -> str | None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        before = guard.schedule_of(process.pid)
        change(process.pid)
        return guard.interference("baseline", before, guard.schedule_of(process.pid), 1.0, starvation=True)
    finally:
        process.kill()
        process.wait()


def test_a_side_untouched_during_timing_is_not_flagged() -> None:
    assert _schedule_around(lambda pid: time.sleep(0.1)) is None


def test_a_reniced_or_repinned_side_voids_its_row() -> None:
    assert "priority changed" in _schedule_around(lambda pid: os.setpriority(os.PRIO_PROCESS, pid, 10))
    one_cpu = {min(os.sched_getaffinity(0))}
    assert "re-pinned" in _schedule_around(lambda pid: os.sched_setaffinity(pid, one_cpu))


def test_a_helper_thread_working_while_timed_voids_its_row() -> None:
    code = "import threading, time\nstart = threading.Event()\n" \
           "def spin():\n    start.wait()\n    end = time.time() + 0.6\n    while time.time() < end: pass\n" \
           "threading.Thread(target=spin, daemon=True).start()\nimport sys\nsys.stdin.readline()\nstart.set()\n" \
           "time.sleep(30)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        time.sleep(0.3)
        before = guard.schedule_of(process.pid)
        process.stdin.write(b"go\n")
        process.stdin.flush()
        time.sleep(0.8)
        why = guard.interference("candidate", before, guard.schedule_of(process.pid), 0.8, starvation=False)
    finally:
        process.kill()
        process.wait()
    assert why is not None and "helper thread of the candidate side" in why


def test_compiled_python_in_a_task_folder_is_refused(tmp_path: Path) -> None:
    import shutil

    task = tmp_path / "tiny_rmsnorm"
    shutil.copytree(REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm", task)
    (task / "solution" / "__pycache__").mkdir()
    (task / "solution" / "__pycache__" / "kernel.cpython-311.pyc").write_bytes(b"\0" * 16)
    load_task(task)  # a __pycache__ is never read: no refusal
    (task / "solution" / "kernel_impl.pyc").write_bytes(b"\0" * 16)
    with pytest.raises(TaskSpecError, match=r"kernel_impl\.pyc: compiled Python in the task folder is refused"):
        load_task(task)


def test_an_unsandboxed_run_says_so_in_its_results_and_headline() -> None:
    results = report.build_results(provenance={"task": {"name": "t"}}, rows=[], samples={}, status="passed",
                                   exit_code=0, message=None, smoke=False, unsandboxed="no Landlock in this kernel")
    assert results.headline.label == "unsandboxed" and results.to_json()["unsandboxed"] == "no Landlock in this kernel"
    assert "**UNSANDBOXED**" in resultsmd.render_results_md(results)
    clean = report.build_results(provenance={"task": {"name": "t"}}, rows=[], samples={}, status="passed",
                                 exit_code=0, message=None, smoke=False)
    assert clean.headline.label is None and "UNSANDBOXED" not in resultsmd.render_results_md(clean)


def test_task_code_is_imported_from_source_never_from_a_planted_pyc(tmp_path: Path) -> None:
    """A .pyc stamped with the source's mtime and size, beside it in __pycache__, is what Python would load; a
    run's processes compile task code from source instead (sourceonly.py), for a file and for a package's module."""
    code = textwrap.dedent('''
        import importlib, importlib.util, json, sys, types
        from importlib._bootstrap_external import _code_to_timestamp_pyc
        from pathlib import Path
        from kpremote.agent.task import sourceonly
        from kpremote.agent.task.builders.base import import_file
        root = Path(sys.argv[1])
        for name in ("adapter", "helper"):
            source = root / "side" / f"{name}.py"
            stat = source.stat()
            forged = _code_to_timestamp_pyc(compile("VALUE = 'planted'", str(source), "exec"), int(stat.st_mtime),
                                            stat.st_size)
            Path(importlib.util.cache_from_source(str(source))).parent.mkdir(exist_ok=True)
            Path(importlib.util.cache_from_source(str(source))).write_bytes(forged)
        if sys.argv[2] == "sourceonly":
            sourceonly.install(root)
        holder = types.ModuleType("kp_side")
        holder.__path__ = [str(root / "side")]
        sys.modules["kp_side"] = holder
        print(json.dumps({"file": import_file("kp_adapter", root / "side" / "adapter.py").VALUE,
                          "package": importlib.import_module("kp_side.helper").VALUE}))
    ''')
    (tmp_path / "side").mkdir()
    for name in ("adapter", "helper"):
        (tmp_path / "side" / f"{name}.py").write_text("VALUE = 'source'\n")
    for mode in ("sourceonly", "python's own"):
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path), mode], capture_output=True, text=True,
                              env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=60)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        if mode == "sourceonly":
            assert seen == {"file": "source", "package": "source"}
        else:  # without it, Python itself takes the planted bytecode for the package's module
            assert seen["package"] == "planted"


def test_a_run_records_what_held_its_sides_and_says_unsandboxed_when_nothing_did(tmp_path: Path) -> None:
    """End to end through the real runner on the CPU: a sandboxed run's rows name what each side entered and its
    processes by this host's pids (the judge is process 1 only inside its namespace); with KPREMOTE_SANDBOX=off the
    run still works and says unsandboxed in results.json, results.md and the headline's label."""
    from agent.test_runner import agent_env, copy_fixture, results_of, runner_command

    task = copy_fixture(tmp_path)
    runs = {}
    for mode in ("on", "off"):
        run_dir = tmp_path / f"run-{mode}"
        done = subprocess.run(runner_command(task, run_dir), env={**agent_env(), sandbox.DISABLE_ENV: mode},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[mode] = (results_of(run_dir), (run_dir / "summary" / "results.md").read_text())
    sandboxed, markdown = runs["on"]
    assert sandboxed["unsandboxed"] is None and sandboxed["provenance"]["sandbox"]["level"] == "sandboxed"
    for row in sandboxed["rows"]:
        assert set(row["sandbox"]) == {"baseline", "candidate"}
        assert all(how.startswith("landlock ABI") and "seccomp" in how for how in row["sandbox"].values()), row
        assert row["processes"]["judge"] != 1 and row["processes"]["baseline"] > 3  # this host's pids
    assert "UNSANDBOXED" not in markdown and "- sandbox: sandboxed" in markdown
    loose, markdown = runs["off"]
    assert "KPREMOTE_SANDBOX=off" in loose["unsandboxed"] and loose["headline"]["label"].endswith("unsandboxed")
    assert all(how.startswith("unsandboxed") for row in loose["rows"] for how in row["sandbox"].values())
    assert "**UNSANDBOXED**" in markdown


def test_starvation_voids_a_row_only_when_one_side_waited_more_than_the_other() -> None:
    """A busy host (neighbouring runs) makes both sides wait alike: no verdict is shaped by that. One side
    waiting for a CPU far longer than the other (a hog pinned where it runs) voids the row."""
    def reading(delay: float) -> guard.Schedule:
        return guard.Schedule(nice=0, policy=0, affinity=frozenset({0}), run_delay_s=delay, helper_cpu_s=0.0)

    start = reading(0.0)
    alike = guard.interference("baseline", start, reading(0.09), 0.6, starvation=True, other_waited_s=0.08)
    assert alike is None
    starved = guard.interference("baseline", start, reading(0.30), 0.6, starvation=True, other_waited_s=0.02)
    assert starved is not None and "starved" in starved and "the other side 0.02 s" in starved
    assert guard.interference("baseline", start, reading(0.30), 0.6, starvation=False, other_waited_s=0.0) is None


def test_a_sides_cpu_is_read_from_outside_main_thread_included() -> None:
    """guard.cpu_s counts every thread of another process, its main one too (the helper rule never did): a process
    blocked reading stdin spends nothing; the same process spinning in its main thread shows what it spent."""
    code = "import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.1\n" \
           "while time.process_time() < end: pass\nprint('spun', flush=True)\nsys.stdin.readline()\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        while (open(f"/proc/{process.pid}/stat").read().rsplit(")", 1)[1].split()[0]) != "S":
            time.sleep(0.01)  # until it is blocked on stdin: started up
        blocked = guard.cpu_s(process.pid)
        time.sleep(0.05)
        assert guard.cpu_s(process.pid) == blocked  # not a nanosecond while it waits
        process.stdin.write(b"go\n")
        process.stdin.flush()
        assert process.stdout.readline() == b"spun\n"
        assert guard.cpu_s(process.pid) - blocked >= 0.1
    finally:
        process.kill()
        process.wait()
    assert guard.cpu_s(process.pid) is None  # gone


def test_cpu_a_side_spends_while_the_other_is_timed_voids_the_row_and_is_not_timed_again() -> None:
    assert guard.idle_interference("candidate", "baseline", 0.0, 0.4) is None
    assert guard.idle_interference("candidate", "baseline", 0.0009, 0.004) is None  # under the floor
    assert guard.idle_interference("candidate", "baseline", 0.015, 0.4) is None  # under 5 % of their samples
    why = guard.idle_interference("candidate", "baseline", 0.0042, 0.0071)
    assert why == ("the candidate side used 4.2 ms of CPU while the baseline's calls were timed (7.1 ms), when it "
                   "waits for its next command")
    assert guard.take_until_undisturbed(lambda: (0, [why])) == (0, [why], [])  # work on purpose: no second take


def test_a_pair_starved_once_is_timed_again_and_one_starved_twice_is_void() -> None:
    """Neighbouring runs starve a side now and then: that take is dropped and the pair timed again, once. A side
    starved again, or disturbed any other way (reniced, a helper thread), voids the row as before."""
    def reading(delay: float, nice: int = 0) -> guard.Schedule:
        return guard.Schedule(nice=nice, policy=0, affinity=frozenset({0}), run_delay_s=delay, helper_cpu_s=0.0)

    start = reading(0.0)
    starved = guard.interference("baseline", start, reading(0.06), 0.33, starvation=True, other_waited_s=0.0)
    reniced = guard.interference("baseline", start, reading(0.0, nice=19), 0.33, starvation=True)
    assert starved and starved.endswith(guard.STARVED) and reniced and not reniced.endswith(guard.STARVED)

    def takes(*disturbances: list[str]):
        queue = list(enumerate(disturbances))
        return lambda: queue.pop(0)

    assert guard.take_until_undisturbed(takes([starved], [])) == (1, [], [starved])
    assert guard.take_until_undisturbed(takes([starved], [starved], [])) == (1, [starved], [starved])
    assert guard.take_until_undisturbed(takes([reniced], [])) == (0, [reniced], [])
    assert guard.take_until_undisturbed(takes([starved, reniced], [])) == (0, [starved, reniced], [])
    assert guard.take_until_undisturbed(takes([], [starved])) == (0, [], [])


def test_a_sides_compiled_extension_loads_as_an_extension(tmp_path: Path) -> None:
    """A CUDA side's build is a shared library (raw/build/<side>/kp_<side>*.so) that the side imports by its path
    through the same source-only door as a Python file: it must load as machine code, not be read as source (on the
    H200 every norm_infer row once ended 'SyntaxError: source code string cannot contain null bytes')."""
    import importlib.machinery
    import sysconfig

    from kpremote.agent.task.builders.base import import_file

    source = tmp_path / "kp_ext.c"
    source.write_text('#include <Python.h>\n'
                      'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "kp_candidate", NULL, -1, NULL};\n'
                      'PyMODINIT_FUNC PyInit_kp_candidate(void) {\n'
                      '  PyObject *mod = PyModule_Create(&m);\n'
                      '  PyModule_AddIntConstant(mod, "answer", 42);\n'
                      '  return mod;\n}\n')
    library = tmp_path / f"kp_candidate{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source), "-o",
                    str(library)], check=True)
    try:
        module = import_file("kp_candidate", library)
        assert module.answer == 42
    finally:
        sys.modules.pop("kp_candidate", None)


SIDE_SEES = textwrap.dedent('''
    import json as _json, os as _os, sys as _sys, time as _time
    def _what(fd):
        try:
            what = _os.readlink(f"/proc/self/fd/{fd}").split(":")[0]
            return "/proc/self" if what == f"/proc/{_os.getpid()}" else what  # the sandbox's hold on its own
        except OSError:
            return None  # the listing's own descriptor, closed by now
    _open = {fd: _what(fd) for fd in sorted(int(name) for name in _os.listdir("/proc/self/fd"))}
    _open = {fd: what for fd, what in _open.items() if what is not None}
    _seen = {"fds": _open, "cpu_s": _time.process_time(), "cmdline": open("/proc/self/cmdline").read()}
    with open(_os.path.join(_os.environ["KPREMOTE_SCRATCH"], "seen.json"), "w") as _f:
        _json.dump(_seen, _f)
''')


def test_sides_forked_by_the_judges_starter_hold_what_an_execd_side_holds(tmp_path: Path) -> None:
    """Each side is forked from the judge's copy taken after torch was imported (sidestarter.py), not exec'd: it
    imports torch no more (its CPU time at the candidate's import is less), yet holds exactly the descriptors an exec'd side holds (standard streams and its own
    channel: never the judge's result pipe, its stdin with the run's secret, or the other side's channel), and its
    scratch is its own. KPREMOTE_SIDE_START=exec starts sides the old way: the two must look alike to task code."""
    from agent.test_runner import agent_env, copy_fixture, results_of, runner_command
    from kpremote.agent.harness.sidestarter import START_ENV

    task = copy_fixture(tmp_path)
    kernel = task / "solution" / "kernel.py"
    kernel.write_text(SIDE_SEES + kernel.read_text())
    seen = {}
    for how in ("fork", "exec"):
        run_dir = tmp_path / f"run-{how}"
        env = {**agent_env(), **({START_ENV: "exec"} if how == "exec" else {})}
        done = subprocess.run(runner_command(task, run_dir, "--workloads", "grid_r1_c33"), env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert results_of(run_dir)["rows"][0]["status"] == "PASSED"
        seen[how] = json.loads((run_dir / "raw" / "scratch" / "candidate" / "seen.json").read_text()
                               .replace(str(run_dir), "RUN"))
    forked, execd = seen["fork"], seen["exec"]
    assert "kpremote.agent.harness.side" in execd["cmdline"]
    assert "kpremote.agent.harness.side" not in forked["cmdline"]  # a copy of the judge, never exec'd again
    assert sorted(forked["fds"].values()) == sorted(execd["fds"].values()), seen
    assert list(forked["fds"].values()).count("socket") == 1, forked
    assert forked["cpu_s"] < execd["cpu_s"]  # the exec'd side had imported torch itself by then (~1.4 CPU-s)


@pytest.mark.skipif(os.geteuid() != 0, reason="what root keeps: this test runs as root (CI does)")
@pytest.mark.parametrize("admin_only", ["1", "0", None])
def test_a_profiled_process_keeps_roots_capabilities_only_where_the_gpus_counters_are_roots(
        tmp_path: Path, admin_only: str | None) -> None:
    """Nsight Compute reads the counters in the profiled process: where the driver keeps them for CAP_SYS_ADMIN
    (RmProfilingAdminOnly: 1) that process keeps its capabilities and says so; elsewhere, and every timed side
    always, it holds none."""
    params = tmp_path / "params"
    if admin_only is not None:
        params.write_text(f"ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: {admin_only}\n")
    code = textwrap.dedent('''
        import json, sys
        from kpremote.agent import sandbox
        from kpremote.agent.sandbox import privileges
        privileges.NVIDIA_PARAMS = sys.argv[1]
        applied = sandbox.enter(profiled=sys.argv[2] == "profiled")
        print(json.dumps({"applied": applied, "effective": privileges.held()["CapEff"]}))
    ''')
    seen = {}
    for how in ("profiled", "timed"):
        done = subprocess.run([sys.executable, "-c", code, str(params), how], capture_output=True, text=True,
                              timeout=60, env={**ENV, **sandbox.scratch_env(sandbox.make_scratch(tmp_path / how))})
        assert done.returncode == 0, done.stderr
        seen[how] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["timed"]["applied"].endswith(", no capabilities") and seen["timed"]["effective"] == 0
    if admin_only == "1":
        assert seen["profiled"]["applied"].endswith(", " + "capabilities kept (the GPU's counters are root's: "
                                                    "RmProfilingAdminOnly)")
        assert seen["profiled"]["effective"] != 0
    else:
        assert seen["profiled"] == seen["timed"]
