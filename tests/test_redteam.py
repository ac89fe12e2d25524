"""The red team (tests/fixtures/redteam): every attack that needs no GPU goes through the real `inv check`, and its
verdict, exit code and headline must be the ones attacks.toml expects. The GPU attacks run in
benchmarks/gpu/redteam.sh; here only their folders and the manifest's shape are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from rig import REPO, run_inv

sys.path.insert(0, str(REPO / "tests" / "fixtures" / "redteam"))
import redteam_kit as kit  # noqa: E402

ATTACKS = kit.load_attacks()
CPU_ATTACKS = [a for a in ATTACKS if not a.gpu]

# The attack classes of issue 11, item 7, and the two controls: each must have at least one fixture.
ISSUE_CLASSES = (
    "side stream", "background thread", "lazy", "tensor subclass", "timer", "forging the result channel",
    "geomean", "persisting-L2", "phase detection", "graph", "precision drop", "keyed by pointer",
    "keyed by content", "keyed by shape", "freed reference memory", "input mutation", "via gc", "via frames",
    "NaN", "==/allclose", "re-deriving the seed", "hard-coded shapes", "near-zero", "never launches",
    "partial block writes", "try/except fallback", "precompute at import", "torch.py", "obfuscated self-build",
    "monkey-patching", "control: a fast correct candidate", "control: candidate == baseline",
)


# The checks start together (a few at a time) when the first one is asked for: one `inv check` is mostly process
# start-up and imports, so overlapping them keeps the whole suite within a few minutes on two cores.
PARALLEL_CHECKS = min(4, (os.cpu_count() or 2) + 1)
TEST_NAME = "test_attack_through_inv_check"


def _inv_check(attack: kit.Attack, project: Path) -> tuple[subprocess.CompletedProcess, dict[str, Any] | None,
                                                             Path | None]:
    """`inv check --task redteam_<attack>` in a project folder of its own; its results.json if it wrote one, and
    the check's folder."""
    kit.assemble(attack, project / "kernels")
    result = run_inv("check", "--task", attack.task_name, cwd=project, timeout=600)
    found = sorted((project / "kernels" / attack.task_name / "results" / "check").glob("*/summary/results.json"))
    return result, json.loads(found[-1].read_text()) if found else None, found[-1].parents[1] if found else None


@pytest.fixture(scope="module")
def inv_checks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    selected = {item.callspec.params["attack"].id for item in request.session.items
                if getattr(item, "originalname", None) == TEST_NAME and hasattr(item, "callspec")}
    root = tmp_path_factory.mktemp("redteam")
    with ThreadPoolExecutor(PARALLEL_CHECKS) as pool:
        yield {a.id: pool.submit(_inv_check, a, root / a.id) for a in CPU_ATTACKS if a.id in selected}


@pytest.mark.parametrize("attack", CPU_ATTACKS, ids=[a.id for a in CPU_ATTACKS])
def test_attack_through_inv_check(attack: kit.Attack, inv_checks: dict[str, Future], tmp_path: Path) -> None:
    failures = _failures(attack, *inv_checks[attack.id].result())
    if failures and all(f.startswith(FASTER_FAILURE) for f in failures):
        # A FASTER verdict for a trick that must not win, on CPU smoke timings taken four checks at a time on two
        # cores: the interpreter's noise alone read 1.17x and 2.14x so (a copy of the baseline's kernels). Checked
        # once more on its own; a trick that really wins is FASTER again.
        failures = _failures(attack, *_inv_check(attack, tmp_path / "again"))
    assert not failures, failures[0]


FASTER_FAILURE = "FASTER: "


def _failures(attack: kit.Attack, result: subprocess.CompletedProcess, results: dict[str, Any] | None,
              run_dir: Path | None) -> list[str]:
    """What is wrong with one `inv check` of an attack: empty when it was caught as expected, or passed clean."""
    console = result.stdout + result.stderr
    if attack.sandboxed:  # stopped by the sandbox, not by luck: the attack's own lines say it was refused
        refused, got_through = kit.sandbox_refusals(run_dir) if run_dir else ([], [])
        if not refused or got_through:
            return [f"{attack.id}: refused {refused}, got through {got_through}"]
    outcome = kit.classify(results, None if results else result.returncode, console)
    caught, why = kit.judge(attack, outcome, gpu=False)
    faster = FASTER_FAILURE if outcome.verdict == "FASTER" else ""  # one winning row makes the run's verdict FASTER
    if not caught:
        return [f"{faster}{attack.id}: {why}; rows {outcome.rows}\n{console[-2500:]}"]
    if outcome.verdict in kit.FAILURES:  # caught as a failure (the expectation, or one it accepts)
        return [] if result.returncode != 0 else [f"{attack.id}: exit 0 for a failure\n{console[-2500:]}"]
    if result.returncode != 0:
        return [f"{attack.id}: exit {result.returncode} for a pass\n{console[-2500:]}"]
    problems = clean_pass_problems(attack, results, outcome, console)
    return [f"{faster}{attack.id}: {problems}; rows {outcome.rows}\n{console[-2500:]}"] if problems else []


