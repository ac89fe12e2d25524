"""kpremote/agent/ncu/audit.py: rows re-measured under (the stand-in) ncu in processes of their own, then judged.

On this GPU-less host the audited calls run on the CPU through Triton's interpreter under tests/fixtures/ncu/ncu,
which replays the launches of a raw CSV written here ($KPREMOTE_FAKE_NCU_RAW): so what ncu "measured" is chosen
by each test, and agreement and disagreement are both exercised through the real processes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kpremote.agent.results import RowResult

from kpremote.agent.ncu import audit

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "fixtures" / "ncu" / "ncu"
TINY = REPO / "tests" / "fixtures" / "tasks" / "tiny_rmsnorm"
SAMPLE = (REPO / "tests" / "fixtures" / "ncu" / "raw.csv").read_text()


def raw_csv(path: Path, durations_ns: list[float]) -> Path:
    """raw.csv's header and units with one launch per duration (the other columns copied from its first row)."""
    header, units, first, *_ = list(csv.reader(io.StringIO(SAMPLE)))
    column = header.index("gpu__time_duration.sum")
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerows([header, units])
    for number, duration in enumerate(durations_ns):
        row = list(first)
        row[0], row[4], row[column] = str(number), f"_kernel_{number % 2}", f"{duration:,.0f}"
        writer.writerow(row)
    path.write_text(out.getvalue())
    return path


@pytest.fixture(autouse=True)
def _stand_in_settings() -> Iterator[None]:
    """cpu_env may set the stand-in's variables in this process: none survives a test."""
    before = {name: os.environ.pop(name, None) for name in ("KPREMOTE_FAKE_NCU_RAW", "KPREMOTE_FAKE_NCU_MODE")}
    yield
    for name, value in before.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


