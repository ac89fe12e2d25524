"""`inv history --task T`: every fetched run of a task, oldest first, with its commit and headline; and a plot of the
headline over time (its interval as an error bar, each point labelled with its commit), smoke runs set apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .ledger import lines_by_run
from .runstore import FetchedRun, fetched_runs


def history_document(kernels: Path, task: str, host: Optional[str], plot: Optional[Path]) -> dict[str, Any]:
    """inv history's document (docs/schemas/history.json): every fetched run of the task (on host, if given) with
    the command line its ledger line recorded, and the plot drawn at plot (default: kernels/TASK/results/history.png)
    or why it was not."""
    recorded = lines_by_run(kernels / task)
    entries = [history_entry(run, recorded.get((run.host, run.run_id))) for run in fetched_runs(kernels, task, host)]
    path = plot or kernels / task / "results" / "history.png"
    note = draw_history_plot(entries, path, task) if entries else "no plot: no fetched runs"
    return {"task": task, "host": host, "runs": entries, "plot": None if note else str(path), "plot_note": note}


def history_entry(run: FetchedRun, ledger_line: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One fetched run; with its ledger line (ledger.py), the command line that brought it. A run whose record does
    not verify shows no number: "record" says why, and its headline is null."""
    head = run.headline
    numbers = {"geomean": head.geomean, "low": head.low, "high": head.high, "n": head.n, "of": head.of,
               "note": head.note, "regime": head.regime,
               # the headline's geomean in each context regime (harness 2.18 on; rows that name a context)
               "regimes": {name: {key: part.get(key) for key in ("geomean", "low", "high", "n", "of")}
                           for name, part in (head.regimes or {}).items() if isinstance(part, dict)} or None}
    if run.record:
        numbers = {key: None for key in numbers}
    return {"host": run.host, "run_id": run.run_id, "started": run.started, "commit": run.commit, "dirty": run.dirty,
            "candidate_sha256": run.candidate_sha256, "task_digest": run.task_digest, "task_state": run.task_state,
            "status": run.status, "smoke": run.smoke, **numbers,
            "path": str(run.path), "command": (ledger_line or {}).get("command"), "record": run.record}


def commit_label(entry: dict[str, Any]) -> str:
    commit = entry.get("commit")
    return (commit[:10] + ("*" if entry.get("dirty") else "")) if commit else "no commit"


def draw_history_plot(entries: list[dict[str, Any]], path: Path, task: str) -> Optional[str]:
    """The headline of each run over time into path (PNG): None when drawn, else why not."""
    points = [e for e in entries if e.get("geomean")]
    if not points:
        return "no plot: no run has a headline"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(points) + 2), 4.0))
    for smoke, color, label in ((False, "tab:blue", "GPU run"), (True, "tab:gray", "smoke run (not meaningful)")):
        chosen = [(i, e) for i, e in enumerate(points) if bool(e.get("smoke")) == smoke]
        if not chosen:
            continue
        xs = [i for i, _ in chosen]
        ys = [e["geomean"] for _, e in chosen]
        errors = [[e["geomean"] - (e.get("low") or e["geomean"]) for _, e in chosen],
                  [(e.get("high") or e["geomean"]) - e["geomean"] for _, e in chosen]]
        axes.errorbar(xs, ys, yerr=errors, fmt="o", color=color, capsize=3, label=label)
    axes.plot(range(len(points)), [e["geomean"] for e in points], color="lightgray", linewidth=0.8, zorder=0)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(points)),
                    [f"{commit_label(e)}\n{e['run_id'][-6:]} {e['started'][:10]}" for e in points],
                    rotation=45, ha="right", fontsize=7)
    axes.set_ylabel("headline: geometric-mean speedup")
    axes.set_title(f"{task}: headline per run (95 % interval)", fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None