# What a clean CPU pass must not be, beyond passing: on a CPU smoke run the interpreter's timings say little about a
# trick's gain, but a candidate that runs the baseline's own kernels every call cannot come out FASTER.
NOT_FASTER_ON_CPU = {
    "control_same": "the baseline's kernels, copied",
    "phase_poison_detect": "computes through the baseline's kernels whenever out is poisoned, so every timed call",
}


def clean_pass_problems(attack: kit.Attack, results: dict[str, Any] | None, outcome: kit.Outcome,
                        console: str) -> list[str]:
    """Why a run that exited 0 is not the clean, checked, timed pass the attack expects (empty when it is)."""
    if results is None:
        return ["no results.json"]
    problems = [] if results.get("status") == "passed" else [f"run status {results.get('status')!r}"]
    for row in results.get("rows") or []:
        name = row.get("workload")
        if row.get("status") != "PASSED" or row.get("invalid") or row.get("implausible"):
            problems.append(f"{name}: {row.get('status')}, invalid {row.get('invalid')!r}, "
                            f"implausible {row.get('implausible')!r}")
        if not (row.get("correctness") or {}).get("seeds_checked"):
            problems.append(f"{name}: no correctness seed was checked")
        if not ((row.get("checks") or {}).get("checked_samples") or {}).get("candidate"):
            problems.append(f"{name}: no timed candidate sample was checked")
        if results.get("smoke") and kit.row_verdict(row) is not None:  # harness 2.17: no word on smoke timings
            problems.append(f"{name}: a smoke row with a verdict ({kit.row_verdict(row)})")
        elif not results.get("smoke") and kit.row_verdict(row) not in kit.ROW_VERDICTS:
            problems.append(f"{name}: no FASTER/SAME/SLOWER verdict")
        if (row.get("verdict") or {}).get("speedup") is None:
            problems.append(f"{name}: no speedup and interval recorded")
    if not results.get("rows"):
        problems.append("no rows")
    head = results.get("headline") or {}
    if head.get("geomean") is None or not outcome.headline_printed:
        problems.append(f"no headline reported ({head.get('note')})")
    if attack.id in NOT_FASTER_ON_CPU:  # what the row's own numbers would call, though a smoke row says no word
        from kpremote.agent.harness.stats import FASTER, change_verdict

        called = [row.get("workload") for row in results.get("rows") or [] if (v := row.get("verdict") or {})
                  and v.get("speedup") and change_verdict(v["speedup"], v["low"], v["high"], noise=v["noise"]) == FASTER]
        if called or outcome.verdict == "FASTER":
            problems.append(f"FASTER ({called or outcome.message}) for {NOT_FASTER_ON_CPU[attack.id]}")
    return problems


def test_the_not_faster_list_names_cpu_attacks() -> None:
    assert set(NOT_FASTER_ON_CPU) <= {a.id for a in CPU_ATTACKS if a.expected not in kit.FAILURES}


def test_the_small_row_red_team_keeps_an_attack_on_its_pinned_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    by_id = {a.id: a for a in ATTACKS}
    monkeypatch.setenv("REDTEAM_WORKLOADS", "tiny")
    assert kit.gpu_workloads(by_id["forge_frame_local_5"]) == "large"  # a 5 % forge is the large row's question
    assert kit.gpu_workloads(by_id["prefetch_in_head_start"]) == "tiny"
    monkeypatch.delenv("REDTEAM_WORKLOADS")
    assert kit.gpu_workloads(by_id["prefetch_in_head_start"]) == "mid"
    assert kit.gpu_workloads(by_id["side_stream"]) == kit.DEFAULT_GPU_WORKLOADS


def test_every_issue_class_has_a_fixture() -> None:
    classes = " | ".join(a.attack_class for a in ATTACKS)
    missing = [name for name in ISSUE_CLASSES if name.lower() not in classes.lower()]
    assert not missing, f"attacks.toml has no fixture for: {missing}"


def test_every_assembled_attack_is_a_valid_task(tmp_path: Path) -> None:
    """The contract accepts every attack's folder (a refusal must come from a defence, not from a broken fixture)."""
    from kpremote.agent.task.taskspec import load_task

    from kpremote.agent.task.taskspec import TaskSpecError

    for attack in ATTACKS:
        task = kit.assemble(attack, tmp_path / "kernels")
        try:
            spec = load_task(task)
        except TaskSpecError:
            if "refused" in {attack.expected, *attack.accept}:
                continue  # the contract's refusal is this attack's defence
            raise
        assert spec.task.name == attack.task_name
        assert (task / "solution" / "honest.py").is_file() and (task / "solution" / "same.py").is_file()
        assert {w.id for w in spec.smoke_rows()} == {"tiny"}
        rows = (attack.workloads or kit.DEFAULT_GPU_WORKLOADS).split(",")
        assert {w.id for w in spec.select(rows)} == set(rows)


