"""The trusted judge of a run's workload rows: correctness, timing and every number, with the candidate kept outside.

    python -m kpremote.agent.harness.judge --result-fd N      (the run's secret, then one job a row, as JSON lines on stdin)

The judge imports torch and the task's bench/adapter.py (trusted, pinned) but never a side's module, and never
calls adapter.bind. It starts one side process per side (side.py), each holding the adapter and only its own
module, and drives them over a socket: "here is case k", "call case k", "time a sample on case k". Every case
is built here by adapter.make_case with seeds derived from the run's secret (which no side sees); each side
gets its own copy of the inputs (CUDA IPC from a memory pool of its own, or memfd shared memory on the CPU)
and its own outputs. The judge poisons outputs before every call and every timed sample (and writes fresh
copies of the inputs a call mutates in place, which it then judges like outputs), compares them itself, recomputes every statistic, verdict and speedup from the raw sample times, and checks them against
physical floors. A side sends back only JSON: acknowledgements and raw times.

One judge and its two sides serve the rows of a run one after another (a Bench, bench.py: the task, the adapter,
the sides); each row starts from nothing of the last one but those processes: its own secret-seeded cases, its own
log (the judge and both sides write to raw/workloads/<row>.log while it runs). The runner (judgeprocess.py)
keeps them only after a row that PASSED with nothing invalid; any other row ends them and the next row gets fresh
ones.

Its helpers, one job each: bench.py (what the rows share), judgetiming.py (the row's timing, once it passed),
sideprocess.py (a side's process and the judge's end of its socket), cases.py (the secret seeds, each case copied
into memory each side may see), sampling.py (the timed loop with its checked samples and refreshes), regimes.py (a
row's context regimes), floors.py (the physical floors).

Results go to the runner through the inherited pipe N (per row a "ready" line once both sides are up, then the
result), never through a file a side could reach. The judge makes itself undumpable first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import traceback
from typing import Any

from . import guard, numerics
from .bench import Bench
from .judgetiming import JudgeTiming
from .rowlog import open_log, write_output_to
from ..sandbox import members
from .cases import SharedCase, Sharing, derive_seed, make_case_guarded
from .channel import encode_values
from .correctness import ERROR, PASSED, CaseView, Refused, SideFailed, Verdict, check_case, mutated_inputs
from .sideprocess import SideProcess, request_guarded
from .sidestarter import SideStarter
from ..task.taskspec import SIDES, Workload

TIMING_CASES_GPU = 4  # fresh cases at distinct addresses the timed samples rotate over
TIMING_CASES_CPU = 2  # the interpreter is slow: fewer on a smoke run, the same boundary


# --------------------------------------------------------------------------------------------- the row


class Judge(JudgeTiming):
    """One row, start to end, with both sides in their own processes (the bench's)."""

    def __init__(self, bench: Bench, job: dict[str, Any], secret: bytes, announce_ready: Any) -> None:
        self.bench = bench
        self.job = job
        self.secret = secret
        self.announce_ready = announce_ready
        self.spec = bench.spec
        self.workload: Workload = next(w for w in self.spec.workloads if w.id == job["workload"])
        self.params = self.workload.params
        self.device = bench.device
        self.cases: dict[int, SharedCase] = {}
        self.next_id = 0
        self.seeds: dict[str, list[int]] = {"correctness": [], "timing": [], "refresh": []}
        self.rng = random.Random(secrets.randbits(64))
        self.checked = {side: 0 for side in SIDES}
        self.refreshes = 0
        self.largest: dict[str, float] = {}
        self.numerics = numerics.new_record(self.workload.contract)  # the row's contract, filled case by case
        self.idle_cpu_s = {side: 0.0 for side in SIDES}  # each side's CPU while the other's were timed (takes kept)
        self.take_idle_cpu_s: dict[str, float] = {}  # the same, of the last take only
        self.regime_refreshes: dict[str, int] = {}  # per context regime: its in-place refreshes of the state

    @property
    def sides(self) -> dict[str, SideProcess]:
        return self.bench.sides

    def pids_of(self, side: str) -> list[int]:
        """Every process of one side: one in each process pair."""
        return [pair[side].pid for pair in self.bench.pairs]

    @property
    def adapter(self) -> Any:
        return self.bench.adapter

    @property
    def sharing(self) -> Sharing:
        return self.bench.sharing

    # ---------------------------------------------------------------- start and stop

    def start(self) -> dict[str, Any] | None:
        """The bench's sides up, told this row's workload and log; None, or the row's ERROR."""
        failed = self.bench.start()
        if failed:
            return failed
        for process in self.bench.every_process():
            side = process.side
            log = open_log(self.job["log"]) if self.job.get("log") else None
            try:
                process.request({"op": "row", "workload": self.params}, [log] if log is not None else [])
            except SideFailed as exc:
                return {"status": ERROR, "message": f"{side}: {exc.message}", "where": "import",
                        "traceback": exc.traceback_text}
            finally:
                if log is not None:
                    os.close(log)
        self.announce_ready()
        return None

    def stop(self) -> None:
        for case in self.cases.values():
            case.close()
        self.cases = {}

    # ---------------------------------------------------------------- cases

    def new_case(self, label: str, seed: int, index: int = 0) -> SharedCase:
        """The index-th case of its kind (a correctness seed's, a timing case's), handed to every process."""
        case = make_case_guarded(self.adapter, self.params, self.device, seed, label)
        mutates = mutated_inputs(self.workload.mutates, case, label)
        shared = self.sharing.share(case, self.next_id, label, seed, index)
        shared.mutates = mutates
        self.next_id += 1
        for process in self.bench.every_process():
            side = process.side
            fds: list[int] = []
            command = {"op": "case", "id": shared.id, "mutates": list(mutates),
                       "inputs": encode_values(shared.inputs[side], fds, shared.keep),
                       "outputs": encode_values(shared.outputs[side], fds, shared.keep)}
            request_guarded(process, command, f"{label}, handing the case to the {side}", fds)
        self.cases[shared.id] = shared
        return shared

    def drop_case(self, shared: SharedCase) -> None:
        for process in self.bench.every_process():
            request_guarded(process, {"op": "drop", "id": shared.id}, f"{shared.label}, drop")
        shared.close()
        self.cases.pop(shared.id, None)

    def view(self, shared: SharedCase) -> CaseView:
        case = shared.case
        atol = float(case.atol if self.workload.atol is None else self.workload.atol)
        rtol = float(case.rtol if self.workload.rtol is None else self.workload.rtol)

        def call(side: str) -> dict[str, Any] | None:
            return self.sides[side].request({"op": "call", "id": shared.id}).get("problem")

        return CaseView(shared.label, shared.inputs, shared.outputs, shared.pristine, call, atol, rtol, shared.mutates,
                        self.workload.contract)

    # ---------------------------------------------------------------- correctness

    def correctness(self) -> tuple[Verdict, list[SharedCase]]:
        """The gate on `seeds` secret-seeded cases, then on the timing cases (kept for timing)."""
        n_seeds = self.spec.timing.seeds
        k_timing = TIMING_CASES_GPU if self.device == "cuda" else TIMING_CASES_CPU
        timing_cases: list[SharedCase] = []
        checked = 0
        try:
            for k in range(n_seeds):
                seed = derive_seed(self.secret, self.workload.id, "correctness", k)
                self.seeds["correctness"].append(seed)
                shared = self.new_case(f"seed {seed}", seed, k)
                check_case(self.adapter, self.params, self.view(shared), device=self.device, largest=self.largest,
                           record=self.numerics)
                checked += 1
                self.drop_case(shared)
            for k in range(k_timing):
                seed = derive_seed(self.secret, self.workload.id, "timing", k)
                self.seeds["timing"].append(seed)
                shared = self.new_case(f"timing case {k} (seed {seed})", seed, k)
                shared.expected = check_case(self.adapter, self.params, self.view(shared), device=self.device,
                                             largest=self.largest, record=self.numerics)
                checked += 1
                timing_cases.append(shared)
        except Refused as refused:
            refused.verdict.seeds_checked = checked
            return refused.verdict, timing_cases
        return Verdict(PASSED, seeds_checked=checked, max_abs_err=self.largest,
                       numerics=self.numerics), timing_cases

    def run(self) -> dict[str, Any]:
        failed = self.start()
        _log(f"sides ready (row {self.bench.rows_started} of these processes)")
        if failed:
            return failed
        verdict, cases = self.correctness()
        _log(f"correctness: {verdict.status}")
        result: dict[str, Any] = {"status": verdict.status, "message": verdict.message, "where": verdict.where,
                                  "correctness": verdict.to_json(), "timing": None, "seeds": self.seeds}
        if verdict.status != PASSED:
            return result  # nothing is timed for a row that is not correct
        try:
            result.update(self.time_row(cases))
        except Refused as refused:
            result.update(status=refused.verdict.status, message=refused.verdict.message,
                          where=refused.verdict.where, mismatch=refused.verdict.mismatch, timing=None)
            result.pop("samples", None)
            result.pop("regime_samples", None)
        except SideFailed as exc:
            result.update(status=ERROR, message=f"timing: {exc.message}", where="timing", timing=None,
                          traceback=exc.traceback_text)
        except Exception as exc:  # noqa: BLE001
            result.update(status=ERROR, message=f"timing: {type(exc).__name__}: {exc}", where="timing", timing=None,
                          traceback=traceback.format_exc())
        result["seeds"] = self.seeds
        _log(f"timing: {result['status']}")
        return result


_ROW_STARTED = [__import__("time").monotonic()]


def _log(what: str) -> None:
    """A line in the row's log with the seconds since the row began: where a row's time went."""
    print(f"judge +{__import__('time').monotonic() - _ROW_STARTED[0]:.2f} s: {what}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- entry point


def run_row(bench: Bench, job: dict[str, Any], secret: bytes, announce_ready: Any) -> dict[str, Any]:
    judge = Judge(bench, job, secret, announce_ready)
    try:
        return judge.run()
    finally:
        judge.stop()


def _void_for_leftovers(result: dict[str, Any], leftovers: list[str]) -> None:
    """Processes a side started and left running past its row (a daemon, a helper that setsid away): killed, and
    the row's numbers void, whatever they were."""
    if leftovers:
        why = f"a side left {len(leftovers)} process(es) running past its row, killed: {', '.join(leftovers)}"
        result["invalid"] = "; ".join(filter(None, [result.get("invalid"), why]))


def _void_for_tampering(result: dict[str, Any], processes: list[SideProcess]) -> None:
    """A side whose process replaced the machinery that times and reports its samples (its seal broke: seal.py):
    whatever it reported of its times is void, and the row says what was replaced."""
    by_side: dict[str, list[str]] = {}
    for process in processes:
        for name in process.tampered:
            by_side.setdefault(process.side, [])
            if name not in by_side[process.side]:
                by_side[process.side].append(name)
    if not by_side or result.get("timing") is None:
        return
    why = "; ".join(f"the {side} side's process replaced what times and reports its samples ({', '.join(names)}): "
                    f"its times are void"
                    for side, names in sorted(by_side.items()))
    result["invalid"] = "; ".join(filter(None, [result.get("invalid"), why]))


def write_line(fd: int, value: dict[str, Any]) -> None:
    data = (json.dumps(value, default=str) + "\n").encode()
    while data:
        written = os.write(fd, data)
        data = data[written:]


def serve_rows(lines: Any, secret: bytes, result_fd: int, starter: SideStarter | None = None) -> None:
    """One row per job line, until stdin closes; the bench (and its sides) lives as long as the lines come."""
    bench: Bench | None = None
    ours = {starter.pid} if starter else set()  # the starter is the judge's own, never a row's leftover
    try:
        for line in lines:
            job = json.loads(line)["job"]
            write_output_to(job.get("log"))
            _ROW_STARTED[0] = __import__("time").monotonic()
            workload = job["workload"]
            try:
                bench = bench or Bench(job, starter)
                result = run_row(bench, job, secret, lambda: write_line(result_fd, {"ready": workload}))
                if bench.sides:
                    result["processes"] = bench.processes()
                    result["sandbox"] = dict(bench.sandbox)
                _void_for_leftovers(result, members.kill_leftovers({p.pid for p in bench.every_process()} | ours))
                _void_for_tampering(result, bench.every_process())
            except Exception as exc:  # noqa: BLE001 - the runner gets a result it can show, never a dead process
                result = {"status": ERROR, "message": f"judge: {type(exc).__name__}: {exc}", "where": "judge",
                          "traceback": traceback.format_exc()}
            write_line(result_fd, {"result": result, "workload": workload})
    finally:
        if bench is not None:
            bench.stop()


def main(argv: list[str]) -> int:
    guard.make_undumpable()
    guard.safe_sys_path()
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.harness.judge")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--run-dir", help="the run folder (for people reading `ps`; the jobs come on stdin)")
    args = parser.parse_args(argv)
    starter = SideStarter.fork()  # before the secret is read: the starter and its sides never hold it
    try:
        secret = bytes.fromhex(json.loads(sys.stdin.readline())["secret"])
        serve_rows(sys.stdin, secret, args.result_fd, starter)
    finally:
        if starter is not None:
            starter.stop()
    os.close(args.result_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