@pytest.fixture
def task(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny_rmsnorm"
    shutil.copytree(TINY, folder)
    return folder


def cpu_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The worker environment audit_rows gets; the stand-in's own settings also go to this process's environment,
    since `ncu --import` runs from here."""
    for name in ("KPREMOTE_FAKE_NCU_RAW", "KPREMOTE_FAKE_NCU_MODE"):
        if name in extra:
            os.environ[name] = extra[name]
    return {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
            "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), audit.ncu.NCU_ENV: str(STAND_IN), **extra}


def test_tolerance_by_kernel_length() -> None:
    assert audit.tolerance_us(10.0) == (pytest.approx(3.3), "2.5 µs + 8% below 20 µs")
    assert audit.tolerance_us(19.9)[0] == pytest.approx(2.5 + 0.08 * 19.9)
    assert audit.tolerance_us(20.0) == (pytest.approx(3.5), "2.5 µs + 5% from 20 µs")
    assert audit.tolerance_us(400.0)[0] == pytest.approx(22.5)


def test_per_call_is_the_median_over_equal_groups_and_says_when_it_cannot_be() -> None:
    # 3 calls of 2 kernels: sums 12, 30 (an outlier), 12 -> median 12
    assert audit.per_call_us([8.0, 4.0, 20.0, 10.0, 8.0, 4.0], 3) == \
        (12.0, 2.0, "median over 3 calls of 2 kernel(s) each")
    mean, per_call, note = audit.per_call_us([8.0, 4.0, 8.0, 4.0, 8.0, 4.0, 6.0], 3)
    assert mean == pytest.approx(14.0) and per_call == pytest.approx(7 / 3) and "not a whole number" in note
    assert audit.per_call_us([], 3) == (0.0, 0.0, "ncu saw no kernel launched by the audited calls")


def test_agreement_and_disagreement_through_the_stand_in_ncu(task: Path, tmp_path: Path) -> None:
    # per call: an 8 us kernel and a 4 us one -> ncu 12 us per call (tolerance 2.5 + 0.96 us)
    measured = raw_csv(tmp_path / "launches.csv", [8000, 4000] * 3)
    rows = [audit.AuditRow("prod_r4_c64", harness_us=12.5), audit.AuditRow("prod_r3_c100", harness_us=6.0)]
    side_modules = ("kp_candidate", "kp_baseline")
    for name in [n for n in sys.modules if n.startswith(side_modules)]:  # an earlier test in this worker's process
        del sys.modules[name]
    report = audit.audit_rows(task, tmp_path / "run", "candidate", rows,
                              cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured)), device="cpu", calls=3,
                              warmup=1)
    assert report.status == "audited" and report.ncu == str(STAND_IN)
    honest, forged = report.rows
    assert (honest.workload, honest.ncu_us, honest.agree) == ("prod_r4_c64", 12.0, True)
    assert honest.tolerance == pytest.approx(3.46) and honest.kernels_per_call == 2
    assert (forged.ncu_us, forged.harness_us, forged.agree) == (12.0, 6.0, False)
    assert forged.note.startswith("DISAGREE: ncu 12.00 µs, harness 6.00 µs, allowed ±3.46 µs "
                                  "(2.5 µs + 8% below 20 µs)")
    assert [r.workload for r in report.disagreements] == ["prod_r3_c100"]
    assert set(forged.to_json()) >= {"ncu_us", "harness_us", "agree", "tolerance", "note"}
    # one process per row, under ncu with the audit's flags, reports kept on the host
    for row in rows:
        log = (tmp_path / "run" / "raw" / "audit" / f"candidate-{row.workload}.log").read_text()
        assert "==PROF== Connected to process" in log
        assert (tmp_path / "run" / "raw" / "audit" / f"candidate-{row.workload}.ncu-rep").is_file()
    # the audited side never ran in this process
    assert not [name for name in sys.modules if name.startswith(side_modules)]


def test_the_audited_process_imports_only_its_side_and_its_stdout_is_never_read(task: Path, tmp_path: Path) -> None:
    (task / "baseline" / "kernel.py").write_text("raise RuntimeError('the baseline must not be imported here')\n")
    candidate = task / "solution" / "kernel.py"
    forged_row = '"0","1","python3","h","_kernel_0","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0"'
    candidate.write_text(candidate.read_text() + (
        "\nimport sys as _sys\n"
        f"print({SAMPLE.splitlines()[0]!r}, flush=True)\n"  # a fake CSV header and a 1 ns launch on stdout
        f"print({forged_row!r} + ',\"1\"' * 30, flush=True)\n"))
    measured = raw_csv(tmp_path / "launches.csv", [30000] * 2)
    report = audit.audit_rows(task, tmp_path / "run", "candidate", [audit.AuditRow("prod_r4_c64", harness_us=31.0)],
                              cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured)), device="cpu", calls=2,
                              warmup=0)
    [row] = report.rows
    assert (row.ncu_us, row.agree, row.tolerance) == (30.0, True, pytest.approx(4.0))


def test_no_ncu_labels_the_side_unaudited(task: Path, tmp_path: Path) -> None:
    env = cpu_env(tmp_path, **{audit.ncu.NCU_ENV: str(tmp_path / "no-such-ncu")})
    report = audit.audit_rows(task, tmp_path / "run", "baseline", [audit.AuditRow("prod_r4_c64", 5.0)], env,
                              device="cpu")
    assert report.status == "unaudited: ncu not found"
    assert [(r.agree, r.ncu_us, r.note) for r in report.rows] == [(None, None, "not audited: ncu not found")]
    assert not (tmp_path / "run").exists()  # nothing was started


def test_no_counter_permission_leaves_every_row_unaudited_with_the_fix(task: Path, tmp_path: Path) -> None:
    rows = [audit.AuditRow("prod_r4_c64", 5.0), audit.AuditRow("prod_r3_c100", 5.0)]
    report = audit.audit_rows(task, tmp_path / "run", "candidate", rows,
                              cpu_env(tmp_path, KPREMOTE_FAKE_NCU_MODE="no-permission"), device="cpu", calls=1,
                              warmup=0)
    assert report.status.startswith("unaudited: no permission to GPU performance counters")
    assert all(r.agree is None and "NVreg_RestrictProfilingToAdminUsers=0" in r.note for r in report.rows)
    # the second row was not even tried: the first showed the whole side cannot be audited
    assert not (tmp_path / "run" / "raw" / "audit" / "candidate-prod_r3_c100.log").exists()


def test_a_row_whose_calls_fail_is_unaudited_and_the_others_still_judged(task: Path, tmp_path: Path) -> None:
    candidate = task / "solution" / "kernel.py"
    candidate.write_text(candidate.read_text() + (
        "\n_honest = rmsnorm\n\ndef rmsnorm(x, weight, out, eps):\n"
        "    if x.shape[1] == 100:\n        raise RuntimeError('refuses this row')\n"
        "    _honest(x, weight, out, eps)\n"))
    measured = raw_csv(tmp_path / "launches.csv", [5000])
    rows = [audit.AuditRow("prod_r3_c100", 5.0), audit.AuditRow("prod_r4_c64", 5.2)]
    report = audit.audit_rows(task, tmp_path / "run", "candidate", rows,
                              cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured)), device="cpu", calls=1,
                              warmup=0)
    failed, judged = report.rows
    assert failed.agree is None and "did not finish its calls" in failed.note and "refuses this row" in failed.note
    assert judged.agree is True and judged.ncu_us == 5.0
    assert report.status.startswith("partly audited: 1 of 2 rows (the profiled process did not finish its calls")


def CALLS_ONCE(tmp_path: Path) -> dict[str, str]:  # noqa: N802 - reads as the setting it is
    """The stand-in runs each side's audited calls once per test: the cases below differ only in the harness's
    medians, which the audited process never sees (its first run, real, proves the path)."""
    return {"KPREMOTE_FAKE_NCU_CALLS_ONCE": str(tmp_path / "calls-once")}


def medians_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on in one test the audit's cases are neither made nor checked (auditcases.py, a torch process each,
    three per audit_row): under CALLS_ONCE the audited process never runs again, so the cases made would go unused
    and the check would judge the first run's results, which a case that differs only in the harness's medians never
    asserts. ncu (the stand-in) and the verdict still run for real; the test's first calls made and checked theirs."""
    def no_cases(command: str, request: dict, *_args) -> dict:
        return {} if command == "make" else {
            side: {"ok": None, "status": None, "message": "not checked: medians only"} for side in request["results"]}

    monkeypatch.setattr(audit, "run_cases", no_cases)


def test_the_runner_hook_audits_both_sides_and_names_the_one_that_disagrees(task: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    measured = raw_csv(tmp_path / "launches.csv", [12000] * audit.AUDIT_CALLS)  # one kernel per call
    request = {"task_dir": str(task), "run_dir": str(tmp_path / "run"), "raw_dir": str(tmp_path / "run" / "audit"),
               "workload": "prod_r4_c64", "mode": "graph", "harness_us": {"baseline": 12.4, "candidate": 5.0},
               "env": cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured), **CALLS_ONCE(tmp_path)), "device": "cpu",
               "modules": {}}
    answer = audit.audit_row(request)
    assert (answer["agree"], answer["side"], answer["harness_us"], answer["ncu_us"]) == (False, "candidate", 5.0, 12.0)
    assert answer["sides"]["baseline"]["agree"] is True and answer["cache_control"] == "none"
    assert answer["status"] == {"baseline": "audited", "candidate": "audited"}
    # the honest sides' audited calls (this first time really made) match the expected output
    assert [answer["outputs"][side]["ok"] for side in ("baseline", "candidate")] == [True, True]
    report = json.loads((tmp_path / "run" / "audit" / "candidate-prod_r4_c64.ncu-rep").read_text())
    assert ("--cache-control", "none") in zip(report["argv"], report["argv"][1:])  # graph replays run warm
    honest = audit.audit_row({**request, "mode": "cold", "harness_us": {"baseline": 13.4, "candidate": 13.1}})
    assert (honest["agree"], honest["side"], honest["cache_control"]) == (True, "candidate", "call")  # flushed per call
    assert [honest["outputs"][side]["ok"] for side in ("baseline", "candidate")] == [True, True]
    medians_only(monkeypatch)
    # Cold rows are judged one-sided: a window far above its kernels (a neighbour's load on both sides) agrees ...
    loaded = audit.audit_row({**request, "mode": "cold", "harness_us": {"baseline": 17.5, "candidate": 17.2}})
    assert loaded["agree"] is True
    # ... one shorter than its kernels does not, however small the row (a forged or emptied window) ...
    short = audit.audit_row({**request, "mode": "cold", "harness_us": {"baseline": 13.4, "candidate": 11.6}})
    assert (short["agree"], short["side"]) == (False, "candidate")
    assert "shorter than the kernels in it" in short["note"] and short["tolerance"] == pytest.approx(0.44)
    close = audit.audit_row({**request, "mode": "cold", "harness_us": {"baseline": 13.4, "candidate": 12.3}})
    assert close["agree"] is False  # above its kernels, but by less than the event pair's own cost
    # ... and a baseline whose window holds far more beyond its kernels than the candidate's flatters the candidate.
    slowed = audit.audit_row({**request, "mode": "cold", "harness_us": {"baseline": 19.0, "candidate": 13.1}})
    assert (slowed["agree"], slowed["side"]) == (False, "baseline")
    assert "holds 5.90 µs more beyond its kernels than the candidate's" in slowed["note"]


