"""The whole agent on the CPU: python -m kpremote.agent.run.runner --device cpu on the tiny Triton fixture task.

Triton runs through its interpreter (the runner sets TRITON_INTERPRET=1 for CPU runs), so this is the smoke
path `inv check` takes. The helpers here are shared with test_adversarial.py and test_scaffold.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kpremote.agent import harness
from kpremote.agent.task import build
from kpremote.agent.run import guards, report, resultsmd, runner
from kpremote.agent.harness import stats
from kpremote.agent.harness.judge import TIMING_CASES_CPU
from kpremote.agent.run.events import read_events
from kpremote.agent.procfs import descendants
from kpremote.agent.results import RowResult, RowVerdict, RunResults
from kpremote.agent.run.runstate import read_state
from kpremote.agent.harness.timing import SMOKE_SAMPLES
from waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "tasks"
SMOKE = "smoke: timings are not meaningful"


def agent_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KPREMOTE_NVML_FIXTURE", "KPREMOTE_ROOT", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(REPO)
    return env


def runner_command(task_dir: Path, run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "kpremote.agent.run.runner", "--task-dir", str(task_dir), "--run-dir", str(run_dir),
            "--device", "cpu", *args]


def run_agent(task_dir: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(runner_command(task_dir, run_dir, *args), env=agent_env(), capture_output=True, text=True,
                          timeout=600)


def copy_fixture(destination: Path, name: str = "tiny_rmsnorm") -> Path:
    task = destination / name
    shutil.copytree(FIXTURES / name, task)
    return task


def make_cuda_variant(destination: Path) -> Path:
    """tiny_rmsnorm as a CUDA task: the same adapter and rows, sources from fixtures/tasks/cuda_sources."""
    task = copy_fixture(destination)
    for side in ("baseline", "solution"):
        (task / side / "kernel.py").unlink()
        shutil.copy(FIXTURES / "cuda_sources" / side / "kernel.cu", task / side / "kernel.cu")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('kind = "triton"\nflags = []',
                                             'kind = "cuda"\nflags = ["-O3"]\nsources = ["kernel.cu"]'))
    return task


def results_of(run_dir: Path) -> dict[str, Any]:
    """The run's results.json, checked against docs/schemas/results.json: every run these tests make (passed, not
    checked, failed to build, invalid, cancelled) is real output the schema must describe."""
    results = json.loads((run_dir / "summary" / "results.json").read_text())
    jsonschema.Draft202012Validator(json.loads((REPO / "docs" / "schemas" / "results.json").read_text())).validate(results)
    assert RunResults.from_json(results).to_json() == results  # the record the agent built reads back as written
    return results


def events_of(run_dir: Path) -> list[dict[str, Any]]:
    return read_events(run_dir / "raw" / "events.jsonl")[0]


def rows_by_id(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {row["workload"]: row for row in results_of(run_dir)["rows"]}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("smoke")
    task = copy_fixture(base)
    run_dir = base / "runs" / "run-1"
    return run_dir, run_agent(task, run_dir, "--host-alias", "laptop")


def test_a_clean_smoke_run_passes_with_exit_code_0(smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, done = smoke_run
    assert done.returncode == 0, done.stderr
    state = read_state(run_dir)
    assert state["status"] == "passed" and state["exit_code"] == 0 and state["phase"] == "done"
    assert state["workload"] == {"i": 3, "n": 3, "id": "grid_r1_c33"} and state["finished"]
    assert state["headline"]["n"] == 2


def test_the_runs_state_json_is_its_record_and_every_row_declares_all_it_carries(
        smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    """state.json validates against docs/schemas/state.json (drawn from results.RunState, closed), and no row of the
    run's results.json carries a key its record does not declare (RowResult.newer stays empty)."""
    run_dir, _ = smoke_run
    schemas = REPO / "docs" / "schemas"
    jsonschema.Draft202012Validator(json.loads((schemas / "state.json").read_text())).validate(read_state(run_dir))
    results = RunResults.read(run_dir / "summary" / "results.json")
    assert results.rows and all(not row.newer and not (row.timing and row.timing.newer) for row in results.rows)
    assert {"seeds", "seconds", "log", "processes", "checks"} <= set(results.rows[0].to_json())  # declared, kept


