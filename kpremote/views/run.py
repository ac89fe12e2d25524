"""A run's events in words: the live view while runs go on (a status line each, verdicts printed as they come, in
batches) and the same words afterwards, one line per event (`inv logs`)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar, Union

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from . import terminal
from .layout import Column, fit_columns
from .results import VERDICT_STYLE

Line = TypeVar("Line")


STATUS_STYLE = {"PASSED": "green", "INCORRECT": "red", "ERROR": "red", "TIMEOUT": "red", "SKIPPED": "yellow",
                "passed": "green", "failed": "red", "error": "red", "cancelled": "yellow", "running": "cyan"}


class BatchedPrinter(Generic[Line]):
    """Lines added from any thread, printed by one thread of its own in batches at most FLUSH_S apart; what is still
    pending when the `with` block ends (Ctrl-C included) is printed before it is left.

    Each console.print has a fixed cost (~170 µs for a short line, and under rich's Live a redraw of the live
    display): a run emitting hundreds of events a second, printed one by one, takes a good part of a core. One print
    per batch keeps that to a few percent, rows drawn within FLUSH_S plus a batch's print (benchmarks/bench_follow.py).
    """

    FLUSH_S = 0.2

    def __init__(self, print_batch: Callable[[list[Line]], None]) -> None:
        self._print_batch = print_batch
        self._lock = threading.Lock()
        self._pending: list[Line] = []
        self._closing = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failure: Optional[BaseException] = None

    def __enter__(self) -> "BatchedPrinter[Line]":
        self._thread = threading.Thread(target=self._print_batches, name="kpremote-printer", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join()
        self._raise_failure()
        self._print_pending()

    def add(self, line: Line) -> None:
        self._raise_failure()
        with self._lock:
            self._pending.append(line)

    def _print_batches(self) -> None:
        try:
            while not self._closing.wait(self.FLUSH_S):
                self._print_pending()
        except BaseException as exc:  # noqa: BLE001 - handed over to the thread that adds
            self._failure = exc

    def _raise_failure(self) -> None:
        # A print that failed in our thread (a closed pipe: rich raises SystemExit) is raised in the thread that adds,
        # where it was raised when each line was printed on its own: a thread ending would go unnoticed.
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _print_pending(self) -> None:
        # Taken under the lock, printed outside it: whoever adds never waits on the console. RunView adds under its
        # own lock, which Live's refresh thread wants while it holds the console's: printing under ours could deadlock.
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._print_batch(batch)


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m: how long, as a person reads it."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def row_pieces(event: dict) -> list[tuple[str, Optional[str]]]:
    """A row's verdict as (text, style) pieces, the same in the live view and in `inv logs`:
    `[3/14] prod_r8_c256: PASSED  speedup 1.024x  (smoke)  message`."""
    status = str(event.get("status", "?"))
    pieces: list[tuple[str, Optional[str]]] = [
        (f"[{event.get('i', '?')}/{event.get('n', '?')}] {event.get('workload', '?')}: ", None),
        (status, STATUS_STYLE.get(status))]
    if event.get("verdict") and not (event.get("label") or event.get("smoke")):  # a smoke verdict means nothing
        pieces.append((f"  {event['verdict']}", VERDICT_STYLE.get(str(event["verdict"]))))
    if event.get("speedup"):
        pieces.append((f"  speedup {event['speedup']:.3f}x", None))
    smoke = event.get("label") or event.get("smoke")
    for regime, part in (event.get("regimes") or {}).items():  # a row with a context: its other regimes, in short
        if isinstance(part, dict) and part.get("speedup") and event.get("speedup") and not smoke:
            word = part.get("verdict")
            pieces.append((f"  {regime} {part['speedup']:.3f}x" + (f" {word}" if word else ""),
                           VERDICT_STYLE.get(str(word))))
    if event.get("context_note"):
        pieces.append((f"  {event['context_note'].split(': ', 1)[-1]}", "yellow"))
    if event.get("label") or event.get("smoke"):
        pieces.append(("  (smoke)", "yellow"))
    for key in ("message", "invalid", "implausible"):
        if event.get(key):
            pieces.append((f"  {event[key]}", "dim"))
    return pieces


def headline_text(head: Optional[dict]) -> str:
    """`1.024x (0.992-1.056) over 1 of 1 production rows (smoke)`, or why there is none."""
    head = head or {}
    smoke = " (smoke)" if head.get("label") else ""
    if not head.get("geomean"):
        return f"no headline ({head.get('note', 'no rows')}){smoke}"
    interval = f" ({head['low']:.3f}–{head['high']:.3f})" if head.get("low") and head.get("high") else ""
    over = f" over {head['n']} of {head['of']} production rows" if head.get("of") else ""
    return f"{head['geomean']:.3f}x{interval}{over}{smoke}"


def _event_body(event: dict) -> list[tuple[str, Optional[str]]]:
    """What one event says, in words: the line `inv logs` prints after its time stamp."""
    kind = event.get("event", "?")
    if kind == "row":
        return row_pieces(event)
    if kind == "phase":
        where = f" {event['workload']} ({event.get('i')}/{event.get('n')})" if event.get("workload") else ""
        return [("phase ", None), (str(event.get("phase")), "cyan"), (where, None)]
    if kind == "build":
        ok = event.get("ok")
        pieces = [(f"build {event.get('side')}: ", None), ("ok" if ok else "FAILED", "green" if ok else "red"),
                  (f" in {_number(event.get('seconds'), 3)} s", None)]
        return pieces + ([(f"  {event['error']}", "red")] if event.get("error") else [])
    if kind == "headline":
        return [("headline ", None), (headline_text(event), "bold")]
    if kind == "done":
        status = str(event.get("status"))
        message = f"  {event['message']}" if event.get("message") else ""
        code = f" (exit code {event['exit_code']})" if event.get("exit_code") is not None else ""  # none: never ran
        return [("done: ", None), (status, STATUS_STYLE.get(status)), (f"{code}{message}", None)]
    if kind in ("error", "warning"):
        return [(f"{kind}: ", "red" if kind == "error" else "yellow"), (str(event.get("message") or ""), None)]
    if kind == "provenance":
        return [("provenance recorded", "dim")]
    fields = " ".join(f"{k}={_number(v)}" for k, v in event.items()
                      if k not in ("t", "event") and v is not None and not isinstance(v, (dict, list)))
    return [(f"{kind} {fields}".rstrip(), None)]


class RunView:
    """The live view of one or more runs: a status line per run, and each row's verdict printed as it comes.

    A run still starting has a line too, saying what its start does (kpremote/views/start.py), until add() gives the
    run's own line.

    Every print under rich's Live redraws the live table too, so verdicts are printed in batches (BatchedPrinter);
    the status lines are drawn by Live's own refresh (twice a second) from the current state. A run emitting hundreds
    of events a second then costs the client a few percent of a core, not most of one (benchmarks/bench_follow.py).
    The status line reads `workload 3/14 · ETA 1m20s`: the ETA is the mean time of the rows done so far times the
    rows left.
    """

    def __init__(self, quiet: bool = False) -> None:
        self.lines: dict[str, dict] = {}
        self.quiet = quiet
        self._live = None
        self._lock = threading.Lock()  # runs are followed from one thread each
        self._printer: Optional[BatchedPrinter[list[Segment]]] = None

    def __enter__(self) -> "RunView":
        if not self.quiet:
            from rich.live import Live

            self._live = Live(console=terminal.console, refresh_per_second=2, transient=True,
                              get_renderable=self._current)
            self._live.__enter__()
            self._printer = BatchedPrinter(lambda batch: terminal.console.print(_Lines(batch), soft_wrap=True))
            self._printer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._printer is not None:
                self._printer.__exit__(*exc)
        finally:  # the terminal's cursor and live area are given back whatever printing did
            if self._live is not None:
                self._live.__exit__(*exc)

    @property
    def drawing(self) -> bool:
        """Whether the live lines are drawn (a terminal, not --json): elsewhere rich's Live draws nothing."""
        return self._live is not None and self._live.console.is_terminal and not self._live.console.is_dumb_terminal

    def say(self, text: str) -> None:
        """A line for whoever watches: printed above the live lines while they are drawn (a print of its own on
        stderr would tear them), else on stderr (stdout stays for the results)."""
        (self._live.console if self.drawing else terminal.errors).print(text, markup=False, highlight=False,
                                                                         soft_wrap=True)

    def starting(self, key: str, host: str, task: str, phase: str) -> None:
        """The line of a run not begun yet: what its start does now (`syncing 12 files (3.4 MiB)`) and for how long
        it has been starting; add() with the same key puts the run's own line in its place."""
        with self._lock:
            t0 = self.lines.get(key, {}).get("t0", time.monotonic())
            self.lines[key] = {"host": host, "task": task, "starting": phase, "t0": t0}
        if self._live is not None and self._live.is_started:  # a start thread may outlive the view (Ctrl-C)
            self._live.refresh()  # drawn now, outside our lock (see BatchedPrinter): a phase may be over in a moment

    def not_started(self, key: str) -> None:
        """A start is over and began no run: its line goes (a run's own line, once added, stays)."""
        with self._lock:
            if "starting" in self.lines.get(key, {}):
                del self.lines[key]

    def add(self, key: str, host: str, task: str, run_id: str, gpu: Optional[dict]) -> None:
        gpu_text = f"GPU {gpu.get('index')} {gpu.get('name', '')}" if gpu else "no GPU (CPU smoke)"
        with self._lock:
            self._add(key, host, task, run_id, gpu_text)

    def _add(self, key: str, host: str, task: str, run_id: str, gpu_text: str) -> None:
        self.lines[key] = {"host": host, "task": task, "run_id": run_id, "gpu": gpu_text, "phase": "starting",
                           "i": 0, "n": 0, "done": 0, "passed": 0, "failed": 0, "smoke": False,
                           "t0": time.monotonic(), "rows_t0": None}

    def event(self, key: str, event: dict) -> None:
        with self._lock:
            self._event(key, event)

    def _event(self, key: str, event: dict) -> None:
        line = self.lines[key]
        kind = event.get("event")
        if kind == "phase":
            line["phase"] = event.get("phase", line["phase"])
            if event.get("n"):
                line["i"], line["n"] = event.get("i") or 0, event["n"]
                if line["rows_t0"] is None:
                    line["rows_t0"] = time.monotonic()
        elif kind == "row":
            status = event.get("status", "?")
            line["i"], line["n"] = event.get("i") or line["i"], event.get("n") or line["n"]
            line["done"] += 1
            line["smoke"] = line["smoke"] or bool(event.get("label"))
            line["passed" if status == "PASSED" else "failed"] += 1
            if self._printer is not None:
                self._printer.add(self._row_segments(line, event))
        elif kind == "done":
            line["phase"] = event.get("status", "done")

    def _row_segments(self, line: dict, event: dict) -> list[Segment]:
        """One verdict line as plain segments: rich's Text layout costs ~60 µs a line, segments ~10. The host and
        task lead it only when several runs are followed: one run's lines stay short (an 80-column terminal)."""
        whose = [(f"{line['host']} {line['task']} ", None)] if len(self.lines) > 1 else []
        pieces = [*whose, *row_pieces(event)]
        return [Segment(strip_control_codes(text), Style.parse(style) if style else None) for text, style in pieces]

    def _current(self) -> "_StatusLines":
        with self._lock:
            return self._render()

    def _render(self) -> "_StatusLines":
        rows = []
        for line in self.lines.values():
            elapsed = duration(time.monotonic() - line["t0"])
            if "starting" in line:
                rows.append([line["host"], line["task"], "", "", Text(f"{line['starting']} …", style="cyan"), "", "",
                             elapsed])
                continue
            counts = f"{line['passed']} passed" + (f", {line['failed']} not" if line["failed"] else "")
            progress = progress_text(line)
            phase = "" if line["phase"] == "workload" and progress else line["phase"]  # progress says "workload i/n"
            rows.append([line["host"], line["task"], line["run_id"], line["gpu"],
                         Text(phase, style=STATUS_STYLE.get(phase, "cyan")), progress,
                         counts + (" (smoke)" if line["smoke"] else ""), elapsed])
        return _StatusLines(rows)