def test_a_cold_floor_starts_from_this_runs_empty_window(task: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    measured = raw_csv(tmp_path / "launches.csv", [12000] * audit.AUDIT_CALLS)  # ncu: 12 us a call
    request = {"task_dir": str(task), "run_dir": str(tmp_path / "run"), "raw_dir": str(tmp_path / "run" / "audit"),
               "workload": "prod_r4_c64", "mode": "cold", "harness_us": {"baseline": 13.4, "candidate": 12.8},
               "env": cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured), **CALLS_ONCE(tmp_path)), "device": "cpu",
               "modules": {}}
    # Without an empty window the fixed floor (12 + 0.5 - 0.06 = 12.44 us) lets a window of 12.8 us through ...
    fixed = audit.audit_row(request)
    assert fixed["agree"] is True and "fixed: no empty window" in fixed["tolerance_rule"]
    medians_only(monkeypatch)
    # ... with this run's empty window of 1.7 us the floor is 12 + 1.7 - 0.7 - 0.12 = 12.88 us: it holds less than
    # its kernel and what an empty call costs, so work left its window
    derived = audit.audit_row({**request, "empty_window_us": 1.7})
    assert (derived["agree"], derived["side"]) == (False, "candidate")
    assert derived["tolerance"] == pytest.approx(0.88) and "empty window (1.70 µs)" in derived["tolerance_rule"]
    assert "at least 12.88 µs" in derived["note"]
    honest = audit.audit_row({**request, "empty_window_us": 1.7, "harness_us": {"baseline": 13.4, "candidate": 13.0}})
    assert honest["agree"] is True
    # a forge of more than (13.0 - 12.88) / 13.0 = 0.9 % of this window would fall under the floor
    assert honest["forge_blind_spot_pct"] == 0.9 and audit.unverified_share(honest) is None
    far = audit.audit_row({**request, "empty_window_us": 1.7, "harness_us": {"baseline": 16.0, "candidate": 15.0}})
    assert far["forge_blind_spot_pct"] == pytest.approx(14.1)
    assert audit.unverified_share(far) == far["forge_blind_spot_pct"]
    assert derived["forge_blind_spot_pct"] is None  # a window under the floor is INVALID, not unverified
    # a GPU whose empty call costs less has a lower floor: 12 + 1.2 - 0.7 - 0.12 = 12.38 us
    cheaper = audit.audit_row({**request, "empty_window_us": 1.2})
    assert cheaper["agree"] is True and cheaper["tolerance"] == pytest.approx(0.38)


