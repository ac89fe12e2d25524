"""A profile run: the timing runner's steps up to the correctness gate of one workload, then Nsight Compute.

    python -m kpremote.agent.run.profile --profile JSON [runner options]     (what `start --profile JSON` spawns)
    python -m kpremote.agent.run.profile call --job JOB.json --out DONE.json (the process ncu profiles: profiledcall.py)

Both sides are built and the workload gated exactly as in `inv run` (the same Runner steps, the same workload
worker, so this row is also timed once); a row that is not PASSED is never profiled. Then each chosen side runs
under `ncu --clock-control none`, its report stays in raw/ncu/<side>-<workload>.ncu-rep, and the per-kernel
figures read back from it go to summary/profile.md and summary/profile.csv (profilereport.py) with each report's
sha256 and host path. A failure leaves no profile.md or profile.csv, and no half-written report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import sandbox
from ..ncu import ncu
from ..atomicfile import write_atomically
from ..harness.correctness import PASSED, SKIPPED
from ..procfs import kill_tree
from ..harness.profiledcall import call_main, call_side
from ..ncu.profilereport import SideProfile, render_profile_csv, render_profile_json, render_profile_md
from ..protocol import ProfileRequest, RunExit
from ..provenance import file_sha256
from ..results import RowResult
from .runner import Runner
from .stopping import Abort
from .runoptions import Options, parse_profile_args
from ..task.build import side_reads
from ..task.taskspec import Workload

PROFILE_LIMIT_S = 3600.0  # one side under ncu: a full set replays every kernel dozens of times


class ProfileRunner(Runner):
    """Runner's validate → lease → build → gate, then ncu per side and the profile summary."""

    def __init__(self, options: Options, command: list[str], request: ProfileRequest | str) -> None:
        super().__init__(options, command)
        self.request = request  # a string says why the request could not be read; refused in _validate
        self.ncu_path = ""
        self.profiled: list[SideProfile] = []

    def _run_all(self) -> tuple[str, int, str | None]:
        self._get_ready()
        [workload] = self.ctx.selected
        self._run_rows([workload])  # its judge ended: ncu measures a GPU no row process holds
        self._require_gate_passed(self.ctx.rows[-1])
        self._phase("profile")
        for side in self.request.sides:
            self.profiled.append(self._profile_side(workload, side))
        self._phase("summarize")
        self._write_profile_summary(workload)
        return "passed", RunExit.PASSED, None

    def _validate(self) -> None:
        if isinstance(self.request, str):
            raise Abort(f"refused: {self.request}", RunExit.REFUSED)
        problems = self.request.problems()
        if problems:
            raise Abort(f"refused: {'; '.join(problems)}", RunExit.REFUSED)
        super()._validate()
        if len(self.ctx.selected) != 1:
            raise Abort(f"refused: a profile takes exactly one workload (--workload ID), not "
                        f"{len(self.ctx.selected)}", RunExit.REFUSED)
        try:
            self.ncu_path = ncu.require_ncu()  # before any lease or build: a host without ncu fails at once
        except ncu.NcuError as exc:
            raise Abort(str(exc)) from None

    def _require_gate_passed(self, row: RowResult) -> None:
        if row.status == SKIPPED:
            raise Abort(f"not profiled: {row.message} (profile on a GPU host)", RunExit.FAILED, "failed")
        if row.status != PASSED:
            raise Abort(f"not profiled: workload {row.workload} is {row.status} at the correctness gate "
                        f"({row.message}); only a correct row is profiled", RunExit.FAILED, "failed")

    # ---------------------------------------------------------------- one side under ncu

    def _profile_side(self, workload: Workload, side: str) -> SideProfile:
        folder = self.raw / "ncu"
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{side}-{workload.id}"
        scratch = sandbox.make_scratch(sandbox.side_scratch(self.run_dir, side))
        report, done = folder / f"{stem}.ncu-rep", scratch / f"{stem}.call.json"  # the sandboxed target writes there
        job_path, log_path = folder / f"{stem}.job.json", folder / f"{stem}.log"
        for stale in (report, done):
            stale.unlink(missing_ok=True)
        job_path.write_text(json.dumps(self._call_job(workload, side), indent=1))
        target = [sys.executable, "-m", "kpremote.agent.run.profile", "call", "--job", str(job_path),
                  "--out", str(done)]
        command = ncu.profile_command(self.ncu_path, section_set=self.request.section_set,
                                      kernel_regex=self.request.kernel, report=report, target=target)
        self.events.emit("profile", side=side, step="ncu", command=command)
        try:
            returncode = self._run_under_ncu(command, log_path, side, {
                **sandbox.scratch_env(scratch), **side_reads(self.run_dir, side, self.ctx.spec.root)})
            ncu.check_profile(log_path.read_text(errors="replace"), returncode, report,
                              target_finished=done.is_file(), kernel_regex=self.request.kernel)
            csv_text = ncu.import_report(self.ncu_path, report)
        except BaseException as exc:
            report.unlink(missing_ok=True)  # a failed or cut-short report never stays looking like a good one
            if isinstance(exc, ncu.NcuError):
                raise Abort(f"{side}: {exc}") from None
            raise
        (folder / f"{stem}.raw.csv").write_text(csv_text)
        kernels = ncu.summarize(ncu.parse_raw_csv(csv_text))
        if not kernels:
            raise Abort(f"{side}: ncu's report {report.name} lists no kernel (see raw/ncu/{stem}.raw.csv)")
        profiled = SideProfile(side, report, report.stat().st_size, file_sha256(report), kernels)
        self.events.emit("profile", side=side, step="done", report=str(report), sha256=profiled.sha256,
                         kernels=[k.name for k in kernels])
        return profiled

    def _call_job(self, workload: Workload, side: str) -> dict[str, Any]:
        return {"task_dir": str(self.ctx.spec.root), "device": self.ctx.device, "workload": workload.id,
                "side": side, "warmup": self.request.warmup, "calls": self.request.calls,
                "modules": {s: rec.get("module") for s, rec in self.ctx.prepared["build"]["sides"].items()}}

    def _run_under_ncu(self, command: list[str], log_path: Path, side: str, scratch_env: dict[str, str]) -> int:
        with open(log_path, "ab") as log:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                     env={**self._worker_env(), **scratch_env},
                                     cwd=self.ctx.spec.root)
        try:
            return child.wait(timeout=PROFILE_LIMIT_S)
        except subprocess.TimeoutExpired:
            kill_tree(child)
            raise Abort(f"{side}: ncu did not finish within {PROFILE_LIMIT_S:g} s (log: {log_path})") from None
        except BaseException:  # Cancelled above all: ncu and the profiled process go with the run
            if child.poll() is None:
                kill_tree(child)
            raise

    # ---------------------------------------------------------------- summary

    def _write_profile_summary(self, workload: Workload) -> None:
        summary = self.run_dir / "summary"
        copy_gbps = self._copy_gbps()
        written = []
        try:
            # profile.md last: its presence says the profile is complete
            for name, text in (("profile.csv", render_profile_csv(workload.id, self.profiled, copy_gbps)),
                               ("profile.json", render_profile_json(workload.id, self.profiled, copy_gbps)),
                               ("profile.md", self._render_markdown(workload, copy_gbps))):
                written.append(summary / name)
                write_atomically(summary / name, text)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise

    def _copy_gbps(self) -> float | None:
        return ((self.ctx.prepared.get("device") or {}).get("copy_bandwidth") or {}).get("gbps")

    def _render_markdown(self, workload: Workload, copy_gbps: float | None) -> str:
        gpu = self.ctx.gpu
        facts = {
            "task": self.ctx.spec.task.name,
            "workload": workload.id,
            "run_id": self.run_dir.name,
            "host": self.options.host_alias or "",
            "hostname": os.uname().nodename,
            "gpu": f"{gpu.name} (index {gpu.index}, {gpu.uuid})" if gpu else f"none ({self.ctx.device})",
            "ncu": f"{self.ncu_path} ({ncu.ncu_version(self.ncu_path) or 'version unknown'})",
            "smoke": self.ctx.device != "cuda",
        }
        return render_profile_md(facts, self.request, self.ctx.rows[-1].to_json(), self.profiled, copy_gbps)


def main(argv: list[str]) -> int:
    if argv[:1] == ["call"]:
        return call_main(argv[1:], "python -m kpremote.agent.run.profile call", call_side)
    request, options = parse_profile_args(argv)
    return ProfileRunner(options, [sys.executable, "-m", "kpremote.agent.run.profile", *argv], request).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