class _StatusLines:
    """The live status lines, laid out for the width they get: the run id is never cut (logs, cancel and
    fetch-results take it whole); when the terminal is narrow, whole columns give way, least useful first."""

    # (whole, drop order) of: host, task, run id, GPU, phase, workload i/n and ETA, counts, elapsed
    COLUMNS = ((True, 0), (False, 4), (True, 0), (False, 1), (False, 0), (False, 5), (False, 3), (True, 2))

    def __init__(self, rows: list[list[Union[str, Text]]]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Table]:
        columns = [Column("", [row[index] for row in self.rows], whole=whole, drop=drop)
                   for index, (whole, drop) in enumerate(self.COLUMNS)]
        shown = [c for c in fit_columns(columns, options.max_width) if any(_text_of(cell) for cell in c.cells)]
        table = Table(box=None, show_header=False, pad_edge=False)
        for column in shown:
            if column.whole:
                table.add_column(no_wrap=True, min_width=column.width())
            else:
                table.add_column(overflow="fold")
        for index in range(len(self.rows)):
            table.add_row(*(column.cells[index] for column in shown))
        yield table


def _text_of(cell: Union[str, Text]) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def progress_text(line: dict) -> str:
    """`workload 3/14 · ETA 1m20s`: rows done so far set the pace for the rows left."""
    if not line.get("n"):
        return ""
    text = f"workload {line['i']}/{line['n']}"
    done, rows_t0 = line.get("done", 0), line.get("rows_t0")
    if done and rows_t0 is not None and line["n"] > done:
        per_row = (time.monotonic() - rows_t0) / done
        text += f" · ETA {duration(per_row * (line['n'] - done))}"
    return text