def test_a_side_is_named_or_refused(task: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="side 'both': allowed: baseline, candidate"):
        audit.audit_rows(task, tmp_path / "run", "both", [], cpu_env(tmp_path))


def test_the_audit_is_given_the_least_empty_window_the_probe_read() -> None:
    """A host stalled between an empty pair's two records lengthens that window: the floor must not rise with it."""
    from types import SimpleNamespace

    from kpremote.agent.run.runner import Runner

    def given(probe):
        return Runner._empty_window_us(SimpleNamespace(ctx=SimpleNamespace(prepared={"device": probe})))

    # one H200 run's probe: median 1.92 us, p10 1.44, p90 2.85; the least read is what an empty call costs
    assert given({"empty_window": {"min_us": 1.248, "median_us": 1.92, "p10_us": 1.44, "p90_us": 2.848}}) == 1.248
    assert given({"empty_window": {"median_us": 1.92}}) is None  # no minimum recorded: the fixed floor, said so
    assert given({}) is None and given(None) is None


# A candidate that recognises the audit by its parent (ncu) and then does only half of the work.
HALF_THE_WORK_UNDER_NCU = """
import os as _os
import sys as _sys

_honest = rmsnorm


def rmsnorm(x, weight, out, eps):
    _honest(x, weight, out, eps)
    with open(f"/proc/{_os.getppid()}/cmdline", "rb") as parent:
        measured = b"ncu" in parent.read()
    if measured:  # under the profiler: the first half of the rows only
        out[out.shape[0] // 2:].zero_()
    print("seen:", repr(_sys.argv), _os.getcwd(), sorted(k for k in _os.environ if k.startswith("KPREMOTE_")),
          file=_sys.stderr, flush=True)
"""