def test_events_tell_the_run_in_order(smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = smoke_run
    events = events_of(run_dir)
    names = [e["event"] if e["event"] != "phase" else f"phase:{e['phase']}" for e in events]
    assert names == [
        "phase:validate", "phase:lease", "phase:build", "build", "build", "provenance", "phase:workloads",
        "phase:workload", "row", "phase:workload", "row", "phase:workload", "row",
        "phase:report", "headline", "done",
    ]
    builds = [e for e in events if e["event"] == "build"]
    assert {b["side"] for b in builds} == {"baseline", "candidate"} and all(b["ok"] for b in builds)
    rows = [e for e in events if e["event"] == "row"]
    assert [(r["i"], r["n"], r["status"], r["label"]) for r in rows] == [(i, 3, "PASSED", SMOKE) for i in (1, 2, 3)]
    assert all(r["baseline_n"] and r["candidate_median_us"] > 0 for r in rows)
    assert events[-1] == {**events[-1], "event": "done", "status": "passed", "exit_code": 0}


def test_results_md_reports_every_statistic_the_rule_sheet_asks_for(
    smoke_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """The task rule sheet: a claim reports median, mean, std, min, p10 and p90 per workload (issue 28, item 2)."""
    run_dir, _ = smoke_run
    markdown = (run_dir / "summary" / "results.md").read_text()
    assert "| workload | side | n | median | mean | std | min | p10 | p90 |" in markdown
    for row in results_of(run_dir)["rows"]:
        for side in ("baseline", "candidate"):
            stats = row["timing"][side]
            cells = [str(stats["n"])] + [resultsmd._number(stats[k]) for k in ("median", "mean", "std", "min", "p10", "p90")]
            assert f"| `{row['workload']}` | {side} | " + " | ".join(cells) + " |" in markdown


def test_each_row_carries_its_numerical_contract_through_the_judge(
    smoke_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """The judge scores every correctness case against the float64 reference (harness/numerics.py): a float32 row's
    worst ratios reach results.json and results.md."""
    run_dir, _ = smoke_run
    markdown = (run_dir / "summary" / "results.md").read_text()
    for row in results_of(run_dir)["rows"]:
        record = row["correctness"]["numerics"]
        assert record["contract"] == "close" and record["checked"] is True, record
        entry = record["outputs"]["out"]
        assert 0 < entry["rms_ratio"] <= 1.5 and 0 < entry["max_ratio"] <= 1.5 and entry["baseline_rms"] > 0
        assert f"| `{row['workload']}` | close | `out` RMS {entry['rms_ratio']:.2f}x" in markdown


def test_results_json_carries_provenance_rows_and_headline(smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = smoke_run
    results = results_of(run_dir)
    assert results["schema"] == "kpremote.results/1" and results["smoke"] is True and results["label"] == SMOKE
    prov = results["provenance"]
    assert prov["command"][1:3] == ["-m", "kpremote.agent.run.runner"]
    assert prov["task"]["name"] == "tiny_rmsnorm" and prov["baseline_upstream"]["commit"] == "unresolved"
    assert len(prov["source"]["solution_sha256"]) == 64 and prov["source"]["origin"] == "computed by the agent"
    assert prov["host"]["alias"] == "laptop" and prov["host"]["hostname"]
    assert prov["versions"]["torch"] and prov["versions"]["triton"]
    assert prov["build"]["kind"] == "triton" and prov["build"]["flags"] == [] and prov["build"]["ok"] is True
    assert prov["build"]["env"]["TRITON_INTERPRET"] == "1"
    assert prov["build"]["env"]["TRITON_CACHE_DIR"] == str(run_dir / "raw" / "triton-cache")
    assert prov["timing_settings"]["seeds"] == 2 and prov["mode"] == "smoke"
    assert prov["copy_bandwidth"]["gbps"] > 0 and prov["gpu"] is None
    rows = results["rows"]
    assert [r["workload"] for r in rows] == ["prod_r4_c64", "prod_r3_c100", "grid_r1_c33"]
    assert all(r["verdict"]["process_floor_us"] == 0.0 for r in rows)  # the GPU's process floor is a GPU row's only
    assert prov["harness"] == harness.harness_record() and prov["harness"]["version"] == harness.HARNESS_VERSION
    assert prov["pinned"] == harness.pinned_inputs(run_dir.parents[1] / "tiny_rmsnorm")
    assert prov["gpu_readings"] == "none (CPU run)" and prov["audit"] == "unaudited: CPU run"
    seeds_used = set()
    for row in rows:
        # the row's seeds, and the timing cases (each checked before it is timed), derive from the run's secret
        assert row["status"] == "PASSED" and row["correctness"]["seeds_checked"] == 2 + TIMING_CASES_CPU
        assert len(row["seeds"]["correctness"]) == 2 and len(row["seeds"]["timing"]) == TIMING_CASES_CPU
        seeds_used |= set(row["seeds"]["correctness"] + row["seeds"]["timing"])
        assert row["verdict"]["verdict"] is None  # a smoke row's timings mean nothing: no word is said on them
        assert row["verdict"]["low"] <= row["speedup"] <= row["verdict"]["high"]
        assert row["checks"]["memory_isolation"] == "memfd" and row["checks"]["timing_cases"] == TIMING_CASES_CPU
        assert row["correctness"]["max_abs_err"]["out"] < 1e-5
        for side in ("baseline", "candidate"):
            assert set(row["timing"][side]) >= {"n", "median", "mean", "std", "min", "p10", "p90", "dropped_clock"}
        assert row["speedup"] == pytest.approx(row["timing"]["baseline"]["median"] / row["timing"]["candidate"]["median"])
        assert row["bytes_moved"] > 0 and row["gbps"]["candidate"] > 0
    assert len(seeds_used) == 3 * (2 + TIMING_CASES_CPU) and not seeds_used & {0, 1, 2, 3}
    head = results["headline"]
    assert (head["n"], head["of"], head["label"]) == (2, 2, SMOKE)
    assert head["low"] <= head["geomean"] <= head["high"]


def test_summary_and_raw_files(smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    run_dir, _ = smoke_run
    markdown = (run_dir / "summary" / "results.md").read_text()
    assert "**SMOKE RUN**" in markdown and "**Headline:**" in markdown
    assert resultsmd.harness_staleness(markdown) is None  # measured by this very harness
    older = markdown.replace(harness.harness_digest(), "0" * 64)
    assert resultsmd.harness_staleness(older).startswith("measured by an older harness (version")
    task = run_dir.parents[1] / "tiny_rmsnorm"
    assert resultsmd.pinned_staleness(markdown, task) == []
    changed = markdown.replace(harness.pinned_inputs(task)["task_toml_sha256"], "f" * 64)
    assert resultsmd.pinned_staleness(changed, task) == ["task.toml changed since these results were measured "
                                                      "(ffffffffffff -> " + harness.pinned_inputs(task)["task_toml_sha256"][:12] + ")"]
    assert all(f"| `{w}` |" in markdown for w in ("prod_r4_c64", "prod_r3_c100", "grid_r1_c33"))
    assert "row 3/3 `grid_r1_c33`: PASSED" in (run_dir / "summary" / "run_log.md").read_text()
    samples = [json.loads(line) for line in (run_dir / "raw" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and all(len(s["times"]) == SMOKE_SAMPLES and s["unit"] == "us" for s in samples)
    assert (run_dir / "raw" / "build" / "baseline.log").exists() and (run_dir / "raw" / "build" / "candidate.log").exists()
    assert not (run_dir / "summary" / "speedup.png").exists()  # a smoke run draws no plot (tests/test_plot.py)


def test_each_rows_judge_holds_it_to_the_probes_fastest_copy(smoke_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    """The floor's bandwidth is what a copy of the probe reached (its fastest repeat), not the probe's median: a
    probe whose every repeat ran slow refused honest copy-speed rows against its median (harness 2.16). The judge's
    job for each row, kept in raw/workloads/, carries it."""
    run_dir, _ = smoke_run
    results = results_of(run_dir)
    copy = results["provenance"]["copy_bandwidth"]
    assert copy["best_gbps"] >= copy["gbps"] > 0
    for row in results["rows"]:
        job = json.loads((run_dir / "raw" / "workloads" / f"{row['workload']}.job.json").read_text())
        assert job["copy_gbps"] == copy["best_gbps"]


def prepare_job(tmp_path: Path, device: str, prelude: str = "") -> tuple[Path, Path, Path]:
    """A copy of the fixture task (each side's kernel.py opened by `prelude`), a run folder and the prepare step's
    job for `device`: (run folder, job, out), the worker's result to be written at out."""
    task = copy_fixture(tmp_path)
    for side in ("baseline", "solution"):
        kernel = task / side / "kernel.py"
        kernel.write_text(prelude + kernel.read_text())
    run_dir = tmp_path / "run"
    (run_dir / "raw").mkdir(parents=True)
    job = tmp_path / "prepare.job.json"
    job.write_text(json.dumps({"task_dir": str(task), "run_dir": str(run_dir), "device": device, "mode": None}))
    return run_dir, job, tmp_path / "prepare.json"


def test_a_cpu_runs_prepare_step_records_torch_and_a_copy_bandwidth_without_importing_torch(tmp_path: Path) -> None:
    """A CPU run's prepare worker builds both sides and probes the CPU without a second of torch import: the
    versions come from torch's own version file, the copy bandwidth from a memcpy (no floor holds a CPU row to it)."""
    import torch

    task = copy_fixture(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / "raw").mkdir(parents=True)
    job = tmp_path / "prepare.job.json"
    job.write_text(json.dumps({"task_dir": str(task), "run_dir": str(run_dir), "device": "cpu", "mode": None}))
    out = tmp_path / "prepare.json"
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kpremote.agent.run.worker", "prepare",
                           "--job", str(job), "--out", str(out)], env=agent_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "kpremote.agent.task.build" in imported and "torch" not in imported
    result = json.loads(out.read_text())
    assert result["build"]["ok"], result
    assert result["versions"]["torch"] == torch.__version__ and result["versions"]["cuda"] == torch.version.cuda
    assert result["device"]["copy_bandwidth"]["gbps"] > 0 and result["device"]["copy_bandwidth"]["device"] == "cpu"


RENDEZVOUS = """
import os as _os, pathlib as _pathlib, time as _time
_scratch = _pathlib.Path(_os.environ.get("KPREMOTE_SCRATCH", ""))
if _scratch.name.startswith("build-"):  # only in a build process: each side waits until it sees the other's
    (_scratch / "building").write_text("")
    _other = "build-candidate" if _scratch.name == "build-baseline" else "build-baseline"
    _deadline = _time.monotonic() + 30
    while not (_scratch.parent / _other / "building").exists():
        if _time.monotonic() > _deadline:
            raise RuntimeError("the other side was not building at the same time")
        _time.sleep(0.02)
"""


def test_both_sides_build_at_once_each_in_its_own_sandbox(tmp_path: Path) -> None:
    """Each side's build process waits, at import, until the other's has begun: built one after the other, the
    first would wait for ever (here: fail after 30 s); side by side, both builds pass."""
    _, job, out = prepare_job(tmp_path, "cpu", RENDEZVOUS)
    done = subprocess.run([sys.executable, "-m", "kpremote.agent.run.worker", "prepare", "--job", str(job),
                           "--out", str(out)], env=agent_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sides = json.loads(out.read_text())["build"]["sides"]
    assert list(sides) == ["baseline", "candidate"]
    assert all(sides[side]["ok"] for side in sides), sides


def test_sigterm_cancels_the_run_and_its_worker(tmp_path: Path) -> None:
    task = copy_fixture(tmp_path)
    kernel = task / "solution" / "kernel.py"
    kernel.write_text(kernel.read_text() + "\n\ndef rmsnorm(x, weight, out, eps):\n    import time\n    time.sleep(600)\n")
    run_dir = tmp_path / "run"
    runner = subprocess.Popen(runner_command(task, run_dir, "--workloads", "grid_r1_c33"), env=agent_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    ready = run_dir / "raw" / "workloads" / "grid_r1_c33.ready"
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read().decode()
        time.sleep(0.1)
    workers = descendants(runner.pid)
    assert workers
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 130
    state = read_state(run_dir)
    assert state["status"] == "cancelled" and state["exit_code"] == 130
    assert events_of(run_dir)[-1]["status"] == "cancelled"
    assert results_of(run_dir)["status"] == "cancelled"
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_a_cuda_task_whose_compile_check_cannot_run_is_not_checked_and_fails(tmp_path: Path) -> None:
    task = make_cuda_variant(tmp_path)
    env = {**agent_env(), "PATH": str(tmp_path / "no-tools")}  # no nvcc: the compile-only check cannot run
    env.pop("CUDA_HOME", None)
    run_dir = tmp_path / "run"
    done = subprocess.run(runner_command(task, run_dir), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr  # a check that did not run is not a pass
    results = results_of(run_dir)
    note = "compile-only check skipped: nvcc not found on PATH or in CUDA_HOME"
    assert results["status"] == "failed" and results["provenance"]["build"]["flags"] == ["-O3"]
    build_record = results["provenance"]["build"]
    assert build_record["note"] == note and set(build_record["not_checked"]) == {"baseline", "candidate"}
    assert {r["status"] for r in results["rows"]} == {"NOT CHECKED"}
    assert all(note in r["message"] and "cannot run without a GPU" in r["message"] for r in results["rows"])
    assert results["headline"]["geomean"] is None and "NOT CHECKED" in results["headline"]["note"]
    warnings = [e["message"] for e in events_of(run_dir) if e["event"] == "warning"]
    assert warnings[0] == note and warnings[1].startswith("NOT CHECKED: baseline side (cuda) cannot run without a GPU")


def test_a_cuda_source_that_does_not_compile_fails_the_build_on_the_cpu(tmp_path: Path) -> None:
    if build.find_nvcc() is None:
        pytest.skip("needs nvcc on this machine (the compile-only check is what is tested)")
    task = make_cuda_variant(tmp_path)
    source = task / "solution" / "kernel.cu"
    source.write_text("#error this candidate does not compile\n" + source.read_text())
    run_dir = tmp_path / "run"
    done = run_agent(task, run_dir)
    assert done.returncode == 3, done.stderr
    results = results_of(run_dir)
    assert "build failed — candidate: RuntimeError: nvcc failed on kernel.cu" in results["message"]
    assert "this candidate does not compile" in results["message"]


def test_a_foreign_process_during_a_row_makes_its_timing_invalid(
    nvml_fixture: Any, make_gpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guards, "WATCH_INTERVAL_S", 0.02)
    uuid = make_gpu(0)["uuid"]
    ours = {"pid": 1001, "name": "python", "used_mib": 900}
    watch = guards.ForeignWatch(uuid, baseline_pids=set(), baseline_memory_mib=0, memory_margin_mib=2048)
    looks = []
    look = watch._look
    watch._look = lambda: (look(), looks.append(1))  # counts the poller's looks: a row is seen, not slept through

    def polled_twice() -> None:
        wanted = len(looks) + 2
        wait_for(lambda: len(looks) >= wanted, 10, "two looks of the poller")

    watch.row_started(ours=1)
    nvml_fixture(make_gpu(0, processes=[ours], memory_used_mib=900))
    polled_twice()
    nvml_fixture(make_gpu(0))  # our worker has exited
    assert watch.row_ended() is None

    watch.row_started(ours=1)
    nvml_fixture(make_gpu(0, processes=[ours, {"pid": 2002, "name": "intruder", "used_mib": 6600}]))
    polled_twice()
    nvml_fixture(make_gpu(0))
    verdict = watch.row_ended()
    assert verdict is not None and "pid 2002 intruder 6600 MiB" in verdict

    watch.row_started(ours=1)
    nvml_fixture(make_gpu(0, memory_used_mib=7000))  # a process NVML cannot see (another container) still shows
    assert "rose to 7000 MiB" in (watch.row_ended() or "")


def test_the_runs_own_processes_are_never_foreign_and_a_visible_stranger_always_is(
    nvml_fixture: Any, make_gpu: Any
) -> None:
    """Issue 25: in graph mode a row was flagged "foreign process" naming its own side. Ours are known by pid (every
    descendant of the runner, remembered for the run), however many of them NVML lists at once (a judge of the last
    row still tearing down, a new one starting); a process this host shows that is not ours is foreign whatever the
    count. Pids /proc does not show (a container's NVML reports host pids) are still counted against `ours`."""
    uuid = make_gpu(0)["uuid"]
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(5)]
    try:
        mine = [{"pid": child.pid, "name": "python", "used_mib": 500} for child in children]
        watch = guards.ForeignWatch(uuid, baseline_pids=set(), baseline_memory_mib=0, memory_margin_mib=2048)
        watch.row_started(ours=3)
        nvml_fixture(make_gpu(0, processes=mine, memory_used_mib=2500))
        assert watch.row_ended(ours=3) is None  # five of ours at once: not one of them foreign
        watch.row_started(ours=3)
        stranger = {"pid": 1, "name": "init", "used_mib": 100}  # on this host, and no child of ours
        nvml_fixture(make_gpu(0, processes=[*mine[:1], stranger], memory_used_mib=600))
        assert "pid 1 init 100 MiB" in (watch.row_ended(ours=3) or "")
        watch.row_started(ours=1)
        unseen = [{"pid": 4_000_000 + i, "name": "python", "used_mib": 500} for i in range(2)]
        nvml_fixture(make_gpu(0, processes=unseen, memory_used_mib=1000))
        assert "foreign process" in (watch.row_ended(ours=1) or "")  # two we cannot see, one of ours running
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_no_headline_while_any_production_row_failed_or_is_in_doubt() -> None:
    def row(name: str, speedup: float | None, **extra: Any) -> RowResult:
        status = extra.pop("status", "PASSED")
        return RowResult.from_json({"workload": name, "production": True, "status": status, "speedup": speedup,
                                    **extra})

    clean = [row("a", 2.0), row("b", 8.0), row("e", 3.0, production=False)]
    head = report.headline(clean, {}, smoke=False)
    assert (head.n, head.of) == (2, 2)
    assert head.geomean == pytest.approx(4.0) and head.low <= 4.0 <= head.high

    rows = [*clean, row("c", 50.0, invalid="foreign process"),
            row("d", None, status="INCORRECT", implausible="candidate: implausible: ..."),
            row("f", None, status="TIMEOUT"), row("g", None, status="ERROR", production=False)]
    head = report.headline(rows, {}, smoke=False)
    assert head.geomean is None and head.n == 0 and head.of == 5
    assert head.note == "withheld: c invalid, d implausible, f TIMEOUT"  # a regression-grid ERROR does not block
    markdown = resultsmd.render_results_md(RunResults(status="failed", exit_code=1, rows=rows, headline=head))
    assert "| PASSED (invalid) |" in markdown and "| INCORRECT (implausible) |" in markdown
    assert "- `c`: foreign process" in markdown
    assert "**Headline:** none (withheld: c invalid, d implausible, f TIMEOUT)" in markdown
    assert "geometric-mean" not in markdown


def test_the_audit_state_says_why_a_run_is_unaudited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def status(device: str, audit: str | None) -> str:
        run = runner.Runner(runner.Options(task_dir=tmp_path, run_dir=tmp_path / "run", audit=audit), [])
        run.ctx.device = device
        return run._audit_status()

    standin_ncu = REPO / "tests" / "fixtures" / "ncu" / "ncu"
    monkeypatch.setenv("KPREMOTE_NCU", str(standin_ncu))
    assert status("cpu", None) == "unaudited: CPU run"
    assert status("cuda", "off") == "unaudited: --no-audit"
    assert status("cuda", None) == "on"
    assert status("cuda", "on") == "on"
    not_executable = tmp_path / "ncu"
    not_executable.write_text("")
    monkeypatch.setenv("KPREMOTE_NCU", str(not_executable))
    assert status("cuda", None) == "unaudited: ncu not found"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "kpremote.agent.ncu.audit" else real_find_spec(name, *a))
    assert status("cuda", None) == "unaudited: audit module missing"


def test_the_headline_interval_carries_each_gpu_rows_process_floor() -> None:
    # Two 4 us rows, 1.1x each, samples tight enough that their own draws barely move: without the floor the
    # interval would exclude 1.0; with 0.75 us of possible offset between the sides' processes it must not.
    rng = random.Random(5)
    samples, rows = {}, []
    for name in ("a", "b"):
        base = [4.4 + rng.gauss(0, 0.01) for _ in range(400)]
        cand = [4.0 + rng.gauss(0, 0.01) for _ in range(400)]
        samples[name] = {"baseline": base, "candidate": cand}
        timing = {"baseline": {"n": 400, "median": 4.4}, "candidate": {"n": 400, "median": 4.0}}
        rows.append(RowResult.from_json({"workload": name, "production": True, "status": "PASSED", "speedup": 1.1,
                                         "timing": timing, "verdict": {"process_floor_us": 0.75}}))
    gpu = report.headline(rows, samples, smoke=False)
    assert gpu.geomean == pytest.approx(1.1) and gpu.low < 1.0 < 1.2 < gpu.high
    for row in rows:
        row.verdict = RowVerdict(process_floor_us=0.0)  # a CPU row: no floor, the samples' own interval
    cpu = report.headline(rows, samples, smoke=False)
    assert 1.09 < cpu.low <= cpu.high < 1.11
    assert report.process_offset_share(rows[0]) == 0.0
    assert report.process_offset_share(RowResult.from_json({"speedup": 2.0})) == 0.0


def test_a_row_timed_by_several_process_pairs_pools_their_samples(tmp_path: Path) -> None:
    # KPREMOTE_SIDE_PAIRS picks the pairs on any device (a cold GPU row gets timing.SIDE_PAIRS): every pair's
    # processes serve the row, each pair's medians are kept, the samples pooled, and the record names them all.
    task = copy_fixture(tmp_path)
    kernel = task / "solution" / "kernel.py"  # a candidate 20 ms slower a call: each pair reads it SLOWER
    kernel.write_text("import time\n" + kernel.read_text() + "    time.sleep(0.02)\n")
    run_dir = tmp_path / "runs" / "pairs"
    done = subprocess.run(runner_command(task, run_dir, "--workloads", "prod_r4_c64"),
                          env={**agent_env(), "KPREMOTE_SIDE_PAIRS": "2"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    row = rows_by_id(run_dir)["prod_r4_c64"]
    processes = row["processes"]
    assert {"baseline", "candidate", "baseline_2", "candidate_2"} <= set(processes)
    assert len({processes[k] for k in ("judge", "baseline", "candidate", "baseline_2", "candidate_2")}) == 5
    pairs = row["timing"]["process_pairs"]
    assert len(pairs) == 2 and row["checks"]["process_pairs"] == 2
    assert row["timing"]["baseline"]["n"] == sum(p["n"] for p in pairs) == 2 * SMOKE_SAMPLES
    assert all(p["candidate"] >= 20_000 for p in pairs), pairs  # a sleep is never shorter: no quiet machine needed
    # the judge hands each pair's medians to the verdict: the record says how many pairs read the pooled change (a
    # smoke row says no word: its verdict is null). What the pooled samples call is read from the record's own
    # numbers, so a loaded machine that blurs the timings changes what is expected, never whether it holds.
    verdict = row["verdict"]
    pooled = stats.change_verdict(verdict["speedup"], verdict["low"], verdict["high"], noise=verdict["noise"])
    assert verdict["verdict"] is None and "held" not in verdict
    if pooled == stats.SAME:
        assert "pairs_pointing" not in verdict and "pairs_needed" not in verdict, verdict
    else:
        pointing = stats.pairs_pointing([(p["baseline"], p["candidate"]) for p in pairs], pooled)
        assert (verdict["pairs_pointing"], verdict["pairs_needed"]) == (pointing, 2), verdict


GATED_PROBE = """
import json, os, sys, time
from pathlib import Path
from kpremote.agent.procfs import descendants
from kpremote.agent.run import worker

run_dir, job, out, seen_path = sys.argv[1:5]


def stand_in_probe(device):
    # what the probe sees while it runs: the two build processes, torch imported, and no task code run yet
    deadline, loaded = time.monotonic() + 120, []
    while time.monotonic() < deadline and len(loaded) < 2:
        builds = [p for p in descendants(os.getpid()) if b"build-side" in Path(f"/proc/{p}/cmdline").read_bytes()]
        loaded = [p for p in builds if "libtorch" in Path(f"/proc/{p}/maps").read_text()]
        time.sleep(0.05)
    time.sleep(2)  # a build past the gate would import its side's code by now
    Path(seen_path).write_text(json.dumps({"loaded": len(loaded),
                                           "imported": sorted(p.name for p in Path(run_dir).rglob("imported-*"))}))
    return {"name": "stand-in probe"}


worker.probe_device = stand_in_probe
sys.exit(worker.main(["prepare", "--job", job, "--out", out]))
"""

MARK_IMPORT = """
import os as _os, pathlib as _pathlib
_scratch = _pathlib.Path(_os.environ.get("KPREMOTE_SCRATCH", ""))
if _scratch.name.startswith("build-"):
    (_scratch / ("imported-" + _scratch.name)).write_text("")
"""


def test_a_gpu_runs_builds_import_torch_during_the_probe_and_no_task_code_before_it_ends(tmp_path: Path) -> None:
    """On a GPU the prepare step starts both build processes before its device probe: they import torch while it
    runs and wait at a gate; no side's code is imported until the probe is done (a stand-in probe here, on the CPU,
    looks). Then both builds run as before."""
    run_dir, job, out = prepare_job(tmp_path, "cuda", MARK_IMPORT)
    seen = tmp_path / "seen.json"
    done = subprocess.run([sys.executable, "-c", GATED_PROBE, str(run_dir), str(job), str(out), str(seen)],
                          env=agent_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(seen.read_text()) == {"loaded": 2, "imported": []}
    result = json.loads(out.read_text())
    assert result["device"] == {"name": "stand-in probe"}
    assert all(side["ok"] for side in result["build"]["sides"].values()), result["build"]
    assert sorted(p.name for p in run_dir.rglob("imported-*")) == ["imported-build-baseline", "imported-build-candidate"]


def test_a_candidate_that_prints_without_end_has_its_row_log_cut_and_results_md_says_so(tmp_path: Path) -> None:
    from kpremote.agent.harness.rowlog import LOG_CAP_BYTES

    task = copy_fixture(tmp_path)
    kernel = task / "solution" / "kernel.py"
    kernel.write_text(kernel.read_text().replace(
        "def rmsnorm(x, weight, out, eps):\n",
        "def rmsnorm(x, weight, out, eps):\n    import sys\n    sys.stdout.write('x' * (3 << 20))\n"
        "    sys.stderr.write('y' * (3 << 20))\n"))
    run_dir = tmp_path / "run"
    done = run_agent(task, run_dir, "--workloads", "grid_r1_c33")
    assert done.returncode == 0, done.stderr[-2000:]
    log = run_dir / "raw" / "workloads" / "grid_r1_c33.log"
    assert log.stat().st_size < LOG_CAP_BYTES + 1000  # not the tens of MB the calls printed
    last = log.read_text(errors="replace").splitlines()[-1]
    assert last.startswith("[kpremote: at least ") and "bytes of this row's output were dropped" in last, last
    [row] = results_of(run_dir)["rows"]
    assert row["status"] == "PASSED" and row["log_dropped_bytes"] > LOG_CAP_BYTES
    md = (run_dir / "summary" / "results.md").read_text()
    assert "`grid_r1_c33`: its output was cut: raw/workloads/grid_r1_c33.log keeps the first" in md
