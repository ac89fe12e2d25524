"""`inv compare` and `inv history` on fetched results: row by row changes with their intervals and verdicts, run ids
as people type them, every run of a task in a table and a plot."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import jsonschema
import pytest

from kpremote.agent.results import RowResult
from kpremote.results.compare import compare_rows, verdict
from kpremote.results.ledger import append_line, record_run
from localproject import kp
from rig import REPO

TASK = "t"


def compared(base: dict, new: dict) -> dict:
    """compare_rows on two rows as results.json holds them."""
    return compare_rows(RowResult.from_json(base), RowResult.from_json(new))


def side(median: float, rse: float = 0.002) -> dict:
    return {"n": 100, "median": median, "p10": median * 0.98, "p90": median * 1.02, "rse": rse}


def row(workload: str, baseline_us: float, candidate_us: float, rse: float = 0.002) -> dict:
    return {"workload": workload, "status": "PASSED", "production": True, "speedup": baseline_us / candidate_us,
            "timing": {"baseline": side(baseline_us, rse), "candidate": side(candidate_us, rse)}}


def write_run(project: Path, host: str, run_id: str, started: str, rows: list[dict], commit: str,
              geomean: float, smoke: bool = False, status: str = "passed", candidate: str | None = None,
              command: str | None = "inv fetch-results --host box --task t", task_digest: str | None = None,
              headline: dict | None = None) -> None:
    """A run as inv fetch-results leaves it: its results.json, and (unless command is None) its signed ledger line."""
    folder = project / "kernels" / TASK / "results" / host / run_id
    folder.mkdir(parents=True)
    source = {"git_commit": commit, "git_dirty": False, "solution_sha256": candidate}
    results = {"schema": "kpremote.results/1", "status": status, "exit_code": 0, "smoke": smoke,
               "provenance": {"run_id": run_id, "started": started, "source": source,
                              **({"task_pin": {"digest": task_digest, "pin": "p" * 64, "changed": [],
                                               "state": "pinned" if task_digest == "p" * 64 else "edited"}}
                                 if task_digest else {})},
               "rows": rows, "headline": {"geomean": geomean, "low": geomean * 0.99, "high": geomean * 1.01, "n": 3,
                                          "of": 3, "level": 0.95, **(headline or {})} if geomean else {}}
    (folder / "results.json").write_text(json.dumps(results))
    if command is not None:
        record_run(project / "kernels" / TASK, folder, host, 0, command.split())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare")
    (root / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (root / "kernels" / TASK).mkdir(parents=True)
    (root / "kernels" / TASK / "task.toml").write_text("")
    write_run(root, "box", "20261120-100000-aaaaaa", "2026-11-20T10:00:00Z",
              [row("rows_a", 100, 100), row("rows_b", 100, 100), row("rows_c", 100, 100)], "1" * 40, 1.0,
              candidate="a" * 64)
    write_run(root, "box", "20261121-100000-bbbbbb", "2026-11-21T10:00:00Z",
              [row("rows_a", 100, 80), row("rows_b", 100, 100.1), row("rows_c", 100, 120), row("rows_new", 50, 40)],
              "2" * 40, 1.05, candidate="b" * 64, command="inv run --host box --task t")
    write_run(root, "box", "20261122-100000-cccccc", "2026-11-22T10:00:00Z",  # the same candidate, run again
              [row("rows_a", 100, 79.5), row("rows_b", 100, 99), row("rows_c", 100, 119)], "3" * 40, 1.06,
              candidate="b" * 64)
    return root


def test_verdicts_need_the_whole_interval_beyond_one():
    assert verdict(1.2, 1.1, 1.3) == "FASTER" and verdict(0.8, 0.7, 0.9) == "SLOWER"
    assert verdict(1.2, 0.95, 1.4) == "SAME"          # the interval holds 1: no claim
    assert verdict(1.005, 1.001, 1.009) == "SAME"     # a tight interval, but under 1 %: drift, not a win
    same = compared(row("w", 100, 100), row("w", 100, 100))
    assert same["change"] == pytest.approx(1.0) and same["low"] < 1 < same["high"] and same["verdict"] == "SAME"
    noisy = compared(row("w", 100, 100, rse=0.2), row("w", 100, 80, rse=0.2))
    assert noisy["change"] == pytest.approx(1.25) and noisy["verdict"] == "SAME"  # 25 % inside a wide noise band


def test_compare_latest_with_the_run_before(project):
    result = kp(project, "compare", "--task", TASK, "--json", program="kpremote")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/compare.json").read_text())).validate(document)
    assert document["base"]["run_id"].endswith("bbbbbb") and document["new"]["run_id"].endswith("cccccc")
    rows = {r["workload"]: r for r in document["rows"]}
    assert rows["rows_a"]["verdict"] == "SAME"  # 80 -> 79.5 µs: 0.6 %, under the 1 % a claim needs
    assert rows["rows_new"]["note"] == "only in the base run" and rows["rows_new"]["verdict"] is None
    assert document["headline"]["change"] == pytest.approx(1.06 / 1.05)
    assert document["same_candidate"] is True and document["new"]["candidate_sha256"] == "b" * 64
    text = kp(project, "compare", "--task", TASK, columns=100, program="kpremote").stdout
    assert "the same candidate in both runs (sha256 bbbbbbbbbbbb)" in text  # an agent re-running for a FASTER sees why not


def test_compare_two_runs_by_short_ids_row_by_row(project):
    result = kp(project, "compare", "--task", TASK, "--base", "aaaaaa", "--new", "20261121", "--json",
                program="kpremote")
    assert result.returncode == 0, result.stderr
    rows = {r["workload"]: r for r in json.loads(result.stdout)["rows"]}
    assert rows["rows_a"]["verdict"] == "FASTER" and rows["rows_a"]["change"] == pytest.approx(1.25)
    assert rows["rows_b"]["verdict"] == "SAME"
    assert rows["rows_c"]["verdict"] == "SLOWER" and rows["rows_c"]["high"] < 1
    assert rows["rows_a"]["base"]["candidate_median_us"] == 100 and rows["rows_a"]["new"]["candidate_median_us"] == 80
    assert rows["rows_new"]["note"] == "only in the new run"
    assert json.loads(result.stdout)["same_candidate"] is False
    # the ledger says what brought each run
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/compare.json").read_text())).validate(document)
    assert (document["base"]["command"], document["new"]["command"]) == ("inv fetch-results --host box --task t",
                                                                         "inv run --host box --task t")


@pytest.mark.parametrize("columns", [80, 100, 140])
def test_compare_table_keeps_ids_whole_and_shows_verdicts(project, columns):
    result = kp(project, "compare", "--task", TASK, "--base", "aaaaaa", "--new", "bbbbbb", columns=columns,
                program="kpremote")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= columns for line in lines)
    assert "20261120-100000-aaaaaa" in result.stdout and "20261121-100000-bbbbbb" in result.stdout
    verdicts = {line.split()[0]: line.split()[-1] for line in lines if re.match(r"rows_\w+ ", line)}
    assert verdicts == {"rows_a": "FASTER", "rows_b": "SAME", "rows_c": "SLOWER", "rows_new": "–"}
    assert any(line.startswith("headline: 1.000x → 1.050x") for line in lines)


def test_compare_last_n_shows_each_run(project):
    result = kp(project, "compare", "--task", TASK, "--last", "3", "--json", program="kpremote")
    document = json.loads(result.stdout)
    assert [s["run_id"][-6:] for s in document["series"]] == ["aaaaaa", "bbbbbb", "cccccc"]
    assert document["base"]["run_id"].endswith("aaaaaa") and document["new"]["run_id"].endswith("cccccc")
    text = kp(project, "compare", "--task", TASK, "--last", "3", columns=140, program="kpremote").stdout
    assert "20261122-100000-cccccc" in text


def test_bad_run_ids_are_one_line(project):
    unknown = kp(project, "compare", "--task", TASK, "--new", "0ff", program="kpremote")
    assert unknown.returncode == 2 and "no run '0ff' of t" in unknown.stderr and "Traceback" not in unknown.stderr
    several = kp(project, "compare", "--task", TASK, "--new", "2026112", program="kpremote")
    hostile = kp(project, "compare", "--task", TASK, "--new", "$(touch x)", program="kpremote")
    assert hostile.returncode == 2 and "bad run id" in hostile.stderr
    assert several.returncode == 2 and "names 3 runs" in several.stderr
    first = kp(project, "compare", "--task", TASK, "--new", "aaaaaa", program="kpremote")
    assert first.returncode == 2 and "is the first fetched run" in first.stderr


def test_history_table_and_plot(project):
    result = kp(project, "history", "--task", TASK, "--json", program="kpremote")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/history.json").read_text())).validate(document)
    assert [e["commit"][0] for e in document["runs"]] == ["1", "2", "3"]
    assert [e["candidate_sha256"][0] for e in document["runs"]] == ["a", "b", "b"]
    # the ledger's line for a run gives the command that brought it
    assert [e["command"] for e in document["runs"]] == ["inv fetch-results --host box --task t",
                                                        "inv run --host box --task t",
                                                        "inv fetch-results --host box --task t"]
    assert [e["record"] for e in document["runs"]] == [None, None, None]  # each one's record verifies
    plot = Path(document["plot"])
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 5000
    text = kp(project, "history", "--task", TASK, columns=80, program="kpremote").stdout
    narrow = kp(project, "history", "--task", TASK, columns=50, program="kpremote").stdout
    assert f"plot: {document['plot']}" in narrow.splitlines()  # a path to open: whole on its line at any width
    for run_id in ("20261120-100000-aaaaaa", "20261121-100000-bbbbbb", "20261122-100000-cccccc"):
        [line] = [line for line in text.splitlines() if run_id in line]
        assert "passed" in line
    assert "1111111111" in text and "1.060x" in text
    wide = kp(project, "history", "--task", TASK, columns=140, program="kpremote").stdout
    assert "aaaaaaaaaaaa" in wide and "bbbbbbbbbbbb" in wide  # each run's candidate, where there is room


def test_the_compared_runs_lines_are_whole_on_a_narrow_terminal(project):
    text = kp(project, "compare", "--task", TASK, columns=50, program="kpremote").stdout
    for label in ("base: ", "new : "):
        [line] = [line for line in text.splitlines() if line.startswith(label)]
        assert re.fullmatch(label + r"\d{8}-\d{6}-[0-9a-f]{6}  \S+  .*  passed", line), line  # not wrapped into two


def test_a_change_inside_both_runs_noise_is_same():
    # Two runs of a 4 us row: 1.00x then 1.10x, each with a tight interval, but each run's verdict noise is 18 %
    # (the GPU process floor over a 4 us median): a 10 % change between them says nothing.
    base, new = row("w", 4.0, 4.0, rse=0.0005), row("w", 4.4, 4.0, rse=0.0005)
    assert compared(base, new)["verdict"] == "FASTER"  # rows without a recorded noise: the 1 % floor
    base["verdict"], new["verdict"] = {"noise": 0.18}, {"noise": 0.18}
    entry = compared(base, new)
    assert entry["verdict"] == "SAME" and entry["threshold"] == pytest.approx(0.2546, abs=1e-3)
    assert compared(base, row("w", 6.0, 4.0, rse=0.0005) | {"verdict": {"noise": 0.18}})["verdict"] == "FASTER"


@pytest.fixture(scope="module")
def runs_without_results(tmp_path_factory) -> Path:
    """Five runs with results around a cancelled one (no row timed) and a failed one (its row never reached timing)."""
    root = tmp_path_factory.mktemp("without-results")
    (root / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (root / "kernels" / TASK).mkdir(parents=True)
    (root / "kernels" / TASK / "task.toml").write_text("")
    for day, tail in enumerate(("aaaaaa", "bbbbbb", "cccccc", "dddddd", "eeeeee"), start=10):
        write_run(root, "box", f"202611{day}-100000-{tail}", f"2026-11-{day}T10:00:00Z",
                  [row("rows_a", 100, 100 - day), row("rows_b", 100, 100)], str(day % 10) * 40, 1.0 + day / 100)
    write_run(root, "box", "20261116-100000-ffffff", "2026-11-16T10:00:00Z", [], "6" * 40, None, status="cancelled")
    write_run(root, "box", "20261117-100000-999999", "2026-11-17T10:00:00Z",
              [{"workload": "rows_a", "status": "INCORRECT", "speedup": None}], "7" * 40, None, status="failed")
    return root


def test_runs_without_results_are_skipped_and_said_so(runs_without_results):
    result = kp(runs_without_results, "compare", "--task", TASK, "--json", program="kpremote")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/compare.json").read_text())).validate(document)
    assert (document["base"]["run_id"][-6:], document["new"]["run_id"][-6:]) == ("dddddd", "eeeeee")
    assert [(s["run_id"][-6:], s["why"]) for s in document["skipped"]] == [
        ("ffffff", "cancelled, no row has a speedup"), ("999999", "failed, no row has a speedup")]
    text = kp(runs_without_results, "compare", "--task", TASK, columns=140, program="kpremote").stdout
    assert "skipped 20261116-100000-ffffff (box): nothing to compare: cancelled, no row has a speedup" in text
    named = kp(runs_without_results, "compare", "--task", TASK, "--new", "ffffff", program="kpremote")
    assert named.returncode == 2 and "has nothing to compare (cancelled, no row has a speedup)" in named.stderr


@pytest.mark.parametrize("columns", [80, 140])
def test_last_n_shows_the_same_runs_at_any_width(runs_without_results, columns):
    result = kp(runs_without_results, "compare", "--task", TASK, "--last", "5", columns=columns, program="kpremote")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= columns for line in lines)
    [header] = [line for line in lines if line.startswith("workload") and "aaaaaa" in line]
    assert header.split() == ["workload", "aaaaaa", "bbbbbb", "cccccc", "dddddd", "eeeeee"]
    for day, tail in enumerate(("aaaaaa", "bbbbbb", "cccccc", "dddddd", "eeeeee"), start=10):
        assert f"{tail}: 202611{day}-100000-{tail} (box)" in lines


@pytest.mark.parametrize("value", ["abc", "1", "2.5", ""])
def test_a_bad_last_is_one_line(project, value):
    result = kp(project, "compare", "--task", TASK, "--last", value, program="kpremote")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line == f"error: --last {value!r}: give a whole number from 2 to 1000"


EDITED = "20261123-100000-dddddd"  # fetched honestly, its results.json edited afterwards
PLANTED = "20261124-100000-eeeeee"  # a results.json nothing fetched, with a forged ledger line
HONEST = ("20261120-100000-aaaaaa", "20261121-100000-bbbbbb", "20261122-100000-cccccc")


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> Path:
    """Three honest runs, then the attacks of issue 43 on the client's records by a later process: a fetched
    results.json edited to claim a win, and a results.json planted beside them with a ledger line written by hand."""
    root = tmp_path_factory.mktemp("rewritten")
    (root / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (root / "kernels" / TASK).mkdir(parents=True)
    (root / "kernels" / TASK / "task.toml").write_text("")
    for day, run_id in enumerate(HONEST, start=20):
        write_run(root, "box", run_id, f"2026-11-{day}T10:00:00Z", [row("rows_a", 100, 100)], str(day % 10) * 40, 1.0)
    write_run(root, "box", EDITED, "2026-11-23T10:00:00Z", [row("rows_a", 100, 99)], "4" * 40, 1.01)
    edited = root / "kernels" / TASK / "results" / "box" / EDITED / "results.json"
    results = json.loads(edited.read_text())
    results["rows"], results["headline"]["geomean"] = [row("rows_a", 100, 40)], 2.5
    edited.write_text(json.dumps(results))
    write_run(root, "box", PLANTED, "2026-11-24T10:00:00Z", [row("rows_a", 100, 40)], "5" * 40, 2.5, command=None)
    planted = root / "kernels" / TASK / "results" / "box" / PLANTED / "results.json"
    with (root / "kernels" / TASK / "ledger.jsonl").open("a") as ledger:
        ledger.write(json.dumps({"schema": "kpremote.ledger/1", "kind": "run", "host": "box", "run_id": PLANTED,
                                 "summary_sha256": hashlib.sha256(planted.read_bytes()).hexdigest(),
                                 "mac": "0" * 64}) + "\n")
    return root


def test_history_shows_a_run_whose_record_does_not_verify_as_such_and_no_number_of_it(rewritten):
    """On main, the edited results.json's 2.500x was history's like any other."""
    result = kp(rewritten, "history", "--task", TASK, "--json", program="kpremote")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/history.json").read_text())).validate(document)
    records = {e["run_id"]: (e["record"], e["geomean"]) for e in document["runs"]}
    assert records == {**{run_id: (None, 1.0) for run_id in HONEST},
                       EDITED: ("record edited: results.json is not what was fetched", None),
                       PLANTED: ("no verified ledger line", None)}
    text = kp(rewritten, "history", "--task", TASK, columns=140, program="kpremote").stdout
    assert "2.500x" not in text and text.count("NOT VERIFIED") == 2
    assert f"{EDITED}: not verified: record edited: results.json is not what was fetched" in text
    assert f"{PLANTED}: not verified: no verified ledger line" in text


def test_compare_gives_no_verdict_on_a_run_whose_record_does_not_verify(rewritten):
    """On main, compare took the edited run as the newest and called rows_a FASTER (100 -> 40 us)."""
    result = kp(rewritten, "compare", "--task", TASK, "--json", program="kpremote")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/compare.json").read_text())).validate(document)
    assert (document["base"]["run_id"], document["new"]["run_id"]) == HONEST[1:]
    assert [(s["run_id"], s["record"]) for s in document["skipped"]] == [
        (EDITED, "record edited: results.json is not what was fetched"), (PLANTED, "no verified ledger line")]
    text = kp(rewritten, "compare", "--task", TASK, columns=140, program="kpremote").stdout
    assert f"skipped {EDITED} (box): not verified: record edited: results.json is not what was fetched" in text
    for named in (["--new", EDITED], ["--new", HONEST[2], "--base", PLANTED]):
        refused = kp(rewritten, "compare", "--task", TASK, *named, program="kpremote")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        [line] = refused.stderr.splitlines()
        assert "does not verify" in line and "no verdict on it" in line and named[-1] in line
    last = json.loads(kp(rewritten, "compare", "--task", TASK, "--last", "5", "--json", program="kpremote").stdout)
    assert [s["run_id"] for s in last["series"]] == list(HONEST)


def test_no_verdict_between_runs_of_different_tasks_and_the_usual_ones_within_one(tmp_path):
    """Issue 43: a run of an edited task (another task digest) is compared change by change but gets no verdict
    against the pinned task's runs, however clear its change; two runs of one task get theirs."""
    root = tmp_path / "proj"
    (root / "kernels" / TASK).mkdir(parents=True)
    (root / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (root / "kernels" / TASK / "task.toml").write_text("")
    pinned, edited = "p" * 64, "e" * 64
    write_run(root, "box", "20261120-100000-aaaaaa", "2026-11-20T10:00:00Z", [row("r", 100, 100)], "1" * 40, 1.0,
              task_digest=pinned)
    write_run(root, "box", "20261121-100000-bbbbbb", "2026-11-21T10:00:00Z", [row("r", 100, 50)], "1" * 40, 2.0,
              task_digest=pinned)
    write_run(root, "box", "20261122-100000-cccccc", "2026-11-22T10:00:00Z", [row("r", 100, 25)], "1" * 40, 4.0,
              task_digest=edited)

    def document(*args: str) -> dict:
        done = kp(root, "compare", "--task", TASK, "--json", *args, program="kpremote")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    same_task = document("--new", "bbbbbb", "--base", "aaaaaa")
    assert same_task["other_tasks"] is None and same_task["rows"][0]["verdict"] == "FASTER"
    assert same_task["headline"]["verdict"] == "FASTER"
    across = document("--new", "cccccc", "--base", "bbbbbb")
    assert across["rows"][0]["change"] == pytest.approx(2.0) and across["rows"][0]["verdict"] is None
    assert across["headline"]["verdict"] is None and "different tasks" in across["other_tasks"]
    assert (across["base"]["task_state"], across["new"]["task_state"]) == ("pinned", "edited")


def context_row(workload: str, baseline_us: float, candidate_us: float, in_context: tuple[float, float]) -> dict:
    """A row that names a context (harness 2.18): its cold timing, and its warm and context regimes."""
    cold = row(workload, baseline_us, candidate_us)
    regimes = {"name": "block", "headline": "cold"}
    for regime, (base, cand) in (("warm", (baseline_us, candidate_us)), ("context", in_context)):
        regimes[regime] = {"timing": {"mode": regime, "baseline": side(base), "candidate": side(cand)},
                           "speedup": base / cand, "verdict": {"speedup": base / cand, "verdict": "SAME"}}
    return {**cold, "regimes": regimes}


def test_compare_and_history_carry_the_rows_regimes(tmp_path):
    """Issue 45: a row with a context is compared in each of its regimes too, by the same rule; history shows the
    headline in the context regime beside the headline."""
    root = tmp_path / "proj"
    (root / "kernels" / TASK).mkdir(parents=True)
    (root / "hosts.toml").write_text('[hosts.box]\ntransport = "local"\n')
    (root / "kernels" / TASK / "task.toml").write_text("")
    for run_id, day, in_context, geomean in (("20261120-100000-aaaaaa", "20", (40.0, 40.0), 1.0),
                                             ("20261121-100000-bbbbbb", "21", (40.0, 32.0), 1.25)):
        write_run(root, "box", run_id, f"2026-11-{day}T10:00:00Z", [context_row("q", 100, 80, in_context)], "1" * 40,
                  1.25, headline={"regime": "cold", "regimes": {"context": {
                      "geomean": geomean, "low": geomean * 0.99, "high": geomean * 1.01, "n": 1, "of": 1}}})
    done = kp(root, "compare", "--task", TASK, "--json", "--base", "aaaaaa", "--new", "bbbbbb", program="kpremote")
    assert done.returncode == 0, done.stderr
    compared_runs = json.loads(done.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/compare.json").read_text())).validate(compared_runs)
    [entry] = compared_runs["rows"]
    assert entry["verdict"] == "SAME" and entry["regimes"]["context"]["verdict"] == "FASTER"  # alone: no change
    assert entry["regimes"]["context"]["change"] == pytest.approx(1.25) and entry["regimes"]["warm"]["verdict"] == "SAME"
    assert compared_runs["headline"]["regimes"]["context"]["change"] == pytest.approx(1.25)
    text = kp(root, "compare", "--task", TASK, "--base", "aaaaaa", "--new", "bbbbbb", columns=140,
              program="kpremote").stdout
    [line] = [line for line in text.splitlines() if line.startswith("q ")]
    assert line.rstrip().endswith("FASTER") and "+25.0 %" in line, text
    assert "headline in the context regime: 1.000x → 1.250x" in text
    history = kp(root, "history", "--task", TASK, "--json", program="kpremote")
    document = json.loads(history.stdout)
    jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas/history.json").read_text())).validate(document)
    assert [e["regimes"]["context"]["geomean"] for e in document["runs"]] == [1.0, 1.25]
    shown = kp(root, "history", "--task", TASK, columns=140, program="kpremote").stdout
    assert "in context" in shown and "1.250x (1.238–1.262)" in shown, shown
