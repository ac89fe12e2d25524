"""A run's results.md, drawn from its results.json record (results.RunResults, report.build_results): the task's
banner when it is not its pin, the run's context (where, on what, measured how, by which harness), the rows' table,
their statistics, regimes and numerical contract, and the headline. results.md carries the harness digest on a line
of its own, so a task's docs/results.md measured by an older harness, or against a changed bench, says so
(harness_staleness, pinned_staleness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import harness
from ..harness import numerics
from ..harness.rowlog import LOG_CAP_BYTES
from ..results import (COLD_REGIME, CONTEXT_REGIMES, HEADLINE_LEVEL, REGIME_WORDS, Headline, RowResult, RunResults,
                       SideStats)

# Row keys that describe the workload rather than its shape; left out of the table's shape column.
NOT_SHAPE = {"id", "production", "preset", "atol", "rtol", "seed", "note", "notes", "function", "source", "contract",
             "context"}


def task_banner(results: RunResults) -> list[str]:
    """results.md's lines for a run that did not measure the pinned task (docs/trust.md, "The sealed task")."""
    pin = results.part("task_pin")
    if results.task_state == "edited":
        return [f"> **TASK EDITED** — this run measured a task that is not its pin (the project's HEAD commit): "
                f"{', '.join(pin.get('changed') or ['?'])}. Its numbers are not the pinned task's.", ""]
    if results.task_state == "unpinned":
        return ["> **TASK UNPINNED** — no commit holds this task, so nothing says what it was measured against "
                f"but its digest ({str(pin.get('digest'))[:12]}).", ""]
    return []


def render_results_md(results: RunResults, plot_missing: str | None = "not drawn") -> str:
    """plot_missing: why there is no speedup.png beside results.md, or None when there is one (then it is embedded)."""
    prov = results.provenance
    lines = [f"# {results.part('task').get('name', '?')}: results", ""]
    if results.smoke:
        lines += ["> **SMOKE RUN** — CPU only (Triton interpreter): every timing below is meaningless; this run",
                  "> checks that the task builds, runs and is correct, nothing more.", ""]
    lines += task_banner(results)
    if results.unsandboxed:
        lines += [f"> **UNSANDBOXED** — the sides ran without the whole sandbox ({results.unsandboxed}): a side "
                  "could have reached files and processes that shape the verdict.", ""]
    lines += [f"Status: **{results.status}** (exit code {results.exit_code})"]
    if results.message:
        lines += ["", f"> {results.message}"]
    lines += ["", *_context_lines(prov), ""]
    rows = results.rows
    if rows:
        lines += _row_table(rows, _copy_gbps(prov)) + [""]
        lines += _statistics_table(rows)
        lines += _regimes_table(rows)
        lines += _contract_table(rows)
        notes = [f"- `{r.workload}`: {_row_note(r)}" for r in rows if _row_note(r)]
        if notes:
            lines += ["Notes:", "", *notes, ""]
        lines += [f"- {r.context_note}" for r in rows if r.context_note and not r.smoke]
        lines += [""] if any(r.context_note and not r.smoke for r in rows) else []
    lines += [_headline_line(results.headline), ""]
    in_context = _regime_headline_lines(results.headline)
    lines += [*in_context, ""] if in_context else []
    lines += ["![speedup per row, with its 95 % interval and % of copy bandwidth](speedup.png)" if plot_missing is None
              else f"No plot: {plot_missing.removeprefix('no plot: ')}", ""]
    return "\n".join(lines)


