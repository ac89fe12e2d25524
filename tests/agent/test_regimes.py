"""A row's regimes as numbers and words (issue 45 item 1): each regime's verdict by the row's own rule, the headline's
regime and its geomean in each context regime, the one line for a row FASTER alone but not in its context, and what
results.md, the run's events, the results view, compare, history and the ledger make of them. GPU-like rows are built
here the way the judge builds them (stats.row_verdict over each regime's pooled samples and its four process pairs)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
from rich.console import Console

from kpremote.agent.harness import stats
from kpremote.agent.results import RowResult, RunResults
from kpremote.agent.run import events, report, resultsmd, runner
from kpremote.results.compare import compare_rows, compare_regimes
from kpremote.results.ledger import ledger_entry
from kpremote.views.results import results_view
from kpremote.views.run import row_pieces

REPO = Path(__file__).resolve().parents[2]
PAIRS = 4


def timed(baseline_us: float, candidate_us: float, mode: str, seed: int, n: int = 200) -> tuple[dict, dict, dict]:
    """(timing, verdict, samples) of one regime of one row: n samples a side with 1 % noise, four process pairs."""
    rng = random.Random(seed)
    samples = {"baseline": [baseline_us * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(n)],
               "candidate": [candidate_us * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(n)]}
    quarter = n // PAIRS
    pairs = [(stats.median(samples["baseline"][k * quarter:(k + 1) * quarter]),
              stats.median(samples["candidate"][k * quarter:(k + 1) * quarter])) for k in range(PAIRS)]
    medians = {side: stats.median(values) for side, values in samples.items()}
    verdict = stats.row_verdict(samples["baseline"], samples["candidate"], pair_medians=pairs,
                                process_floor_us=stats.process_floor_us(PAIRS))
    timing = {"mode": mode, "baseline": {"n": n, "median": medians["baseline"], "p10": 0.0, "p90": 0.0},
              "candidate": {"n": n, "median": medians["candidate"], "p10": 0.0, "p90": 0.0},
              "speedup": medians["baseline"] / medians["candidate"]}
    return timing, verdict, samples


def gpu_row(workload: str, cold: tuple[float, float], warm: tuple[float, float] | None = None,
            context: tuple[float, float] | None = None, seed: int = 0) -> tuple[dict, dict]:
    """A PASSED GPU row (as the runner records it) and its samples per regime; context rows when warm/context given."""
    timing, verdict, samples = timed(*cold, "cold", seed)
    row: dict[str, Any] = {"workload": workload, "production": True, "status": "PASSED", "smoke": False,
                           "timing": timing, "verdict": verdict, "speedup": timing["speedup"]}
    all_samples = {"cold": samples}
    if warm and context:
        row["regimes"] = {"name": "block", "headline": "cold"}
        for number, (regime, times) in enumerate((("warm", warm), ("context", context)), start=1):
            part_timing, part_verdict, part_samples = timed(*times, regime, seed + 100 * number)
            row["regimes"][regime] = {"timing": part_timing, "speedup": part_timing["speedup"],
                                      "verdict": part_verdict}
            all_samples[regime] = part_samples
    return row, all_samples


def run_of(rows_and_samples: list[tuple[dict, dict]]) -> RunResults:
    rows = [row for row, _ in rows_and_samples]
    samples = {row["workload"]: s["cold"] for row, s in rows_and_samples}
    regime_samples: dict[str, dict] = {}
    for row, s in rows_and_samples:
        for regime in ("warm", "context"):
            if regime in s:
                regime_samples.setdefault(regime, {})[row["workload"]] = s[regime]
    return report.build_results(provenance={"task": {"name": "t"}, "device": "cuda"},
                                rows=[RowResult.from_json(row) for row in rows], samples=samples,
                                regime_samples=regime_samples, status="passed", exit_code=0, message=None,
                                smoke=False)


# A 4.3 us row 1.2x faster alone whose win vanishes in its context (issue 45's qwen_s19), a 16 us row faster in every
# regime, and a row without a context.
VANISHING = gpu_row("qwen_s19", cold=(5.15, 4.30), warm=(4.10, 4.10), context=(38.0, 38.0), seed=1)
LASTING = gpu_row("qwen_s4096", cold=(16.0, 13.3), warm=(15.0, 12.5), context=(90.0, 87.0), seed=2)
ALONE = gpu_row("wan", cold=(200.0, 190.0), seed=3)


def test_each_regime_gets_its_own_verdict_by_the_rows_rule() -> None:
    results = run_of([VANISHING, LASTING, ALONE])
    rows = results.by_workload()
    assert [rows["qwen_s19"].regime_word(r) for r in ("cold", "warm", "context")] == ["FASTER", "SAME", "SAME"]
    assert [rows["qwen_s4096"].regime_word(r) for r in ("cold", "warm", "context")] == ["FASTER", "FASTER", "FASTER"]
    assert rows["wan"].regime("context") is None and rows["wan"].regime_word("warm") is None
    # every regime's verdict carries the same process floor as the row's (four pairs: 0.15 us)
    assert {rows["qwen_s19"].regime(r).verdict.process_floor_us for r in ("cold", "warm", "context")} == {0.15}


def test_the_headline_is_the_cold_regimes_and_says_so_with_each_context_regime_beside_it() -> None:
    head = run_of([VANISHING, LASTING, ALONE]).headline
    assert head.regime == "cold" and head.n == 3 and head.verdicts == {"FASTER": 3}
    speedups = [row["speedup"] for row, _ in (VANISHING, LASTING, ALONE)]
    assert abs(head.geomean - stats.geomean(speedups)) < 1e-12
    context = head.regimes["context"]
    assert (context["n"], context["of"]) == (2, 2)  # the rows that name a context, not the one that does not
    context_speedups = [row["regimes"]["context"]["speedup"] for row, _ in (VANISHING, LASTING)]
    assert abs(context["geomean"] - stats.geomean(context_speedups)) < 1e-12
    assert context["low"] < context["geomean"] < context["high"]
    assert context["verdicts"] == {"SAME": 1, "FASTER": 1} and head.regimes["warm"]["verdicts"] == context["verdicts"]
    assert "regimes" not in run_of([ALONE]).headline.to_json()  # no row with a context: no such field


def test_a_row_faster_alone_but_not_in_its_context_says_so_in_one_line() -> None:
    rows = run_of([VANISHING, LASTING, ALONE]).by_workload()
    context = rows["qwen_s19"].regime("context").speedup
    assert rows["qwen_s19"].context_note == (f"qwen_s19: FASTER alone ({rows['qwen_s19'].speedup:.2f}x), SAME in its "
                                             f"context ({context:.3f}x): the win does not reach the model")
    assert rows["qwen_s4096"].context_note is None and rows["wan"].context_note is None


def test_no_regime_speedup_stands_where_the_rows_does_not() -> None:
    row = RowResult.from_json({**VANISHING[0], "status": "INCORRECT", "speedup": None})
    assert row.regime("context").speedup is None and row.context_note is None


def test_results_md_shows_the_regimes_the_line_and_the_headlines_regime() -> None:
    markdown = resultsmd.render_results_md(run_of([VANISHING, LASTING, ALONE]), plot_missing="not drawn")
    rows = run_of([VANISHING, LASTING, ALONE]).by_workload()
    for regime in ("cold", "warm", "context"):
        part = rows["qwen_s19"].regime(regime)
        assert (f"| `qwen_s19` | block | {regime} | " in markdown
                and f"{part.speedup:.3f}× ({part.verdict.low:.3f}–{part.verdict.high:.3f}) | "
                    f"{rows['qwen_s19'].regime_word(regime)} |" in markdown), markdown
    assert f"- {rows['qwen_s19'].context_note}" in markdown.splitlines()
    assert "production rows in the cold regime (alone, L2 flushed), 95 % interval" in markdown
    assert "In the context regime (in its context): geometric-mean speedup **" in markdown
    assert "| `wan` | block |" not in markdown


def test_the_results_view_shows_each_context_regime_and_the_line() -> None:
    console = Console(width=140, color_system=None, record=True, file=io.StringIO())
    results = run_of([VANISHING, LASTING, ALONE])
    console.print(results_view(results, 140), crop=False)
    text = console.export_text()
    [line] = [line for line in text.splitlines() if line.startswith("qwen_s19 ")]
    assert f"{results.by_workload()['qwen_s19'].regime('context').speedup:.3f}x SAME" in line, text
    assert results.by_workload()["qwen_s19"].context_note in text.replace("\n", " ")
    assert "in the cold regime (alone)" in text and "context regime (in its context):" in text


def test_the_row_event_and_its_line_carry_the_regimes() -> None:
    event = events.row_event(RowResult.from_json(VANISHING[0]), 1, 3)
    schema = json.loads((REPO / "docs" / "schemas" / "run-event.json").read_text())
    jsonschema.Draft202012Validator(schema).validate({**event, "schema": "kpremote.run-event/1", "event": "row",
                                                      "host": "h", "task": "t", "run_id": "r", "t": 0.0})
    assert event["regimes"]["context"]["verdict"] == "SAME" and event["context_note"].startswith("qwen_s19: FASTER")
    text = "".join(piece for piece, _ in row_pieces({**event, "verdict": "FASTER"}))
    assert "context " in text and "SAME in its context" in text and "the win does not reach the model" in text
    assert "regimes" not in events.row_event(RowResult.from_json(ALONE[0]), 3, 3)


def test_compare_and_the_ledger_carry_each_regime() -> None:
    before = RowResult.from_json(VANISHING[0])
    after = RowResult.from_json(gpu_row("qwen_s19", cold=(5.15, 4.30), warm=(4.10, 4.10), context=(38.0, 34.0),
                                        seed=7)[0])
    regimes = compare_regimes(before, after)
    assert regimes["context"]["verdict"] == "FASTER" and regimes["warm"]["verdict"] == "SAME"
    assert compare_rows(before, after)["verdict"] == "SAME"  # alone nothing changed; in its context it did
    assert compare_regimes(before, RowResult.from_json(ALONE[0])) == {}
    line = ledger_entry(run_of([VANISHING, ALONE]), "h200", 0, ["inv", "run"])
    assert line["rows"]["qwen_s19"]["regimes"]["context"]["verdict"] == "SAME" and "regimes" not in line["rows"]["wan"]
    assert line["headline"]["regime"] == "cold" and line["headline"]["regimes"]["context"]["n"] == 1


def test_the_judge_judges_a_regime_over_its_process_pairs_by_the_rows_rule() -> None:
    """Judge._verdict on a regime's pooled timing: four pairs, the 0.15 us floor, and a change only where 3 of 4
    pairs read it (here the pooled samples read FASTER, but two pairs read the candidate slower: SAME, held)."""
    import types

    from kpremote.agent.harness import timing
    from kpremote.agent.harness.judge import Judge

    rng = random.Random(5)
    pairs = []
    for base, cand, n in ((10.0, 8.0, 60), (10.0, 8.0, 60), (10.0, 10.3, 40), (10.0, 10.3, 40)):
        sides = [timing.SideSamples(name, times_us=[us * (1 + 0.002 * rng.gauss(0, 1)) for _ in range(n)])
                 for name, us in (("baseline", base), ("candidate", cand))]
        pairs.append(timing.PairTiming("context", 1, sides[0], sides[1], "converged", "on"))
    pooled = timing.pooled(pairs)
    medians = {side: getattr(pooled, side).summary().median for side in ("baseline", "candidate")}
    verdict = Judge._verdict(types.SimpleNamespace(device="cuda"), pooled, medians, PAIRS)
    assert verdict["process_floor_us"] == 0.15 and verdict["pairs_needed"] == 3 and verdict["pairs_pointing"] == 2
    assert verdict["verdict"] == "SAME" and verdict["held"].startswith("FASTER by the pooled samples")
    # the context regime's graph holds its neighbours' kernels too: twice the floor (stats.CONTEXT_FLOOR_FACTOR)
    in_context = Judge._verdict(types.SimpleNamespace(device="cuda"), pooled, medians, PAIRS, regime="context")
    assert in_context["process_floor_us"] == 0.3
    assert Judge._verdict(types.SimpleNamespace(device="cpu"), pooled, medians, 1)["verdict"] is None  # a smoke row


def test_the_warm_regime_calls_no_change_under_its_own_floor() -> None:
    """A warm regime's inputs sit in the L2 as their placement lets them, the same in every pair of the row: a
    candidate 1.5 % faster in all four pairs is FASTER cold and in context, SAME warm (stats.WARM_NOISE_FLOOR), and
    3 % faster is FASTER warm too."""
    import types

    from kpremote.agent.harness import timing
    from kpremote.agent.harness.judge import Judge

    def judged(ratio: float, regime: str) -> dict:
        rng = random.Random(9)
        pairs = []
        for _ in range(PAIRS):
            sides = [timing.SideSamples(name, times_us=[us * (1 + 0.001 * rng.gauss(0, 1)) for _ in range(60)])
                     for name, us in (("baseline", 50.0), ("candidate", 50.0 / ratio))]
            pairs.append(timing.PairTiming(regime, 1, sides[0], sides[1], "converged", "on"))
        pooled = timing.pooled(pairs)
        medians = {side: getattr(pooled, side).summary().median for side in ("baseline", "candidate")}
        return Judge._verdict(types.SimpleNamespace(device="cuda"), pooled, medians, PAIRS, regime=regime)

    assert judged(1.015, "cold")["verdict"] == judged(1.015, "context")["verdict"] == "FASTER"
    warm = judged(1.015, "warm")
    assert warm["verdict"] == "SAME" and warm["noise"] == stats.WARM_NOISE_FLOOR == 0.02
    assert judged(1.03, "warm")["verdict"] == "FASTER"


def test_context_report_tells_each_regimes_cost() -> None:
    """benchmarks/gpu/context_report.py: a `with-` run against its `without-` twin (the row's seconds), and every
    context row's sampling time per regime (both sides' wall_s), from the records as the runner writes them."""
    import copy
    import importlib.util

    spec = importlib.util.spec_from_file_location("context_report", REPO / "benchmarks" / "gpu" / "context_report.py")
    context_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(context_report)
    with_row, samples = copy.deepcopy(VANISHING)
    with_row["seconds"] = 7.5
    for part, (base, cand) in ((with_row["timing"], (0.5, 0.6)), (with_row["regimes"]["warm"]["timing"], (0.7, 0.4)),
                               (with_row["regimes"]["context"]["timing"], (1.0, 1.25))):
        part["baseline"]["wall_s"], part["candidate"]["wall_s"] = base, cand
    without_row, without_samples = copy.deepcopy(ALONE)
    without_row.update(workload="qwen_s19", seconds=5.0)
    runs = [("tasks/fuse/with-1", run_of([(with_row, samples)])),
            ("tasks/fuse/without-1", run_of([(without_row, without_samples)]))]
    assert "| fuse | qwen_s19 | 5.0 | 7.5 | +2.5 s (1.50x) |" in context_report.cost_table(runs)
    assert "| tasks/fuse/with-1 | qwen_s19 | 7.5 | 1.10 | 1.10 | 2.25 |" in context_report.sampling_table(runs)