def test_a_candidate_that_does_less_work_under_ncu_is_caught_by_its_outputs(task: Path, tmp_path: Path) -> None:
    candidate = task / "solution" / "kernel.py"
    candidate.write_text(candidate.read_text() + HALF_THE_WORK_UNDER_NCU)
    measured = raw_csv(tmp_path / "launches.csv", [12000] * audit.AUDIT_CALLS)
    run = tmp_path / "run"
    answer = audit.audit_row({"task_dir": str(task), "run_dir": str(run), "workload": "prod_r4_c64", "mode": "cold",
                              "harness_us": {"baseline": 13.4, "candidate": 13.1}, "device": "cpu", "modules": {},
                              "env": cpu_env(tmp_path, KPREMOTE_FAKE_NCU_RAW=str(measured))})
    assert answer["agree"] is True  # the times agree: only what the calls wrote tells
    assert answer["outputs"]["baseline"] == {"ok": True, "status": "PASSED",
                                             "message": "the baseline's 5 audited calls match the expected output"}
    found = answer["outputs"]["candidate"]
    assert found["ok"] is False and found["status"] == "INCORRECT"
    assert found["message"].startswith("the candidate's audited calls do not match the expected output: candidate "
                                       "output 'out' is wrong: first mismatch at [2, 0]")
    # started as a timed side is, its job on standard input: nothing in its command line or folder says "audit"
    log = (run / "raw" / "audit" / "candidate-prod_r4_c64.log").read_text()
    seen = next(line for line in log.splitlines() if line.startswith("seen:")).replace(str(REPO), "<repo>")
    assert "'--fd', '0', '--side', 'candidate', '--run-dir', " in seen and "audit" not in seen
    assert "KPREMOTE_SCRATCH" in seen
    # the row's cases and results leave the scratch folders with it
    assert not [p.name for side in ("baseline", "candidate") for p in (run / "raw" / "scratch" / side).glob("*.pt")]


def test_the_audited_results_are_judged_by_the_harness_rule(task: Path, tmp_path: Path) -> None:
    """auditcases.check in this process, on results written here: the reference decides, a wrong baseline voids."""
    import torch

    from kpremote.agent.ncu import auditcases

    secret, count = bytes(range(32)), 3
    request = {"task_dir": str(task), "workload": "prod_r3_c100", "device": "cpu", "secret": secret.hex(),
               "count": count}
    auditcases.make({**request, "inputs": {"candidate": str(tmp_path / "cases.pt")}})
    made = torch.load(tmp_path / "cases.pt", weights_only=True)["cases"]
    assert len(made) == count and not torch.equal(made[1]["inputs"]["x"], made[2]["inputs"]["x"])  # a case a call

    def results(side: str, spoil: int | None = None) -> str:
        out = []
        for k, case in enumerate(made[1:], start=1):
            x, w = case["inputs"]["x"].double(), case["inputs"]["weight"].double()
            value = (x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w).float()
            out.append({"out": value * 0 if k == spoil else value})
        torch.save(out, tmp_path / f"{side}.pt")
        return str(tmp_path / f"{side}.pt")

    def check(**given: str) -> dict:
        return auditcases.check({**request, "results": given})

    honest = check(baseline=results("baseline"), candidate=results("candidate"))
    assert [honest[s]["ok"] for s in ("baseline", "candidate")] == [True, True]
    spoiled = check(baseline=results("baseline"), candidate=results("candidate", spoil=2))
    assert spoiled["candidate"]["ok"] is False and "(audited call 2 (seed " in spoiled["candidate"]["message"]
    wrong_baseline = check(baseline=results("baseline", spoil=1), candidate=results("candidate"))
    assert (wrong_baseline["baseline"]["ok"], wrong_baseline["baseline"]["status"]) == (False, "ERROR")
    assert "baseline output 'out' disagrees with the reference" in wrong_baseline["baseline"]["message"]
    assert wrong_baseline["candidate"] == {"ok": None, "status": None,
                                           "message": "not checked: the baseline's audited calls are wrong"}
    (tmp_path / "garbage.pt").write_bytes(b"not a pickle")
    unreadable = check(baseline=results("baseline"), candidate=str(tmp_path / "garbage.pt"))
    assert unreadable["candidate"]["ok"] is None and "cannot be read" in unreadable["candidate"]["message"]
    torch.save([{"other": torch.zeros(1)}] * (count - 1), tmp_path / "renamed.pt")
    renamed = check(baseline=results("baseline"), candidate=str(tmp_path / "renamed.pt"))
    assert renamed["candidate"]["ok"] is False and "output 'out' is missing" in renamed["candidate"]["message"]
    # the cases made again must be those the audited processes got (the baseline's copy): else nothing is judged
    given = {"baseline": results("baseline"), "candidate": results("candidate", spoil=2)}
    same = auditcases.check({**request, "results": given, "inputs": {"baseline": str(tmp_path / "cases.pt")}})
    assert same["candidate"]["ok"] is False
    auditcases.make({**request, "secret": bytes(32).hex(), "inputs": {"baseline": str(tmp_path / "other.pt")}})
    other = auditcases.check({**request, "results": given, "inputs": {"baseline": str(tmp_path / "other.pt")}})
    assert {side: verdict["ok"] for side, verdict in other.items()} == {"baseline": None, "candidate": None}
    assert "make_case gave other inputs for the same seed" in other["candidate"]["message"]


