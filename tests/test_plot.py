"""The run's plot (kpremote/agent/run/plot.py): drawn when it can be, with each row's interval and share of the copy
bandwidth; when it cannot be, a sentence that says why."""

from __future__ import annotations

import subprocess
import sys

from kpremote.agent.run.plot import copy_share, draw_speedup_plot
from kpremote.agent.results import RowResult, RunResults, row_interval
from rig import REPO

PNG = b"\x89PNG\r\n\x1a\n"


def results(rows: list[dict], **more) -> RunResults:
    return RunResults.from_json({"smoke": False, "provenance": {"copy_bandwidth": {"gbps": 4000.0}}, "rows": rows,
                                 "headline": {"geomean": 1.1}, **more})


def row(workload: str, speedup: float, **more) -> dict:
    return {"workload": workload, "status": "PASSED", "speedup": speedup, "gbps": {"candidate": 2000.0}, **more}


def typed(workload: str, speedup: float, **more) -> RowResult:
    return RowResult.from_json(row(workload, speedup, **more))


def test_the_plot_is_drawn_with_intervals_and_copy_share(tmp_path):
    path = tmp_path / "speedup.png"
    rows = [row("a_long_workload_id", 1.2, verdict={"low": 1.1, "high": 1.3}), row("b", 0.9)]
    assert draw_speedup_plot(results(rows), path) is None
    assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5000


def test_intervals_and_shares_are_read_from_the_row():
    assert row_interval(typed("a", 1.2, verdict={"low": 1.1, "high": 1.3, "verdict": "FASTER"})) == (1.1, 1.3)
    assert typed("a", 1.2, verdict={"low": 1.1, "high": 1.3}).interval == (1.1, 1.3)
    assert row_interval(typed("a", 1.2, verdict={"verdict": "SAME"})) is None  # a verdict without its interval
    assert row_interval(typed("a", 1.2)) is None
    assert copy_share(typed("a", 1.2), 4000.0) == 50.0 and copy_share(typed("a", 1.2), None) is None


def test_no_plot_says_why(tmp_path):
    failed = [{"workload": "a", "status": "INCORRECT", "speedup": None}]
    assert draw_speedup_plot(results(failed), tmp_path / "p.png") == "no plot: no row passed with a speedup to show"
    assert not (tmp_path / "p.png").exists()
    # a host without matplotlib: the agent runs on, and the reason names what is missing
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from kpremote.agent.run.plot import draw_speedup_plot\n"
            "from kpremote.agent.results import RunResults\n"
            "rows = [{'workload': 'a', 'status': 'PASSED', 'speedup': 1.1}]\n"
            "print(draw_speedup_plot(RunResults.from_json({'rows': rows}), 'x.png'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(REPO)},
                         capture_output=True, text=True)
    assert out.stdout.strip().startswith("no plot: matplotlib is not installed"), out.stderr
    assert not (tmp_path / "x.png").exists()


def test_bars_are_coloured_by_verdict_not_by_which_side_of_one_they_fall(tmp_path):
    from unittest.mock import MagicMock

    from kpremote.agent.run.plot import _draw

    speed = MagicMock()
    plt = MagicMock()
    plt.subplots.return_value = (MagicMock(), [[speed]])
    rows = [typed("faster", 1.3, verdict={"verdict": "FASTER"}), typed("same_above", 1.02, verdict={"verdict": "SAME"}),
            typed("same_below", 0.98, verdict={"verdict": "SAME"}), typed("slower", 0.7, verdict={"verdict": "SLOWER"}),
            typed("no_verdict", 1.5), typed("smoke", 1.5, smoke=True, verdict={"verdict": "FASTER"})]
    _draw(plt, RunResults(rows=rows), rows, tmp_path / "p.png")
    assert speed.barh.call_args.kwargs["color"] == ["tab:green", "tab:gray", "tab:gray", "tab:red", "tab:gray",
                                                    "tab:gray"]


def test_results_md_says_why_there_is_no_plot_once(tmp_path):
    from kpremote.agent.run.resultsmd import render_results_md

    failed = results([{"workload": "a", "status": "INCORRECT", "speedup": None}], status="failed", exit_code=1,
                     headline={"note": "no rows"})
    markdown = render_results_md(failed, plot_missing=draw_speedup_plot(failed, tmp_path / "p.png"))
    assert "No plot: no row passed with a speedup to show" in markdown and "no plot: no plot" not in markdown.lower()


def test_a_smoke_run_draws_no_plot_and_a_real_runs_summary_carries_one(tmp_path):
    from kpremote.agent.run.report import write_summary

    rows = [row("a", 1.2, verdict={"low": 1.1, "high": 1.3})]
    assert draw_speedup_plot(results(rows, smoke=True), tmp_path / "smoke.png") == \
        "no plot: a smoke run's timings are not meaningful"
    assert not (tmp_path / "smoke.png").exists()
    run_dir = tmp_path / "run"
    (run_dir / "summary").mkdir(parents=True)
    write_summary(run_dir, results(rows, status="passed", exit_code=0,
                                   headline={"geomean": 1.2, "low": 1.1, "high": 1.3, "n": 1, "of": 1}), [])
    assert (run_dir / "summary" / "speedup.png").read_bytes().startswith(PNG)
    assert "No plot" not in (run_dir / "summary" / "results.md").read_text()
