"""A run's plot (summary/speedup.png): each row's speedup with its interval, coloured by its verdict (green FASTER,
red SLOWER, grey SAME or none), and its share of the copy bandwidth.

Standard library only; matplotlib is imported when a plot is drawn and may be missing on a host: then no plot, and
the reason, in words, for the summary to print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..protocol import UNVERIFIED_FASTER, RowResult, RunResults

PASSED = "PASSED"


def copy_share(row: RowResult, copy_gbps: Optional[float]) -> Optional[float]:
    """The candidate's achieved bandwidth as % of the device-to-device copy bandwidth measured in the same run."""
    gbps = (row.gbps or {}).get("candidate")
    return 100.0 * gbps / copy_gbps if gbps and copy_gbps else None


def plotted_rows(results: RunResults) -> list[RowResult]:
    return [r for r in results.rows if r.status == PASSED and r.speedup]


VERDICT_COLOURS = {"FASTER": "tab:green", UNVERIFIED_FASTER: "tab:olive", "SLOWER": "tab:red"}


def bar_colour(row: RowResult) -> str:
    """A row's bar as its verdict reads: green FASTER, red SLOWER, grey otherwise (SAME, or no verdict as in a smoke
    run): a speedup of 1.02x inside the noise is not a win, and its bar does not say it is."""
    return "tab:gray" if row.smoke else VERDICT_COLOURS.get(str(row.verdict_word), "tab:gray")


def draw_speedup_plot(results: RunResults, path: Path) -> Optional[str]:
    """Draw the plot into path (PNG). None when it was drawn; else why not, as a sentence for the summary.
    A smoke run's (CPU, Triton's interpreter) is not drawn: its timings mean nothing, as its verdicts are not shown."""
    if results.smoke:
        return "no plot: a smoke run's timings are not meaningful"
    rows = plotted_rows(results)
    if not rows:
        return "no plot: no row passed with a speedup to show"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed where the summary was written (pip install matplotlib)"
    try:
        _draw(plt, results, rows, Path(path))
    except Exception as exc:  # noqa: BLE001 - a plot must never cost the run its summary
        return f"no plot: drawing it failed ({type(exc).__name__}: {exc})"
    return None


def _draw(plt: Any, results: RunResults, rows: list[RowResult], path: Path) -> None:
    copy_gbps = results.part("copy_bandwidth").get("gbps")
    shares = [copy_share(r, copy_gbps) for r in rows]
    with_share = any(share is not None for share in shares)
    # Horizontal bars: workload ids are long, and a row per workload stays readable at any count.
    figure, panels = plt.subplots(1, 2 if with_share else 1, sharey=True, squeeze=False,
                                  figsize=(10.0 if with_share else 7.0, 1.4 + 0.35 * len(rows)),
                                  gridspec_kw={"width_ratios": [3, 2] if with_share else [1]})
    speed = panels[0][0]
    positions = list(range(len(rows)))
    values = [r.speedup for r in rows]
    intervals = [r.interval for r in rows]
    errors = [[v - i[0] if i else 0.0 for v, i in zip(values, intervals)],
              [i[1] - v if i else 0.0 for v, i in zip(values, intervals)]]
    speed.barh(positions, values, xerr=errors if any(intervals) else None, capsize=3,
               color=[bar_colour(r) for r in rows])
    speed.axvline(1.0, color="black", linewidth=0.8)
    speed.set_yticks(positions, [r.workload for r in rows], fontsize=7)
    speed.invert_yaxis()
    speed.set_xlabel("speedup (baseline median / candidate median)" + (", 95 % interval" if any(intervals) else ""))
    head = results.headline
    title = f"geomean {head.geomean:.3f}x" if head.geomean else "speedup per workload"
    speed.set_title(title + (" — SMOKE, meaningless" if results.smoke else ""), fontsize=9)
    if with_share:
        share = panels[0][1]
        share.barh(positions, [s or 0.0 for s in shares], color="tab:blue")
        share.set_xlabel(f"% of copy bandwidth ({copy_gbps:,.0f} GB/s)")
        share.set_xlim(0, max(100.0, max(s or 0.0 for s in shares) * 1.05))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
