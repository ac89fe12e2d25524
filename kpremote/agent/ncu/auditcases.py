"""The audit's cases and the check of what the audited calls wrote, in a trusted process of their own.

    python -m kpremote.agent.ncu.auditcases make  < {"task_dir", "workload", "device", "secret", "count",
                                                      "inputs": {side: path}}
    python -m kpremote.agent.ncu.auditcases check < {... the same, "results": {side: path}}
    check prints one JSON line: {side: {"ok": true | false | null, "status", "message"}}

The audited process (side.py's audited calls, under ncu) must do the work of every call it is timed on: a
candidate that recognises the audit could otherwise do only the share of it that makes ncu read a forged time. So
its calls are checked calls, as a timed side's are. The runner (audit.audit_row) draws a secret per row and hands it
to this module on stdin, never to the audited process; `make` builds `count` cases from seeds derived from it
(case 0 for the warm-up, one more for each audited call, each at its own addresses) with the task's adapter and
writes each side's copy of their inputs and outputs into a file in that side's scratch folder; the audited process
poisons its outputs before each call and writes what each call produced to its results file. `check` (after both
sides' audited processes ended) makes the same cases again from the secret, so nothing it compares with was ever in
a file (where the baseline's copy of the inputs is given, the remade cases must match it bit for bit, else nothing
is judged: an adapter whose make_case is not the same for a seed), loads the results without unpickling code (torch.load(weights_only=True)) and judges each call's results
by the harness's own rule (correctness.judge_results: the adapter's reference when it has one, the baseline must
agree with it, else the baseline's results; the task's tolerances). The runner never imports torch; this module
never imports a side's module, and its process is undumpable, as the judge's is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..harness import correctness, guard
from ..harness.cases import derive_seed
from ..task.taskspec import SIDES, load_task

PURPOSE = "audit"
MISMATCH = "the {side}'s audited calls do not match the expected output"


def seeds(secret: bytes, workload: str, count: int) -> list[int]:
    """The row's audit seeds: case 0 is the warm-up's, case k the k-th audited call's."""
    return [derive_seed(secret, workload, PURPOSE, k) for k in range(count)]


def make(request: dict[str, Any]) -> None:
    """Each side's copy of the cases (inputs and the side's own outputs, on the CPU) into its file."""
    import torch

    adapter, params, device, made = _cases(request)
    for side, path in request["inputs"].items():
        outputs = "outputs_baseline" if side == "baseline" else "outputs_candidate"
        torch.save({"cases": [{"inputs": _cpu(case.inputs), "outputs": _cpu(getattr(case, outputs))}
                              for case, _ in made], "mutates": list(made[0][1])}, path)