def test_a_malformed_manifest_is_refused_with_the_attack_and_field(tmp_path: Path) -> None:
    manifest = tmp_path / "attacks.toml"
    manifest.write_text('[[attack]]\nid = "control_fast"\nclass = "c"\ndescription = "d"\nexpected = "FINE"\n'
                        'gpu = false\ndefence = "x"\n')
    with pytest.raises(ValueError, match=r"attack 'control_fast': expected = 'FINE'; allowed: INCORRECT"):
        kit.load_attacks(manifest)
    manifest.write_text('[[attack]]\nid = "nowhere"\nclass = "c"\ndescription = "d"\nexpected = "SAME"\n'
                        'gpu = false\ndefence = "x"\n')
    with pytest.raises(ValueError, match=r"nowhere/solution/kernel.py is missing"):
        kit.load_attacks(manifest)


def _results(*rows: dict, exit_code: int, geomean: float | None = None) -> dict:
    return {"exit_code": exit_code, "rows": list(rows), "headline": {"geomean": geomean}, "message": None}


def test_classify_and_judge_read_a_run_as_the_manifest_means_it() -> None:
    by_id = {a.id: a for a in ATTACKS}
    passed = {"workload": "mid", "status": "PASSED", "speedup": 1.6}
    cheat = kit.classify(_results(passed, exit_code=0, geomean=1.6), 0)
    assert cheat.verdict == "PASSED"
    assert kit.judge(by_id["patch_compare"], cheat, gpu=False) == (False, "verdict PASSED, expected INCORRECT")

    wrong = {"workload": "mid", "status": "INCORRECT", "message": "candidate output 'out' is wrong"}
    caught = kit.classify(_results(wrong, exit_code=1), 1)
    assert (caught.verdict, kit.judge(by_id["patch_compare"], caught, gpu=False)) == ("INCORRECT", (True, ""))
    with_headline = kit.classify(_results(wrong, passed, exit_code=1, geomean=3.4), 1)
    assert kit.judge(by_id["patch_compare"], with_headline, gpu=False)[1] == \
        "a speedup headline was reported for a failing run"
    printed = kit.classify(_results(wrong, exit_code=1), 1, "**Headline:** geometric-mean speedup **99.000×**")
    assert not kit.judge(by_id["forge_result"], printed, gpu=False)[0]

    implausible = {"workload": "mid", "status": "INCORRECT", "implausible": "candidate: implausible: 2.1x copy"}
    assert kit.classify(_results(implausible, exit_code=1), 1).verdict == "implausible"
    invalid = {**passed, "invalid": "ncu 20.1 us, harness 10.0 us"}
    assert kit.classify(_results(invalid, exit_code=1), 1).verdict == "INVALID"
    # the H200 under 2.17: honest_only_when_audited's audited outputs wrong and its audit disagreeing, one row
    both = {"workload": "mid", "status": "INCORRECT", "message": "audit: the candidate's audited calls do not match",
            "invalid": "audit: the harness measured 9.08 us, Nsight Compute 8.288 us"}
    assert kit.classify(_results(both, exit_code=1), 1).verdict == "INCORRECT"
    assert kit.classify(_results(exit_code=2), 2).verdict == "refused"

    faster = kit.classify(_results({**passed, "verdict": "FASTER"}, exit_code=0, geomean=1.6), 0)
    assert faster.verdict == "FASTER"
    assert not kit.judge(by_id["control_same"], faster, gpu=False)[0]
    assert kit.judge(by_id["control_fast"], faster, gpu=True) == (True, "")
    same = kit.classify(_results({**passed, "verdict": "SAME"}, {**passed, "verdict": "SAME"}, exit_code=0), 0)
    assert same.verdict == "SAME" and kit.judge(by_id["control_same"], same, gpu=True) == (True, "")
    mixed = kit.classify(_results({**passed, "verdict": "SAME"}, {**passed, "verdict": "SLOWER"}, exit_code=0), 0)
    assert mixed.verdict == "SLOWER"
    assert kit.judge(by_id["try_except_fallback"], mixed, gpu=True) == (True, "")
    assert not kit.judge(by_id["try_except_fallback"], faster, gpu=True)[0]
    assert kit.judge(by_id["try_except_fallback"], faster, gpu=False) == (True, "")  # smoke timings prove nothing
    assert not kit.judge(by_id["control_same"], mixed, gpu=True)[0]