def _context_lines(prov: dict[str, Any]) -> list[str]:
    gpu = prov.get("gpu") or {}
    versions = prov.get("versions") or {}
    build = prov.get("build") or {}
    copy = prov.get("copy_bandwidth") or {}
    source = prov.get("source") or {}
    host = prov.get("host") or {}
    where = host.get("alias") or host.get("hostname") or "?"
    device = f"{gpu.get('name')} (CC {_cc(gpu.get('cc'))}, {gpu.get('uuid')})" if gpu else prov.get("device", "?")
    lines = [
        f"- host: {where} ({host.get('hostname')}), device: {device}",
        f"- build: {build.get('kind')} via {build.get('builder')}, flags {build.get('flags', [])}",
        "- toolchain: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        f"- timing: mode {prov.get('mode')}; " + ", ".join(f"{k} {v}" for k, v in (prov.get("timing_settings") or {}).items()
                                                          if k != "mode"),
    ]
    states = [(label, prov.get(key)) for label, key in (("before", "gpu_before"), ("after", "gpu_after"))]
    described = [f"{label} {_gpu_state(state)}" for label, state in states if state]
    if described:
        lines.append("- GPU state " + "; ".join(described))
    if copy.get("gbps"):
        fastest = f"; its fastest copy {_number(copy['best_gbps'])} GB/s, what the floor holds rows to" \
            if copy.get("best_gbps") else ""
        lines.append(f"- device-to-device copy bandwidth: {_number(copy['gbps'])} GB/s (bytes read + written{fastest})")
    if source:
        commit = source.get("git_commit")
        where = f"commit {commit}{' (dirty)' if source.get('git_dirty') else ''}" if commit else "no git commit"
        lines.append(f"- source: {where}; solution sha256 {source.get('solution_sha256')}")
    task_pin = results_task_pin(prov)
    if task_pin:
        lines.append(task_pin)
    pinned = prov.get("pinned") or {}
    if pinned:
        lines.append(f"{PINNED_LINE_PREFIX} {pinned.get('bench_sha256')}; task.toml sha256 "
                     f"{pinned.get('task_toml_sha256')}")
    if prov.get("gpu_readings") or prov.get("audit"):
        lines.append(f"- GPU readings from: {prov.get('gpu_readings')}; audit: {prov.get('audit')}")
    if prov.get("sandbox"):
        box = prov["sandbox"]
        lines.append(f"- sandbox: {box.get('level')} (Landlock ABI {box.get('landlock_abi')}, seccomp "
                     f"{'yes' if box.get('seccomp') else 'no'}, PID namespace {'yes' if box.get('pid_namespace') else 'no'})")
    probe = prov.get("l2_flush_probe") or {}
    if probe:
        what = "copy" if probe.get("method") == "copy" else "re-read"
        lines.append(f"- L2 flush probe: {what} {probe.get('warm_us')} us warm, {probe.get('flushed_us')} us flushed "
                     f"({'evicts' if probe.get('evicts') else 'DOES NOT EVICT'}); persisting-L2 reset "
                     f"{probe.get('persisting_reset')}")
    record = prov.get("harness") or {}
    if record:
        lines.append(harness_line(record))
    return lines


def results_task_pin(prov: dict[str, Any]) -> str | None:
    """results.md's line naming the task measured: its digest, and whether that is its pin."""
    pin = prov.get("task_pin")
    if not isinstance(pin, dict):
        return None
    state = {"pinned": "the pinned task (HEAD)", "edited": "TASK EDITED: not its pin " + str(pin.get("pin")),
             "unpinned": "TASK UNPINNED: no commit holds it"}.get(str(pin.get("state")), str(pin.get("state")))
    return f"- task digest {pin.get('digest')}: {state}"


HARNESS_LINE_PREFIX = "- harness: kpremote agent"
PINNED_LINE_PREFIX = "- pinned: bench/ sha256"


def pinned_staleness(results_md: str, task_dir: Path) -> list[str]:
    """Sentences for each pinned input (bench/, task.toml) that changed since results.md was measured."""
    now = harness.pinned_inputs(task_dir)
    for line in results_md.splitlines():
        if line.startswith(PINNED_LINE_PREFIX):
            words = line[len(PINNED_LINE_PREFIX):].replace(";", " ").split()
            then = {"bench_sha256": words[0] if words else None, "task_toml_sha256": words[-1] if len(words) > 1 else None}
            return [f"{label} changed since these results were measured ({then[key][:12]} -> {(now[key] or 'none')[:12]})"
                    for key, label in (("bench_sha256", "bench/"), ("task_toml_sha256", "task.toml"))
                    if then[key] and then[key] != now[key]]
    return ["bench/ and task.toml were not recorded with these results"]


def harness_line(record: dict[str, Any]) -> str:
    return f"{HARNESS_LINE_PREFIX} {record.get('version')}, digest {record.get('digest')}"


def harness_staleness(results_md: str, current: dict[str, Any] | None = None) -> str | None:
    """None when results.md was measured by this very harness; else a sentence saying it was not."""
    current = current or harness.harness_record()
    for line in results_md.splitlines():
        if line.startswith(HARNESS_LINE_PREFIX):
            words = line[len(HARNESS_LINE_PREFIX):].replace(",", " ").split()
            version, digest = (words[0] if words else "?"), (words[-1] if len(words) >= 3 else "?")
            if digest == current["digest"]:
                return None
            return (f"measured by an older harness (version {version}, digest {digest[:12]}; this one is "
                    f"{current['version']}, {current['digest'][:12]})")
    return f"measured by an older harness (no harness digest recorded; this one is {current['version']})"