def check(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each side's verdict on its results: ok, or the first call whose results are wrong and how."""
    adapter, params, device, made = _cases(request)
    given = request.get("inputs", {}).get("baseline")  # the baseline's copy: no candidate process can write it
    if given and not _same_cases(given, made):
        why = ("not checked: the adapter's make_case gave other inputs for the same seed than when the audited "
               "process's cases were made (the audit's check needs a case per seed)")
        return {side: {"ok": None, "status": None, "message": why} for side in request["results"]}
    results = {side: _load(path, len(made) - 1) for side, path in request["results"].items()}
    verdict = {side: {"ok": None, "status": None, "message": f"not checked: {why}"}
               for side, (_, why) in results.items() if why}
    base, _ = results.get("baseline", (None, "no results"))
    cand, _ = results.get("candidate", (None, "no results"))
    if base is None:
        if "candidate" in results and "candidate" not in verdict:
            verdict["candidate"] = {"ok": None, "status": None, "message": "not checked: the baseline's audited "
                                    "calls gave no results to compare with"}
        return verdict
    for k, (case, mutates) in enumerate(made[1:], start=1):
        label = f"audited call {k} (seed {request['_seeds'][k]})"
        layout = correctness.results_of(case.outputs_baseline, case.inputs, mutates)
        fresh = correctness.reference_inputs(case.inputs, correctness.clone_tensors(case.inputs))
        try:
            for side, got in (("baseline", base[k - 1]), ("candidate", (cand or [None] * k)[k - 1])):
                missing = _missing(got, layout) if got is not None else None
                if missing:
                    raise correctness.Refused(correctness.Verdict(
                        correctness.ERROR if side == "baseline" else correctness.INCORRECT,
                        f"{side} output {missing!r} is missing from its results", label))
            correctness.judge_results(adapter, params, label, fresh, layout, base[k - 1],
                                      cand[k - 1] if cand is not None else base[k - 1], float(case.atol),
                                      float(case.rtol), device=device, largest={})
        except correctness.Refused as refused:
            side = "baseline" if refused.verdict.status == correctness.ERROR else "candidate"
            verdict[side] = {"ok": False, "status": refused.verdict.status,
                             "message": f"{MISMATCH.format(side=side)}: {refused.verdict.message} ({label})"}
            if side == "baseline":  # nothing of the candidate's can be judged against a wrong baseline
                verdict.setdefault("candidate", {"ok": None, "status": None,
                                                 "message": "not checked: the baseline's audited calls are wrong"})
            break
    for side in results:
        verdict.setdefault(side, {"ok": True, "status": correctness.PASSED,
                                  "message": f"the {side}'s {len(made) - 1} audited calls match the expected output"})
    return verdict


# --------------------------------------------------------------------------------------------- the pieces


def _cases(request: dict[str, Any]) -> tuple[Any, dict[str, Any], str, list[tuple[Any, tuple[str, ...]]]]:
    """The adapter (no side bound: bind gets None for both), the row's parameters, the device and the cases."""
    from ..task.build import import_adapter

    spec = load_task(Path(request["task_dir"]))
    workload = next(w for w in spec.workloads if w.id == request["workload"])
    device = "cuda" if str(request["device"]).startswith("cuda") else "cpu"
    adapter = import_adapter(spec)
    if callable(getattr(adapter, "bind", None)):
        adapter.bind(**{side: None for side in SIDES})
    params = workload.params
    request["_seeds"] = seeds(bytes.fromhex(request["secret"]), workload.id, int(request["count"]))
    made = []
    for k, seed in enumerate(request["_seeds"]):
        label = f"audit case {k} (seed {seed})"
        case = correctness.guarded(f"{label}, make_case", lambda: adapter.make_case(params, device=device, seed=seed))
        made.append((case, correctness.mutated_inputs(params.get("mutates"), case, label)))
    return adapter, params, device, made


def _cpu(values: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {name: value.detach().cpu() if torch.is_tensor(value) else value for name, value in values.items()}


def _load(path: str, calls: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """A side's results: one dict of tensors per audited call, or None and why not."""
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, "its audited calls wrote no results"
    except Exception as exc:  # noqa: BLE001 - whatever the file holds, it is not results
        return None, f"its results file cannot be read ({type(exc).__name__})"
    if not isinstance(loaded, list) or len(loaded) != calls or not all(isinstance(r, dict) for r in loaded):
        return [{}] * calls, None  # judged: every call's results are missing
    return loaded, None


def _same_cases(path: str, made: list[tuple[Any, tuple[str, ...]]]) -> bool:
    """Whether the cases made again here are those written for the audited processes, bit for bit."""
    import torch

    try:
        written = torch.load(path, map_location="cpu", weights_only=True)["cases"]
    except Exception:  # noqa: BLE001 - gone or unreadable: nothing to hold the remade cases against
        return False
    if len(written) != len(made):
        return False
    for record, (case, _) in zip(written, made):
        for name, value in _cpu(case.inputs).items():
            other = record["inputs"].get(name)
            same = correctness.same_bits(value, other) if torch.is_tensor(value) and torch.is_tensor(other) \
                else value == other
            if not same:
                return False
    return True


def _missing(got: dict[str, Any], layout: dict[str, Any]) -> str | None:
    import torch

    return next((name for name in layout if not torch.is_tensor(got.get(name))), None)


def main(argv: list[str]) -> int:
    if argv not in (["make"], ["check"]):
        print("usage: python -m kpremote.agent.ncu.auditcases make|check < REQUEST.json", file=sys.stderr)
        return 2
    guard.make_undumpable()  # as the judge: the secret and the expected results stay out of a same-user reader
    guard.safe_sys_path()
    request = json.loads(sys.stdin.read())
    try:
        if argv == ["make"]:
            make(request)
            print(json.dumps({"ok": True}), flush=True)
        else:
            print(json.dumps(check(request)), flush=True)
    except correctness.Refused as refused:  # make_case or the reference failed: the audit cannot check outputs
        print(json.dumps({"ok": False, "error": refused.verdict.message}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
