"""The runner's audit step (Runner, runner.py): after the rows, each timed production row re-measured by Nsight
Compute (ncu/audit.py), a row whose numbers disagree made invalid, and what the audited calls wrote judged into it."""

from __future__ import annotations

import os
from typing import Any

from ..harness.correctness import INCORRECT, PASSED
from ..results import RowResult, RowTiming


class AuditStep:
    """Methods of Runner: they read its ctx (RunContext), options, run_dir and raw, and emit its events."""

    def _audit(self) -> None:
        """The outside cross-check: each timed production row re-measured by Nsight Compute (audit.py).

        The hook: audit.audit_row(request) -> {"harness_us", "ncu_us", "agree", "tolerance", ...}; a row whose
        numbers disagree is invalid (left out of the headline, the run fails) and shows both numbers.
        """
        self.ctx.audit = self._audit_status()
        if self.ctx.audit != "on":
            return
        from ..ncu import audit

        rows = [r for r in self.ctx.rows if r.production and r.status == PASSED and r.timing]
        if rows:
            self._phase("audit")
        for row in rows:
            try:
                row.audit = audit.audit_row(self._audit_request(row))
            except Exception as exc:  # noqa: BLE001 - an audit that cannot run leaves the row unconfirmed
                row.audit = {"agree": None, "error": f"{type(exc).__name__}: {exc}"}
                row.invalid = "; ".join(filter(None, [row.invalid, f"audit failed: {exc}"]))
                continue
            found = row.audit
            if found.get("agree") is False:
                row.invalid = "; ".join(filter(None, [row.invalid, (
                    f"audit: the harness measured {found.get('harness_us')} us, Nsight Compute {found.get('ncu_us')} us "
                    f"(tolerance {found.get('tolerance')})")]))
            _judge_audited_outputs(row)
            _mark_unverified(row, audit.unverified_share(found))
            self.events.emit("audit", workload=row.workload,
                             **{k: v for k, v in found.items() if k in ("harness_us", "ncu_us", "agree", "tolerance")})

    def _audit_status(self) -> str:
        if self.ctx.device != "cuda":
            return "unaudited: CPU run"
        if self.options.audit == "off":
            return "unaudited: --no-audit"
        import importlib.util

        if importlib.util.find_spec("kpremote.agent.ncu.audit") is None:
            return "unaudited: audit module missing"
        from ..ncu import ncu

        if ncu.find_ncu(dict(os.environ)) is None:
            return "unaudited: ncu not found"
        return "on"

    def _audit_request(self, row: RowResult) -> dict[str, Any]:
        timing = row.timing or RowTiming()
        return {
            "task_dir": str(self.ctx.spec.root), "run_dir": str(self.run_dir), "raw_dir": str(self.raw / "audit"),
            "workload": row.workload, "params": row.params, "mode": timing.mode,
            "calls_per_sample": timing.calls_per_sample,
            "harness_us": {side: stats.median if (stats := getattr(timing, side)) else None
                           for side in ("baseline", "candidate")},
            "modules": {side: rec.get("module") for side, rec in self.ctx.prepared["build"]["sides"].items()},
            "gpu": self.ctx.gpu.to_json() if self.ctx.gpu else None, "env": self._worker_env(),
            "device": self.ctx.device, "empty_window_us": self._empty_window_us(),
        }

    def _empty_window_us(self) -> float | None:
        """The least an empty call's event pair read in this run's device probe (before any task code ran), or None:
        a stalled host only lengthens such a window (deviceprobe.empty_window)."""
        probe = (self.ctx.prepared or {}).get("device") or {}
        value = (probe.get("empty_window") or {}).get("min_us")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _judge_audited_outputs(row: RowResult) -> None:
    """What the audited calls wrote (audit.check_outputs) judged like a timed call's: a candidate whose audited
    calls computed something else is INCORRECT (it does other work when measured by ncu); a baseline that did
    voids the row, as a baseline that fails elsewhere does."""
    outputs = (row.audit or {}).get("outputs") or {}
    baseline, candidate = outputs.get("baseline") or {}, outputs.get("candidate") or {}
    if baseline.get("ok") is False:
        row.invalid = "; ".join(filter(None, [row.invalid, f"audit: {baseline.get('message')}"]))
    elif candidate.get("ok") is False:
        row.status, row.message, row.speedup = INCORRECT, f"audit: {candidate.get('message')}", None


def _mark_unverified(row: RowResult, blind_spot_pct: float | None) -> None:
    """A row whose audit could not have seen a 5 % forge of the candidate's window says how large one could be, on
    its verdict (a FASTER there reads FASTER (unverified): results.RowResult.verdict_word)."""
    if blind_spot_pct is not None and row.verdict is not None:
        row.verdict.forge_blind_spot_pct = blind_spot_pct
