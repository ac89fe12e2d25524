"""Every command's --json is one envelope, {"schema": "kpremote.<command>/N", ...}, valid against its schema file
under docs/schemas/ — checked on the documents the real commands print."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest

from kpremote.agent.results import RESULTS_SCHEMA, RunResults
from kpremote.cli.jsonout import STREAMS, VERSIONS
from kpremote.runs.placement import Outcome
from localproject import TASK, kp, make_project, watch_for
from rig import REPO

SCHEMAS = REPO / "docs" / "schemas"
RECORDS = {"results": RESULTS_SCHEMA, "state": None, "sync-header": None}
"""Schema files of the records the agent writes, or the client sends it (not a command's --json): name -> the
record's schema value (None: the record has no "schema" key, as state.json and a sync stream's header)."""
KEPT_RESULTS = sorted([*(REPO / "tests" / "fixtures" / "results").glob("*.json"),
                       *REPO.glob("kernels/*/results/**/results.json")])
"""Every results.json at hand: the kept ones of earlier harness versions, and whatever runs the task folders hold."""


def validate(document: dict, command: str) -> dict:
    schema = json.loads((SCHEMAS / f"{command}.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    assert document["schema"] == f"kpremote.{command}/{VERSIONS[command]}"
    assert next(iter(document)) == "schema"  # the first key names the shape
    return document


def document_of(result: subprocess.CompletedProcess, command: str) -> dict:
    return validate(json.loads(result.stdout), command)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_project(tmp_path_factory.mktemp("schemas") / "proj")


def test_every_schema_file_is_a_valid_schema_of_its_own_name():
    files = sorted(p.stem for p in SCHEMAS.glob("*.json"))
    assert files == sorted([*VERSIONS, *RECORDS])
    for name in files:
        schema = json.loads((SCHEMAS / f"{name}.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        if RECORDS.get(name, "") is not None:
            assert schema["properties"]["schema"]["const"] == RECORDS.get(name, f"kpremote.{name}/{VERSIONS.get(name)}")


def validate_results(document: dict) -> dict:
    """A results.json, checked against docs/schemas/results.json."""
    schema = json.loads((SCHEMAS / "results.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(document)
    return document


@pytest.mark.parametrize("path", KEPT_RESULTS, ids=lambda p: p.name if "fixtures" in p.parts else str(p.parent))
def test_every_kept_results_json_matches_the_schema_and_reads_back_as_written(path):
    document = validate_results(json.loads(path.read_text()))
    results = RunResults.read(path)
    assert results.to_json() == document  # nothing a reader does not know is lost, nothing is added
    assert results.rows and all(row.interval for row in results.rows if row.speedup)  # the verdict's interval


def test_the_kept_results_include_an_older_harness_shape():
    # The schema and the readers are only shown to take older files if one is here: a file without ended_by.
    assert any("ended_by" not in json.loads(p.read_text()) for p in KEPT_RESULTS)


def test_the_results_schema_refuses_what_no_harness_writes():
    document = json.loads(KEPT_RESULTS[0].read_text())
    for broken in ({**document, "rows": [{**document["rows"][0], "status": "FINE"}]},
                   {**document, "headline": {**document["headline"], "geomean": None, "note": None}},
                   {**document, "rows": [{**document["rows"][0], "verdict": {"low": 1.0, "high": 1.2}}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate_results(broken)


def test_every_command_with_json_has_a_schema():
    from kpremote.commands import ns

    with_json = {name.replace("_", "-") for name, task in ns.tasks.items()
                 if "json" in task.help or "json" in __import__("inspect").signature(task.body).parameters}
    assert with_json <= set(VERSIONS) | set(STREAMS), with_json - set(VERSIONS) - set(STREAMS)
    assert "check" in with_json and "logs" in with_json  # logs --json: lines of its stream's schema
    assert set(STREAMS.values()) <= set(VERSIONS)


def test_gpu_status_json_and_an_unreachable_host_source(project):
    result = kp(project, "gpu-status", "--json")
    assert result.returncode == 2, result.stderr  # `gone` did not answer
    document = document_of(result, "gpu-status")
    by_host = {h["host"]: h for h in document["hosts"]}
    assert by_host["local"]["source"] == "fixture" and [g["idle"] for g in by_host["local"]["gpus"]] == [True, False]
    assert by_host["gone"]["ok"] is False and by_host["gone"]["source"] == "none"
    assert by_host["gone"]["error"].startswith("gone: unreachable")


def test_gpu_status_watch_json_prints_one_document_per_line(project):
    result = watch_for(project, lambda out: out.count("\n") >= 2, "gpu-status", "--host", "local", "--watch", "0.5",
                       "--json")  # Ctrl-C once two documents are printed whole
    assert result.returncode == 130, result.stderr  # Ctrl-C ends a watch with 130, as the README says
    lines = result.stdout.splitlines()
    assert len(lines) >= 2
    for line in lines:
        document = validate(json.loads(line), "gpu-status")
        assert [h["host"] for h in document["hosts"]] == ["local"]


def test_hosts_json_with_and_without_check(project):
    plain = document_of(kp(project, "hosts", "--json"), "hosts")
    assert [h["name"] for h in plain["hosts"]] == ["local", "gone"] and "check" not in plain["hosts"][0]
    result = kp(project, "hosts", "--check", "--json")
    assert result.returncode == 2  # `gone` is unreachable
    checked = {h["name"]: h["check"] for h in document_of(result, "hosts")["hosts"]}
    assert checked["local"]["ok"] is True and checked["gone"]["ok"] is False


def test_sync_run_status_fetch_results_json(project):
    synced = document_of(kp(project, "sync", "--host", "local", "--task", TASK, "--json"), "sync")
    assert synced["task"] == TASK and synced["files_sent"] > 0
    result = kp(project, "run", "--host", "local", "--task", TASK, "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    [outcome] = document_of(result, "run")["runs"]
    assert outcome["status"] == "passed" and outcome["run_id"]
    status = document_of(kp(project, "status", "--host", "local", "--json"), "status")
    assert outcome["run_id"] in [r["run_id"] for r in status["hosts"][0]["runs"]]
    fetched = document_of(kp(project, "fetch-results", "--host", "local", "--task", TASK, "--json"), "fetch-results")
    assert [f["run_id"] for f in fetched["fetched"]] == [outcome["run_id"]]
    assert fetched["fetched"][0]["outcome"] == "unchanged"  # inv run brought it home already


def test_check_json_is_one_document_and_nothing_else(project):
    result = kp(project, "check", "--task", TASK, "--json")
    assert result.returncode == 0, result.stderr
    document = document_of(result, "check")  # the whole stdout is the one document: no progress mixed in
    assert document["status"] == "passed" and document["results"]["schema"] == "kpremote.results/1"
    written = validate_results(json.loads(Path(document["summary_dir"], "results.json").read_text()))
    assert validate_results(document["results"]) == written  # a CPU run through the runner, as the agent wrote it
    # a smoke run's timings mean nothing: no row verdict in results.json, none counted in the headline or the ledger
    rows = document["results"]["rows"]
    assert rows and all(row["verdict"]["verdict"] is None and row["verdict"]["speedup"] for row in rows), rows
    assert not document["results"]["headline"].get("verdicts"), document["results"]["headline"]
    from kpremote.results.ledger import read_ledger

    checked = [e for e in read_ledger(project / "kernels" / TASK) if e["kind"] == "check"][-1]
    assert checked["rows"] and all(row["verdict"] is None for row in checked["rows"].values()), checked["rows"]


def test_check_of_a_task_checked_on_a_gpu_only_says_not_checked_and_does_not_fail(project):
    import shutil

    task = project / "kernels" / "gpuonly"
    shutil.copytree(project / "kernels" / TASK, task, ignore=shutil.ignore_patterns("results", "ledger.jsonl"))
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "gpuonly"\ngpu_only = "bf16 in the interpreter"', 1))
    result = kp(project, "check", "--task", "gpuonly", "--json")
    assert result.returncode == 0, result.stderr  # the newcomer's first command does not fail
    document = document_of(result, "check")
    assert document["status"] == "not checked" and document["exit_code"] == 1  # the run itself: never a pass
    assert document["message"].startswith("not checked on this CPU: checked on a GPU only: bf16 in the interpreter")
    assert {row["status"] for row in document["results"]["rows"]} == {"NOT CHECKED"}
    plain = kp(project, "check", "--task", "gpuonly")
    assert plain.returncode == 0 and "gpuonly: not checked on this CPU: checked on a GPU only" in plain.stdout
    ran = kp(project, "run", "--host", "local", "--task", "gpuonly", "--device", "cpu", "--json")
    assert ran.returncode == 0, ran.stderr  # a host without a GPU: not the candidate's failure either
    [outcome] = document_of(ran, "run")["runs"]
    assert (outcome["status"], outcome["exit_code"]) == ("not checked", 1), outcome
    assert outcome["error"].startswith("not checked on a host without a GPU: checked on a GPU only: bf16")


def test_profile_outcome_matches_its_schema():
    # inv profile needs ncu (tests/test_profile.py runs it); its document is the run outcome, validated here.
    from kpremote.cli.jsonout import document

    validate(document("profile", dataclasses.asdict(Outcome(host="h", task="t", run_id="r", status="passed"))), "profile")
    with pytest.raises(jsonschema.ValidationError):
        validate(document("profile", {"host": "h"}), "profile")


def test_baseline_json(project, tmp_path):
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    (upstream / "k.py").write_text("x = 1\n")
    for argv in (["init", "-q", "-b", "main"], ["add", "k.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "k"]):
        subprocess.run(["git", *argv], cwd=upstream, check=True)
    result = kp(project, "baseline", "--task", TASK, "--repo", str(upstream), "--files", "k.py", "--json")
    assert result.returncode == 0, result.stderr
    pin = document_of(result, "baseline")
    assert pin["task"] == TASK and [f["path"] for f in pin["files"]] == ["k.py"]


REFUSALS = [
    (["run", "--host", "local", "--task", "nope", "--json"], "run", "unknown task"),
    (["run", "--host", "mybox", "--task", TASK, "--json"], "run", "unknown host or group 'mybox'"),
    (["run", "--host", "local", "--task", "empty", "--json-stream"], "run", "missing in kernels/empty/solution"),
    (["logs", "--host", "local", "--run", "nope", "--json"], "logs", "nope"),
    (["run", "--host", "local", "--taks", TASK, "--json"], "run", "unknown option --taks"),
    (["check", "--task", TASK, "--workloads", "nope", "--json"], "check", "no workload 'nope'"),
]


@pytest.mark.parametrize("args, command, words", REFUSALS, ids=[" ".join(a) for a, _, _ in REFUSALS])
def test_a_refused_json_command_still_prints_one_document(project, args, command, words):
    empty = project / "kernels" / "empty"
    if not empty.exists():
        import shutil

        shutil.copytree(project / "kernels" / TASK, empty)
        toml = empty / "task.toml"
        toml.write_text(toml.read_text().replace(f'name = "{TASK}"', 'name = "empty"', 1))
        shutil.rmtree(empty / "solution")
        (empty / "solution").mkdir()
    checks = project / "kernels" / TASK / "results" / "check"
    before = sorted(checks.iterdir()) if checks.is_dir() else []
    result = kp(project, *args)
    assert result.returncode == 2, result.stderr
    document = document_of(result, "error")  # the whole stdout: one object, whatever the refusal
    assert document["command"] == command and document["exit_code"] == 2
    assert words in document["error"] and document["error"] in result.stderr, (document, result.stderr)
    assert (sorted(checks.iterdir()) if checks.is_dir() else []) == before  # refused before any check started