def test_the_runner_makes_a_row_whose_audited_calls_computed_something_else_incorrect() -> None:
    from kpremote.agent.run.auditstep import _judge_audited_outputs

    def row(**outputs: dict) -> dict:
        judged = RowResult.from_json({"status": "PASSED", "speedup": 1.3, "invalid": None,
                                      "audit": {"agree": True, "outputs": outputs}})
        _judge_audited_outputs(judged)
        return judged.to_json()

    ok = {"ok": True, "message": "match"}
    assert row(baseline=ok, candidate=ok)["status"] == "PASSED"
    wrong = row(baseline=ok, candidate={"ok": False, "message": "the candidate's audited calls do not match ..."})
    assert (wrong["status"], wrong["speedup"]) == ("INCORRECT", None)
    assert wrong["message"] == "audit: the candidate's audited calls do not match ..."
    voided = row(baseline={"ok": False, "message": "the baseline's audited calls do not match ..."},
                 candidate={"ok": None, "message": "not checked"})
    assert voided["status"] == "PASSED" and voided["invalid"] == "audit: the baseline's audited calls do not match ..."
    assert row(baseline=ok, candidate={"ok": None, "message": "not checked: ..."})["status"] == "PASSED"


def test_the_blind_spot_is_how_much_of_the_window_a_forge_could_take_and_still_pass_the_floor() -> None:
    # a 4 us window over a 2.4 us kernel with a floor of 0.5 us above it: a forge could take (4 - 2.9) / 4 = 27.5 %
    assert audit.forge_blind_spot_pct(4.0, 2.4, 0.5) == pytest.approx(27.5)
    assert audit.forge_blind_spot_pct(62.0, 61.5, 0.3) == pytest.approx(0.2 / 62 * 100)
    assert audit.forge_blind_spot_pct(2.5, 2.4, 0.5) == 0.0  # under the floor: none (that row disagrees)
    assert audit.unverified_share({"forge_blind_spot_pct": 5.0}) is None  # 5 % exactly is within the audit's reach
    assert audit.unverified_share({"forge_blind_spot_pct": 5.1}) == 5.1
    assert audit.unverified_share({"forge_blind_spot_pct": None}) is None and audit.unverified_share(None) is None


def test_the_runner_puts_a_large_blind_spot_on_the_rows_verdict() -> None:
    from kpremote.agent.run.auditstep import _mark_unverified

    row = RowResult.from_json({"status": "PASSED", "verdict": {"verdict": "FASTER"},
                                "audit": {"forge_blind_spot_pct": 12.4}})
    _mark_unverified(row, audit.unverified_share(row.audit))
    assert row.to_json()["verdict"] == {"verdict": "FASTER", "forge_blind_spot_pct": 12.4}  # set, so written
    assert row.verdict_word == "FASTER (unverified)"
    small = RowResult.from_json({"status": "PASSED", "verdict": {"verdict": "FASTER"},
                                 "audit": {"forge_blind_spot_pct": 3.0}})
    _mark_unverified(small, audit.unverified_share(small.audit))
    assert small.to_json()["verdict"] == {"verdict": "FASTER"}
