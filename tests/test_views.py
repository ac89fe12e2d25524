"""What people read, at 80, 100 and 140 columns (COLUMNS, as a terminal sets it): gpu-status one line per GPU at
100 and at most two at 80, errors whole on lines of their own, run ids and workload ids never cut, colors only when
wanted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from kpremote.agent.results import RunResults
from kpremote.views.results import results_view
from localproject import TASK, kp, make_project, watch_for

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLOR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|9[0-7]|4[0-9])(?:;[0-9;]*)?m")  # an SGR sequence that sets a color
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("views") / "proj")


def gpu_lines(stdout: str) -> dict[int, list[str]]:
    """GPU index -> its lines (its own and the indented ones under it)."""
    by_gpu: dict[int, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        match = re.match(r"\[(\d+)\] ", line)
        if match:
            current = int(match.group(1))
            by_gpu[current] = [line]
        elif line.startswith("    ") and current is not None:
            by_gpu[current].append(line)
        else:
            current = None
    return by_gpu


@pytest.mark.parametrize("columns", [80, 100, 140])
def test_gpu_status_is_one_line_per_gpu_and_no_wider_than_the_terminal(project, columns):
    result = kp(project, "gpu-status", columns=columns)
    assert result.returncode == 2  # `gone` is down: unreachable, as for every command
    lines = result.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), lines
    by_gpu = gpu_lines(result.stdout)
    assert sorted(by_gpu) == [0, 1]
    assert all(len(gpu) == 1 for gpu in by_gpu.values()), by_gpu
    assert by_gpu[0][0].rstrip().endswith("idle") and "busy" in by_gpu[1][0]
    assert "python3(65900M)" in by_gpu[1][0]  # the process that makes it busy, gpustat's way
    # the unreachable host: its error whole, on a line of its own, not squeezed into a column
    [error] = [line for line in lines if "unreachable:" in line]
    assert error.strip().startswith("gone: unreachable: 127.0.0.1:9")


@pytest.mark.parametrize("columns", [80, 100])
def test_gpu_status_details_take_at_most_a_second_line(project, columns):
    result = kp(project, "gpu-status", "--host", "local", "-p", "-u", columns=columns)
    by_gpu = gpu_lines(result.stdout)
    assert all(1 <= len(gpu) <= 2 for gpu in by_gpu.values()), by_gpu
    text = "\n".join(by_gpu[1])
    assert "GPU-00000001-fixture-h200" in text and "python3/4242(65900M)" in text  # -u and -p, whole
    plain = kp(project, "gpu-status", "--host", "local", columns=columns)
    assert "fixture-h200" not in plain.stdout and "4242" not in plain.stdout


def test_gpu_status_show_all_says_why_a_gpu_is_busy(project):
    result = kp(project, "gpu-status", "--host", "local", "--show-all", columns=140)
    assert "busy: 1 compute process" in result.stdout and "SM 345/1980 MHz" in result.stdout


def test_colors_only_when_wanted(project):
    forced = {"FORCE_COLOR": "1", "NO_COLOR": ""}
    colored = kp(project, "gpu-status", "--host", "local", env=forced)
    assert ANSI.search(colored.stdout)
    assert not ANSI.search(kp(project, "gpu-status", "--host", "local", "--no-color", env=forced).stdout)
    assert COLOR.search(colored.stdout)
    assert not COLOR.search(kp(project, "gpu-status", "--host", "local", env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).stdout)


def test_watch_shows_when_it_was_updated(project):
    result = watch_for(project, lambda out: out.count("[0] NVIDIA H200") >= 2, "gpu-status", "--host", "local",
                       "--watch", "0.5")  # Ctrl-C once two refreshes are printed whole
    assert result.returncode == 130, result.stderr  # Ctrl-C ends a watch with 130, as the README says
    assert result.stderr.splitlines() == ["stopped watching"]  # how a watch stops: no error
    stamps = re.findall(r"^updated at \d\d:\d\d:\d\d · every 0.5 s", result.stdout, re.M)
    assert len(stamps) >= 2  # piped, each refresh is printed in turn under its own header
    assert result.stdout.count("[0] NVIDIA H200") == len(stamps)


@pytest.mark.parametrize("columns", [80, 100, 140])
def test_status_and_check_keep_ids_whole(project, columns):
    done = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", columns=columns)
    assert done.returncode == 0, done.stderr
    run_id = RUN_ID.findall(done.stdout)[0]
    assert re.search(r"\[1/2\] prod_r8_c256: PASSED  speedup [\d.]+x  \(smoke\)", done.stdout)  # smoke label
    status = kp(project, "status", "--host", "local", columns=columns)
    assert status.returncode == 0, status.stderr
    assert all(len(line) <= columns for line in status.stdout.splitlines())
    [line] = [line for line in status.stdout.splitlines() if run_id in line]  # the id whole, on one line
    assert "passed" in line and "(smoke)" in line  # the smoke label in the headline
    assert f"local · {TASK}" in status.stdout


def test_check_prints_rows_on_stdout_and_no_raw_runner_line(project):
    result = kp(project, "check", "--task", TASK, columns=80)
    assert result.returncode == 0, result.stderr
    assert '{"run_dir"' not in result.stdout + result.stderr
    assert re.search(r"^\[1/2\] prod_r8_c256: PASSED .*\(smoke\)$", result.stdout, re.M)
    assert "[1/2]" not in result.stderr
    assert "headline:" in result.stdout and "prod_r8_c256" in result.stdout and "grid_r3_c100" in result.stdout


# ---------------------------------------------------------------------------------------- the results table

LONG_IDS = ["qwen_sdpa_bf16_b1_s4096_h32_d128", "qwen_sdpa_bf16_b1_s4096_h32_d64",
            "grid_bf16_r1_c33_odd", "grid_bf16_r1_c33_odd_strided"]


def results(verdicts: bool = True) -> dict:
    rows = []
    for number, workload in enumerate(LONG_IDS):
        timing = {side: {"n": 50, "median": 100.0 + number + (10 if side == "baseline" else 0), "p10": 99.0,
                         "p90": 120.0} for side in ("baseline", "candidate")}
        rows.append({"workload": workload, "production": number < 2, "status": "PASSED", "speedup": 1.1 - 0.1 * number,
                     "timing": timing, "gbps": {"candidate": 1234.5}, "smoke": False,
                     "params": {"seq": 4096 if number < 2 else 33, "head_dim": 128 - 64 * (number % 2), "smoke": True,
                                "dtype": "bf16"},
                     **({"verdict": {"verdict": ["FASTER", "SAME", "SAME", "SLOWER"][number]}} if verdicts else {}),
                     "message": "the candidate read past the row end" if number == 3 else None})
    return {"schema": "kpremote.results/1", "status": "passed", "exit_code": 0, "smoke": False,
            "provenance": {"task": {"name": "t"}, "copy_bandwidth": {"gbps": 4000.0}, "gpu": {"name": "NVIDIA H200"}},
            "rows": rows, "headline": {"geomean": 1.05, "low": 1.0, "high": 1.1, "n": 2, "of": 2, "level": 0.95}}


def render(document: dict, width: int) -> str:
    console = Console(width=width, record=True, no_color=True, file=open("/dev/null", "w"))
    console.print(results_view(RunResults.from_json(document), width))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 140])
def test_results_table_keeps_workload_ids_whole_and_shows_the_verdict(width):
    text = render(results(), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    for workload, verdict in zip(LONG_IDS, ["FASTER", "SAME", "SAME", "SLOWER"]):
        [line] = [line for line in lines if re.search(rf"^{workload}\s", line)]  # whole, and its row tells it apart
        assert verdict in line
    assert "1.100x" in text  # the speedup is never the column that goes
    # the note is on a line of its own
    assert any(line.startswith("grid_bf16_r1_c33_odd_strided: the candidate read past") for line in lines)


def test_results_table_drops_columns_before_cutting_and_shows_only_the_keys_that_differ():
    wide, narrow = render(results(), 140), render(results(), 80)
    assert "% copy BW" in wide and "shape" in wide
    assert "seq=4096 head_dim=128" in wide and "smoke=True" not in wide and "dtype" not in wide

    def header(text: str) -> list[str]:
        return next(line for line in text.splitlines() if line.startswith("workload")).split()

    assert "prod" in header(wide) and "prod" not in header(narrow)  # a whole column went, nothing was cut
    assert len(header(narrow)) < len(header(wide))


def test_results_table_without_verdicts_has_no_verdict_column():
    assert "verdict" not in render(results(verdicts=False), 140)


def test_a_faster_row_the_audit_cannot_vouch_for_reads_unverified_with_its_blind_spot():
    document = results()
    document["rows"][0]["verdict"]["forge_blind_spot_pct"] = 12.4
    lines = render(document, 140).splitlines()
    [row] = [line for line in lines if line.startswith(LONG_IDS[0] + " ")]
    assert "FASTER (unverified)" in row
    assert f"{LONG_IDS[0]}: FASTER — unverified: the audit cannot see a forge under 12 % on this row" in lines
    [other] = [line for line in lines if line.startswith(LONG_IDS[1] + " ")]
    assert "unverified" not in other


def test_logs_render_events_like_the_live_view_and_take_short_ids(project):
    done = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    run_id = __import__("json").loads(done.stdout)["runs"][0]["run_id"]
    for named in (run_id[-6:], "latest", run_id):
        logs = kp(project, "logs", "--host", "local", "--run", named, columns=100)
        assert logs.returncode == 0, logs.stderr
        assert re.search(r"^\d\d:\d\d:\d\d  \[1/2\] prod_r8_c256: PASSED  speedup \d\.\d{3}x  \(smoke\)$",
                         logs.stdout, re.M), logs.stdout
        assert "speedup=" not in logs.stdout and "message=None" not in logs.stdout  # no raw dumps
        assert re.search(r"^\d\d:\d\d:\d\d  headline \d\.\d{3}x \(", logs.stdout, re.M)
        assert logs.stdout.rstrip().endswith(f"run {run_id}: passed")
    fetched = kp(project, "fetch-results", "--host", "local", "--task", TASK, "--run", run_id[-6:], "--json")
    assert fetched.returncode == 0, fetched.stderr
    assert __import__("json").loads(fetched.stdout)["fetched"][0]["run_id"] == run_id
    log = (project / "kernels" / TASK / "docs" / "run_log.md").read_text()
    [line] = [line for line in log.splitlines() if run_id in line]
    assert re.search(r" · passed · headline \d\.\d{3}x \([\d.–]+\) over 1 of 1 production rows \(smoke\) · fetched ",
                     line) and "{" not in line, line  # a sentence, not a JSON object


def test_the_live_line_counts_rows_and_estimates_the_rest(monkeypatch):
    from kpremote.views import run as view

    clock = [100.0]
    monkeypatch.setattr(view.time, "monotonic", lambda: clock[0])
    live = view.RunView(quiet=True)
    live.add("k", "box", "t", "20261123-101010-abcdef", None)
    live.event("k", {"event": "phase", "phase": "workload", "workload": "a", "i": 1, "n": 4})
    assert view.progress_text(live.lines["k"]) == "workload 1/4"  # no row done yet: no pace to go by
    clock[0] += 30.0
    live.event("k", {"event": "row", "workload": "a", "i": 1, "n": 4, "status": "PASSED", "label": "smoke: x"})
    live.event("k", {"event": "phase", "phase": "workload", "workload": "b", "i": 2, "n": 4})
    assert view.progress_text(live.lines["k"]) == "workload 2/4 · ETA 1m30s"  # 30 s a row, 3 rows left
    assert live.lines["k"]["smoke"] is True



@pytest.mark.parametrize("width", [80, 100])
def test_the_live_line_never_cuts_the_run_id(width):
    from kpremote.views import run as view

    run_id = "20261123-164106-8d6c2f"
    live = view.RunView(quiet=True)
    live.add("k", "ion8-h200", "h200_diffusion_fuse_scale_shift", run_id, {"index": 3, "name": "NVIDIA H200 NVL"})
    live.event("k", {"event": "phase", "phase": "workload", "workload": "a", "i": 3, "n": 14})
    live.event("k", {"event": "row", "workload": "a", "i": 3, "n": 14, "status": "PASSED", "label": "smoke: cpu"})
    console = Console(width=width, color_system=None, record=True, file=__import__("io").StringIO())
    console.print(live._current())
    drawn = console.export_text()
    assert run_id in drawn, drawn  # logs, cancel and fetch-results take it whole


@pytest.mark.parametrize("width", [80, 140])
def test_the_live_line_says_workload_once(width):
    from kpremote.views import run as view

    live = view.RunView(quiet=True)
    live.add("k", "ion8-h200", "h200_diffusion_fuse_scale_shift", "20261123-164106-8d6c2f", None)
    live.event("k", {"event": "phase", "phase": "workload", "workload": "a", "i": 3, "n": 14})
    console = Console(width=width, color_system=None, record=True, file=__import__("io").StringIO())
    console.print(live._current())
    drawn = console.export_text()
    assert "workload 3/14" in drawn and drawn.count("workload") == 1, drawn

@pytest.mark.ssh
def test_a_refused_host_key_shows_its_trust_command_whole_at_80_columns(rig, tmp_path):
    from rig import run_inv

    stranger = rig.add_host("stranger-view", trusted=False)
    hosts = rig.write_hosts_toml(tmp_path / "hosts.toml", [stranger], local=False)
    for command in (["hosts", "--check"], ["gpu-status"]):
        result = run_inv(*command, "--hosts", str(hosts), env={"COLUMNS": "80"})
        assert result.returncode == 2, result.stderr  # a refused key: not asked, as run and sync exit
        [line] = [line for line in result.stdout.splitlines() if "trust-host" in line]
        assert re.fullmatch(r"\s*inv trust-host --host stranger-view --fingerprint SHA256:\S{43}", line), line


def in_a_terminal(project: Path, *args: str) -> str:
    """Run `kpremote ARGS` on a pseudo-terminal, as in a shell: everything it drew, escape codes and all."""
    import os
    import pty
    import subprocess
    import sys

    from rig import REPO

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "KPREMOTE_NVML_FIXTURE": str(project / "nvml.json"),
           "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen([sys.executable, "-m", "kpremote.program", *args], stdout=slave, stderr=slave,
                               env=env, cwd=project)
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed: the program ended
            break
        if not chunk:
            break
        drawn += chunk
    process.wait(timeout=60)
    os.close(master)
    return drawn.decode(errors="replace")


def test_waiting_for_hosts_is_shown_on_a_terminal_only(project):
    drawn = in_a_terminal(project, "gpu-status")
    # Which host answers first depends on the machine's load; what is awaited is named, with the count.
    assert re.search(r"gpu-status: waiting for (local, gone|local|gone) \([01] of 2 answered\)", drawn), drawn
    assert "[0] " in drawn and "NVIDIA H200" in drawn
    piped = kp(project, "gpu-status")
    assert "waiting for" not in piped.stdout + piped.stderr


def test_a_run_on_a_terminal_shows_its_start_on_its_live_line(project):
    drawn = ANSI.sub("", in_a_terminal(project, "run", "--host", "local", "--task", TASK, "--device", "cpu",
                                       "--workloads", "grid_r3_c100"))
    # The run's line says each phase with the seconds so far, then the run's own line takes its place.
    assert re.search(r"local\s+demo\s+connecting …\s+\d+s", drawn), drawn
    synced = r"syncing( \d+ files? \((\d+ B|[\d.]+ KiB)\)|: nothing changed)"  # the module's earlier runs synced it
    assert re.search(rf"local\s+demo\s+{synced} …\s+\d+s", drawn), drawn
    assert re.search(r"local\s+demo\s+starting …\s+\d+s", drawn), drawn
    assert re.search(rf"local\s+demo\s+{RUN_ID.pattern}", drawn), drawn
    assert "local: demo: connecting" not in drawn  # no plain lines beside the live one


def test_ids_paths_and_commands_are_never_wrapped_even_piped_at_40_columns(project):
    long_name = "a_task_name_longer_than_forty_columns_wide"
    created = kp(project, "new-task", long_name, columns=40)
    assert created.returncode == 0, created.stderr
    assert created.stdout == f"created {project / 'kernels' / long_name}; try: inv check --task {long_name}\n"
    detached = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--workloads", "grid_r3_c100",
                  "--detach", columns=40)
    assert detached.returncode == 0, detached.stderr
    run_id = RUN_ID.search(detached.stdout).group(0)
    assert f"(follow: inv logs --host local --run {run_id} --follow)" in detached.stdout.splitlines()[0]
    followed = kp(project, "logs", "--host", "local", "--run", run_id, "--follow", columns=40)
    assert f"run {run_id}: passed" in followed.stdout.splitlines()
    fetched = kp(project, "fetch-results", "--host", "local", "--task", TASK, "--run", run_id, columns=40)
    path = project / "kernels" / TASK / "results" / "local" / run_id
    assert f"local: {TASK} run {run_id} (passed): fetched → {path}" in fetched.stdout.splitlines()
    unknown = kp(project, "fetch-results", "--host", "local", "--task", TASK, "--run", "0ff0ff", columns=40)
    assert unknown.returncode == 2
    [error] = unknown.stderr.splitlines()
    assert error.startswith("error: ") and run_id in error  # "no run '0ff0ff' ...; the newest: ..., <id>"


def test_a_host_that_answers_with_a_failure_exits_1_one_that_cannot_be_asked_2(project):
    no_nvml = {"KPREMOTE_NVML_FIXTURE": str(project / "no-such-fixture.json")}
    answered = kp(project, "gpu-status", "--host", "local", env=no_nvml)
    assert answered.returncode == 1, answered.stdout  # asked, and it said what failed
    for command in (["gpu-status"], ["status"], ["hosts", "--check"]):
        unreachable = kp(project, *command, "--host", "gone") if command != ["hosts", "--check"] \
            else kp(project, *command)
        assert unreachable.returncode == 2, (command, unreachable.stdout, unreachable.stderr)
    assert kp(project, "sync", "--host", "gone", "--task", TASK).returncode == 2  # the same host, the same code


def test_a_build_failure_names_the_command_that_brings_its_log_home(project):
    import shutil

    broken = project / "kernels" / "broken_build"
    shutil.copytree(project / "kernels" / TASK, broken)
    toml = broken / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "broken_build"'))
    (broken / "solution" / "kernel.py").write_text("def kernel(:\n")
    done = kp(project, "run", "--host", "local", "--task", "broken_build", "--device", "cpu", columns=80)
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "build failed — candidate: SyntaxError" in error
    command = re.search(r"inv fetch-results --host local --task broken_build --run (\S+) --raw-file build/candidate.log$",
                        error)
    assert command, error
    fetched = kp(project, *command.group(0).split()[1:])
    assert fetched.returncode == 0, fetched.stderr
    [log] = (broken / "results" / "local" / ".raw" / command.group(1)).rglob("candidate.log")
    assert "SyntaxError" in log.read_text()


def test_check_of_a_task_the_runner_refuses_names_it_and_exits_2(project):
    import shutil

    empty = project / "kernels" / "empty_solution"
    shutil.copytree(project / "kernels" / TASK, empty)
    toml = empty / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "empty_solution"'))
    for path in (empty / "solution").iterdir():
        path.unlink()
    result = kp(project, "check", "--task", "empty_solution", columns=100)
    assert result.returncode == 2, result.stdout + result.stderr  # bad input, as the README promises
    assert "empty_solution: error (exit code 2)" in result.stdout and "?:" not in result.stdout
    assert "missing in kernels/empty_solution/solution" in result.stdout


@pytest.mark.parametrize("width", [80, 120])
def test_status_lists_the_newest_runs_with_their_age_and_a_cancelled_wait_as_over(monkeypatch, width):
    import io

    from kpremote.views import runlist, terminal

    console = Console(width=width, color_system=None, record=True, file=io.StringIO())
    monkeypatch.setattr(terminal, "console", console)
    runs = [{"run_id": f"20261120-10{minute:02d}00-aaaa{minute:02d}", "task": "t", "status": "passed", "phase": "done",
             "started": f"2026-11-20T10:{minute:02d}:01Z", "gpu": {"index": 0}} for minute in range(12)]
    runs.append({"run_id": "20261120-103000-cccccc", "task": "t", "status": "cancelled",
                 "phase": "waiting for a GPU", "gpu": None})  # cancelled while it waited: never started
    console.print(runlist.runs_view([{"host": "box", "ok": True, "runs": runs}]))
    lines = console.export_text().splitlines()
    [header] = [line for line in lines if line.startswith("run ")]
    assert "age" in header.split(), header  # kept at 80 columns: the gpu index goes first
    [cancelled] = [line for line in lines if "cccccc" in line]
    assert re.search(r" \d+h\d\dm ", cancelled), cancelled  # its age, from its id: it never started
    assert width == 80 or "ended in: waiting for a GPU" in cancelled, cancelled  # not waiting any more
    assert sum(1 for line in lines if line.startswith("20261120-")) == runlist.SHOWN
    assert "aaaa00" not in "\n".join(lines) and "aaaa11" in "\n".join(lines)  # the newest ones
    assert "  and 3 older run(s) of t (inv status --all lists them)" in lines


@pytest.mark.parametrize("width", [80, 250])
def test_status_says_why_a_run_failed_on_a_line_of_its_own_at_any_width(monkeypatch, width):
    import io

    from kpremote.views import runlist, terminal

    console = Console(width=width, color_system=None, record=True, file=io.StringIO())
    monkeypatch.setattr(terminal, "console", console)
    why = "1 of 2 row(s) not passed: prod_r8 INCORRECT — prod_r8: candidate output 'out' is wrong: first mismatch"
    runs = [{"run_id": "20261120-100000-aaaaaa", "task": "t", "status": "failed", "phase": "done", "message": why,
             "started": "2026-11-20T10:00:01Z", "gpu": {"index": 0}},
            {"run_id": "20261120-110000-bbbbbb", "task": "t", "status": "passed", "phase": "done",
             "started": "2026-11-20T11:00:01Z", "gpu": {"index": 0}}]
    console.print(runlist.runs_view([{"host": "box", "ok": True, "runs": runs}]))
    text = " ".join(console.export_text().split())
    assert f"20261120-100000-aaaaaa: {why}" in text, text  # not a column that a narrower terminal drops
    assert text.count("not passed") == 1


def test_a_smoke_runs_rows_show_no_verdict_anywhere(tmp_path):
    from kpremote.agent.run.resultsmd import render_results_md

    document = results()
    document["smoke"] = True
    for row in document["rows"]:
        row.update(smoke=True, label="smoke: timings are not meaningful",
                   verdict={**row["verdict"], "low": 1.0, "high": 1.2})
    shown = render(document, 140)
    assert not any(word in shown for word in ("FASTER", "SLOWER", "SAME")), shown
    markdown = render_results_md(RunResults.from_json(document), plot_missing="no plot: smoke")
    assert not any(word in markdown for word in ("FASTER", "SLOWER")), markdown


def test_hosts_check_keeps_what_it_checks_at_80_columns_and_takes_a_host(project):
    checked = kp(project, "hosts", "--check", columns=80)
    lines = checked.stdout.splitlines()
    [header] = [line for line in lines if line.startswith("host ")]
    assert {"reachable", "python", "torch", "triton", "nvidia-ml-py", "sandbox"} <= set(header.split()), header
    assert all(len(line) <= 80 for line in lines), lines
    one = kp(project, "hosts", "--check", "--host", "local", "--json")
    assert one.returncode == 0, one.stderr  # only the reachable one asked
    assert [h["name"] for h in __import__("json").loads(one.stdout)["hosts"]] == ["local"]


def test_the_local_host_without_an_nvidia_driver_is_a_cpu_machine_not_a_failure(project):
    result = kp(project, "gpu-status", "--host", "local", env={"KPREMOTE_NVML_FIXTURE": ""})  # the real NVML
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPUs here (no NVIDIA driver): runs on this host are CPU smoke runs" in result.stdout or \
        "[0] " in result.stdout  # a machine with a GPU shows it
    assert "failed" not in result.stdout


def test_a_raising_solution_is_shown_with_the_file_and_line_that_raised(project):
    import shutil

    raising = project / "kernels" / "raising_solution"
    shutil.copytree(project / "kernels" / TASK, raising)
    toml = raising / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "raising_solution"'))
    kernel = raising / "solution" / "kernel.py"
    source = kernel.read_text()
    function = re.search(r"^def ([a-z]\w*)\(", source, re.M).group(1)  # the entry point the adapter calls
    kernel.write_text(source + f"\n\ndef {function}(*args, **kwargs):\n    raise ValueError('boom in the candidate')\n")
    line = len(kernel.read_text().splitlines())
    result = kp(project, "check", "--task", "raising_solution", "--workloads", "grid_r3_c100", columns=100)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"ValueError: boom in the candidate (at solution/kernel.py:{line})" in " ".join(result.stdout.split()), \
        result.stdout


def test_an_error_in_a_kernels_body_points_at_its_line_not_the_launch(project):
    import shutil

    broken = project / "kernels" / "broken_body"
    shutil.copytree(project / "kernels" / TASK, broken, ignore=shutil.ignore_patterns("results", "ledger.jsonl"))
    toml = broken / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "broken_body"'))
    kernel = broken / "solution" / "kernel.py"
    lines = kernel.read_text().splitlines()
    [line] = [number for number, text in enumerate(lines, 1) if "tl.load(shift_ptr" in text]  # inside the @triton.jit
    lines[line - 1] = lines[line - 1].replace("tl.load(shift_ptr", "tl.lod(shift_ptr")
    kernel.write_text("\n".join(lines) + "\n")
    result = kp(project, "check", "--task", "broken_body", "--workloads", "grid_r3_c100", columns=100)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"(at solution/kernel.py:{line})" in result.stdout, result.stdout  # Triton's interpreter's first cause


def test_a_leased_gpu_names_its_run_and_who_started_it():
    from kpremote.agent.protocol import ProbedGpu
    from kpremote.hosts.gpustatus import HostReport
    from kpremote.views.gpus import gpu_view

    gpu = ProbedGpu.from_json({"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "cc": [9, 0],
                               "memory_used_mib": 0, "memory_total_mib": 143771, "util_pct": 0, "idle": True,
                               "lease": {"run_id": "20261126-070000-abcdef", "user": "alice", "pid": 7}})
    console = Console(width=100, color_system=None, record=True, file=__import__("io").StringIO())
    console.print(gpu_view([HostReport(host="box", ok=True, hostname="box", source="fixture", gpus=[gpu])]))
    assert "leased by 20261126-070000-abcdef (alice)" in console.export_text()


def test_a_row_line_names_host_and_task_only_when_several_runs_are_followed():
    from kpremote.views import run as view

    live = view.RunView(quiet=True)
    live.add("a", "ion8-h200", "h200_diffusion_fuse_scale_shift__multi_shape", "20261123-164106-8d6c2f", None)
    event = {"event": "row", "workload": "prod_r8_c256", "i": 1, "n": 2, "status": "PASSED", "speedup": 1.024}
    text = lambda key: "".join(s.text for s in live._row_segments(live.lines[key], event))  # noqa: E731
    assert text("a") == "[1/2] prod_r8_c256: PASSED  speedup 1.024x"  # one run: short, under 80 columns
    live.add("b", "ion9-h200", "h200_diffusion_norm_infer__multi_shape", "20261123-164107-aaaaaa", None)
    assert text("b").startswith("ion9-h200 h200_diffusion_norm_infer__multi_shape [1/2] prod_r8_c256: PASSED")


def test_a_change_too_few_process_pairs_read_is_shown_as_held(tmp_path):
    from kpremote.agent.run.resultsmd import render_results_md

    document = results()
    row = document["rows"][0]
    row["verdict"] = {**row["verdict"], "verdict": "SAME", "pairs_pointing": 1, "pairs_needed": 3,
                      "held": "FASTER by the pooled samples, but 1 of 4 process pairs read it FASTER (3 needed)"}
    markdown = render_results_md(RunResults.from_json(document), plot_missing="not drawn")
    note = f"- `{row['workload']}`: SAME: FASTER by the pooled samples, but 1 of 4 process pairs read it FASTER (3 needed)"
    assert note in markdown.splitlines(), markdown
    shown = " ".join(render(document, 140).split())  # the terminal's table and its notes, rewrapped
    assert f"{row['workload']}: SAME: FASTER by the pooled samples, but 1 of 4 process pairs read it FASTER" in shown, shown


def test_results_md_shows_each_rows_numerical_contract_and_leaves_it_out_for_older_rows(tmp_path):
    from kpremote.agent.run.resultsmd import render_results_md

    document = results()
    old = render_results_md(RunResults.from_json(document), plot_missing="not drawn")
    assert "Numerical contract" not in old  # rows judged before the contract existed: no table
    first, second = document["rows"][0], document["rows"][1]
    first["correctness"] = {**(first.get("correctness") or {}), "numerics": {
        "contract": "close", "checked": True, "reason": None,
        "outputs": {"out": {"rms_ratio": 1.04, "max_ratio": 1.134, "bias": -0.0012}}}}
    second["correctness"] = {**(second.get("correctness") or {}), "numerics": {
        "contract": "close", "checked": False, "outputs": {},
        "reason": "seed 1: the adapter's reference raised on float64 inputs: TypeError: a | b"}}
    markdown = render_results_md(RunResults.from_json(document), plot_missing="not drawn").splitlines()
    assert f"| `{first['workload']}` | close | `out` RMS 1.04x, max 1.13x the baseline's error, bias -0.00 of RMS |" \
        in markdown, markdown
    assert (f"| `{second['workload']}` | close | NOT CHECKED: seed 1: the adapter's reference raised on float64 "
            "inputs: TypeError: a / b |") in markdown, markdown


def test_the_command_a_failed_builds_message_names_is_whole_at_80_columns():
    import io

    command = ("inv fetch-results --host box --task t --run 20261120-100000-aaaaaa --raw-file build/candidate.log")
    document = {**results(), "status": "error", "exit_code": 3,
                "message": f"build failed — candidate: SyntaxError in kernel.py; its log, on the host: {command}"}
    console = Console(width=80, color_system=None, record=True, file=io.StringIO())
    console.print(results_view(RunResults.from_json(document), 80), crop=False)
    lines = console.export_text().splitlines()
    assert f"  {command}" in lines, lines  # on a line of its own, whole: a command to paste