class _Lines:
    """Lines of segments, as one renderable: a batch of verdicts printed in one go."""

    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for line in self.lines:
            yield from line
            yield Segment.line()


def _event_pieces(event: dict) -> list[tuple[str, str]]:
    """One event of a run's stream as (text, style) pieces, control codes removed: the line `inv logs` prints."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t", 0)))
    pieces = [(f"{stamp}  ", "dim"), *_event_body(event)]
    return [(strip_control_codes(text), style or "") for text, style in pieces]


def event_line(event: dict) -> Text:
    """One event of a run's stream, as `inv logs` prints it."""
    return Text.assemble(*_event_pieces(event))


class _EventLines:
    """Events as one renderable, each printed exactly as console.print(event_line(event)) prints it.

    rich's Text layout (wrap, then render by spans) costs ~30 µs a line and leaves a line that fits the width as it
    is, so such a line goes out as plain segments; a longer one, or one with a newline or tab, is laid out by rich.
    """

    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Union[Segment, Text]]:
        for event in self.events:
            pieces = _event_pieces(event)
            plain = "".join(text for text, _ in pieces)
            if cell_len(plain) > options.max_width or "\n" in plain or "\t" in plain:
                yield Text.assemble(*pieces)
                continue
            for text, style in pieces:
                yield Segment(text, console.get_style(style) if style else None)
            yield Segment.line()


def print_events(events: list[dict]) -> None:
    """A batch of a run's events in one print (BatchedPrinter), each line as event_line shows it."""
    terminal.console.print(_EventLines(events))