def _gpu_state(state: dict[str, Any]) -> str:
    clock = f"SM {state.get('sm_clock_mhz')}/{state.get('sm_clock_max_mhz')} MHz"
    reasons = f" ({', '.join(state['clock_event_reasons'])})" if state.get("clock_event_reasons") else ""
    return (f"{state.get('memory_used_mib')} MiB used, util {state.get('util_pct')} %, {state.get('temperature_c')} °C, "
            f"{state.get('power_w')} W, {clock}{reasons}, {len(state.get('processes') or [])} processes")


def _row_table(rows: list[RowResult], copy_gbps: float | None) -> list[str]:
    lines = [
        "| workload | shape | prod | status | baseline µs median (p10–p90) | candidate µs median (p10–p90) "
        "| speedup (95 % interval) | verdict | GB/s | % of copy BW |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        # Bandwidth is only worth showing for a row whose timing stands.
        gbps = (row.gbps or {}).get("candidate") if row.speedup else None
        percent = f"{_number(100 * gbps / copy_gbps)} %" if gbps and copy_gbps else "–"
        interval = row.interval
        speedup = f"{row.speedup:.3f}×" if row.speedup else "–"
        if row.speedup and interval:
            speedup += f" ({interval[0]:.3f}–{interval[1]:.3f})"
        shown_verdict = row.verdict_word if row.speedup and not row.smoke else None
        lines.append(
            f"| `{row.workload}` | {_shape(row.params or {})} | {'yes' if row.production else ''} "
            f"| {_status_cell(row)} | {_side_cell(row.side('baseline'))} | {_side_cell(row.side('candidate'))} "
            f"| {speedup} | {shown_verdict or '–'} | {_number(gbps) if gbps else '–'} | {percent} |"
        )
    return lines


STATISTICS = ("n", "median", "mean", "std", "min", "p10", "p90")


def _statistics_table(rows: list[RowResult]) -> list[str]:
    """Every timed row's samples per side as the task rule sheet asks a claim to report them: median, mean, std,
    min, p10 and p90 (µs, with the sample count, as the judge summarized them); none when no row was timed."""
    timed = [(row.workload, side, row.side(side)) for row in rows for side in SIDES_SHOWN]
    timed = [(workload, side, summary) for workload, side, summary in timed if summary]
    if not timed:
        return []
    lines = ["Timing statistics per workload (µs per call):", "",
             "| workload | side | " + " | ".join(STATISTICS) + " |", "|---|---|" + "---:|" * len(STATISTICS)]
    for workload, side, summary in timed:
        cells = [str(summary.n)] + [_number(getattr(summary, k)) if getattr(summary, k) is not None else "–"
                                    for k in STATISTICS[1:]]
        lines.append(f"| `{workload}` | {side} | " + " | ".join(cells) + " |")
    return lines + [""]


SIDES_SHOWN = ("baseline", "candidate")


def _regimes_table(rows: list[RowResult]) -> list[str]:
    """Each row that names a context in its three regimes (harness/regimes.py): cold (alone, L2 flushed before every
    sample: the headline's), warm (alone, its inputs as the model's previous op leaves them), context (between the
    model's neighbours, one CUDA graph per side): each side's median, the speedup, its interval and verdict."""
    shown = [row for row in rows if row.regimes is not None]
    if not shown:
        return []
    lines = ["Regimes of the rows with a context (bench/context.py): cold = alone, L2 flushed (the headline's); "
             "warm = alone, its inputs as the model's previous op leaves them; context = the previous op, the kernel "
             "and the next op, one CUDA graph per side (µs of the whole graph):", "",
             "| workload | context | regime | baseline µs median (p10–p90) | candidate µs median (p10–p90) "
             "| speedup (95 % interval) | verdict |", "|---|---|---|---|---|---|---|"]
    for row in shown:
        for regime in (COLD_REGIME, *CONTEXT_REGIMES):
            part = row.regime(regime)
            if part is None:
                continue
            speedup = f"{part.speedup:.3f}×" if part.speedup else "–"
            verdict = part.verdict
            if part.speedup and verdict is not None and verdict.low and verdict.high:
                speedup += f" ({verdict.low:.3f}–{verdict.high:.3f})"
            word = row.regime_word(regime) if part.speedup and not row.smoke else None
            lines.append(f"| `{row.workload}` | {row.regimes.name} | {regime} | {_side_cell(part.side('baseline'))} "
                         f"| {_side_cell(part.side('candidate'))} | {speedup} | {word or '–'} |")
    return lines + [""]


def _regime_headline_lines(head: Headline) -> list[str]:
    """The headline's geomean in each context regime, over the production rows that name a context."""
    lines = []
    for regime, part in (head.regimes or {}).items():
        if not isinstance(part, dict) or not part.get("geomean"):
            continue
        counts = part.get("verdicts") or {}
        rows = f" — rows {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}" if counts else ""
        lines.append(f"In the {regime} regime ({REGIME_WORDS.get(regime, regime)}): geometric-mean speedup "
                     f"**{part['geomean']:.3f}×** over {part.get('n')} of {part.get('of')} production rows with a "
                     f"context, {int(100 * (head.level or HEADLINE_LEVEL))} % interval {part['low']:.3f}–"
                     f"{part['high']:.3f}{rows}")
    return lines


def _contract_table(rows: list[RowResult]) -> list[str]:
    """Each row's numerical contract (harness/numerics.py): its worst ratios over the checked cases, bitwise
    equality where the row is exact, or why it was not checked; none for rows judged before the contract."""
    shown = [(row.workload, (row.correctness or {}).get("numerics")) for row in rows]
    shown = [(workload, record) for workload, record in shown if record]
    if not shown:
        return []
    lines = [f"Numerical contract per workload (against float64, the candidate's error over the baseline's: at most "
             f"{numerics.ERROR_RATIO}x on RMS and max, mean error at most {numerics.BIAS_IN_RMS} of RMS; or exact):", "",
             "| workload | contract | worst over the checked cases |", "|---|---|---|"]
    for workload, record in shown:
        cell = (numerics.summary(record) or "–").replace("|", "/").replace("\n", " ")  # a reason quotes task text
        lines.append(f"| `{workload}` | {record.get('contract')} | {cell} |")
    return lines + [""]


def _status_cell(row: RowResult) -> str:
    if row.implausible:
        return f"{row.status} (implausible)"
    if row.invalid:
        return f"{row.status} (invalid)"
    return row.status


def _row_note(row: RowResult) -> str | None:
    # The smoke label is the banner's business, not every row's.
    held = f"SAME: {row.verdict.held}" if row.verdict and row.verdict.held else None
    dropped = row.log_dropped_bytes
    cut = (f"its output was cut: raw/workloads/{row.workload}.log keeps the first {LOG_CAP_BYTES} bytes, at least "
           f"{dropped} more were dropped" if isinstance(dropped, int) and dropped > 0 else None)
    parts = [text for text in (row.message, row.invalid, held, row.unverified, cut) if text]
    return "; ".join(dict.fromkeys(parts)) or None


def _side_cell(side: SideStats | None) -> str:
    if side is None:
        return "–"
    return f"{_number(side.median)} ({_number(side.p10)}–{_number(side.p90)})"  # type: ignore[arg-type]


def _number(value: float) -> str:
    """Three significant digits without exponents: 0.0123, 1.23, 123, 4,054."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _shape(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if k not in NOT_SHAPE).replace("|", "/") or "–"


def _cc(cc: Any) -> str:
    return ".".join(map(str, cc)) if cc else "?"


def _copy_gbps(prov: dict[str, Any]) -> float | None:
    return (prov.get("copy_bandwidth") or {}).get("gbps")


def _headline_line(head: Headline) -> str:
    label = f" — {head.label}" if head.label else ""
    if head.geomean is None:
        return f"**Headline:** none ({head.note or 'no rows'}){label}"
    if head.verdicts:
        label = f" — rows {', '.join(f'{n} {k}' for k, n in sorted(head.verdicts.items()))}{label}"
    return (
        f"**Headline:** geometric-mean speedup **{head.geomean:.3f}×** over {head.n} of {head.of} production "
        f"rows{headline_regime(head)}, {int(100 * (head.level or HEADLINE_LEVEL))} % interval {head.low:.3f}–"
        f"{head.high:.3f}{label}"
    )


def headline_regime(head: Headline) -> str:
    """" in the cold regime (alone, L2 flushed)": which regime a headline is computed from; "" for a headline of a
    harness before 2.18 (every row was timed cold then)."""
    if not head.regime:
        return ""
    flushed = ", L2 flushed" if head.regime == COLD_REGIME else ""
    return f" in the {head.regime} regime ({REGIME_WORDS.get(head.regime, head.regime)}{flushed})"
