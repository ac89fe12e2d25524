"""What people see: rich tables for hosts and GPUs, one-line errors on stderr."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Iterator, Optional, TypeVar, Union

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from .config import Host

if TYPE_CHECKING:  # annotations only: `inv run` need not import the gpu-status models
    from rich.markdown import Markdown

    from .gpustatus import GpuReport, HostInfo, HostReport

console = Console()
errors = Console(stderr=True)

Line = TypeVar("Line")


def error_line(message: str) -> None:
    errors.print(Text(f"error: {message}", style="bold red"))


def hosts_table(hosts: Iterable[Host], infos: Optional[dict[str, HostInfo]] = None) -> Table:
    table = Table(title="hosts", title_justify="left")
    for column in ("host", "address", "arch", "container", "groups"):
        table.add_column(column)
    if infos is not None:
        for column in ("reachable", "hostname", "python", "torch", "triton", "nvidia-ml-py", "tvm-ffi", "cutlass-dsl"):
            table.add_column(column)
    for host in hosts:
        row = [host.name, host.address, host.arch, host.container or "-", ", ".join(host.groups) or "-"]
        if infos is not None:
            info = infos[host.name]
            if info.ok:
                row += [Text("yes", style="green"), info.hostname or "?", info.python or "?",
                        info.torch or "missing", info.triton or "missing", info.pynvml or "missing",
                        info.tvm_ffi or "missing", info.cutlass_dsl or "missing"]
            else:
                row += [Text(info.error or "no", style="red"), "", "", "", "", "", "", ""]
        table.add_row(*row)
    return table


def _verdict(gpu: GpuReport) -> Text:
    if gpu.lease:
        holder = gpu.lease.get("run_id") or gpu.lease.get("pid")
        return Text(f"leased ({holder})", style="yellow")
    if not gpu.arch_ok:
        return Text("wrong arch", style="magenta")
    if gpu.idle:
        return Text("idle", style="green")
    return Text(f"busy: {gpu.reason or ''}".strip(), style="red")


def _processes(gpu: GpuReport) -> str:
    return ", ".join(f"{p.pid} {p.name or '?'} {p.used_mib or '?'}MiB" for p in gpu.processes) or "-"


def gpu_table(reports: list[HostReport]) -> Table:
    table = Table(title="gpu-status", title_justify="left")
    for column in ("host", "gpu", "name", "cc", "memory", "util", "temp", "power", "sm clock", "events",
                   "processes", "verdict"):
        table.add_column(column, overflow="fold")
    for report in reports:
        if not report.ok:
            table.add_row(report.host, "-", Text(report.error or "failed", style="bold red"), *[""] * 9)
            continue
        if not report.gpus:
            table.add_row(report.host, "-", Text(f"no GPUs ({report.source})", style="dim"), *[""] * 9)
        for gpu in report.gpus:
            table.add_row(
                f"{report.host} ({report.hostname})" if report.hostname and report.hostname != report.host else report.host,
                f"{gpu.index}",
                f"{gpu.name}\n{gpu.uuid}",
                f"{gpu.cc[0]}.{gpu.cc[1]}",
                f"{gpu.memory_used_mib}/{gpu.memory_total_mib} MiB",
                f"{gpu.util_pct}%",
                "-" if gpu.temperature_c is None else f"{gpu.temperature_c}C",
                "-" if gpu.power_w is None else f"{gpu.power_w:.0f}W",
                "-" if gpu.sm_clock_mhz is None else f"{gpu.sm_clock_mhz}/{gpu.sm_clock_max_mhz or '?'} MHz",
                ", ".join(gpu.clock_event_reasons) or "-",
                _processes(gpu),
                _verdict(gpu),
            )
    return table


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


class RunView:
    """The live view of one or more runs: a status line per run, and each row's verdict printed as it comes.

    Every print under rich's Live redraws the live table too, so verdicts are printed in batches (BatchedPrinter);
    the status lines are drawn by Live's own refresh (twice a second) from the current state. A run emitting hundreds
    of events a second then costs the client a few percent of a core, not most of one (benchmarks/bench_follow.py).
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

            self._live = Live(console=console, refresh_per_second=2, transient=True, get_renderable=self._current)
            self._live.__enter__()
            self._printer = BatchedPrinter(lambda batch: console.print(_Lines(batch), soft_wrap=True))
            self._printer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._printer is not None:
                self._printer.__exit__(*exc)
        finally:  # the terminal's cursor and live area are given back whatever printing did
            if self._live is not None:
                self._live.__exit__(*exc)

    def add(self, key: str, host: str, task: str, run_id: str, gpu: Optional[dict]) -> None:
        gpu_text = f"GPU {gpu.get('index')} {gpu.get('name', '')}" if gpu else "no GPU (CPU smoke)"
        with self._lock:
            self._add(key, host, task, run_id, gpu_text)

    def _add(self, key: str, host: str, task: str, run_id: str, gpu_text: str) -> None:
        self.lines[key] = {"host": host, "task": task, "run_id": run_id, "gpu": gpu_text, "phase": "starting",
                           "progress": "", "passed": 0, "failed": 0, "t0": time.monotonic()}

    def event(self, key: str, event: dict) -> None:
        with self._lock:
            self._event(key, event)

    def _event(self, key: str, event: dict) -> None:
        line = self.lines[key]
        kind = event.get("event")
        if kind == "phase":
            line["phase"] = event.get("phase", line["phase"])
        elif kind == "row":
            status = event.get("status", "?")
            line["progress"] = f"{event.get('i', '?')}/{event.get('n', '?')}"
            line["passed" if status == "PASSED" else "failed"] += 1
            if self._printer is not None:
                self._printer.add(self._row_segments(line, event))
        elif kind == "done":
            line["phase"] = event.get("status", "done")

    def _row_segments(self, line: dict, event: dict) -> list[Segment]:
        """One verdict line as plain segments: rich's Text layout costs ~60 µs a line, segments ~10."""
        status = str(event.get("status", "?"))
        pieces = [(f"{line['host']} {line['task']} [{line['progress']}] {event.get('workload', '?')}: ", None),
                  (status, STATUS_STYLE.get(status))]
        speedup = event.get("speedup")
        if speedup:
            pieces.append((f"  speedup {speedup:.3f}x", None))
        if event.get("message"):
            pieces.append((f"  {event['message']}", "dim"))
        return [Segment(strip_control_codes(text), Style.parse(style) if style else None) for text, style in pieces]

    def _current(self) -> Table:
        with self._lock:
            return self._render()

    def _render(self) -> Table:
        table = Table(box=None, show_header=False)
        for line in self.lines.values():
            elapsed = time.monotonic() - line["t0"]
            table.add_row(line["host"], line["task"], line["run_id"], line["gpu"],
                          Text(line["phase"], style=STATUS_STYLE.get(line["phase"], "cyan")), line["progress"],
                          f"{line['passed']} passed, {line['failed']} not", f"{elapsed:.0f}s")
        return table


class _Lines:
    """Lines of segments, as one renderable: a batch of verdicts printed in one go."""

    def __init__(self, lines: list[list[Segment]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for line in self.lines:
            yield from line
            yield Segment.line()


def summary_markdown(path: Path) -> Markdown:
    """A fetched results.md, rendered: the agent's report is the one table of a run, shown as it wrote it."""
    from rich.markdown import Markdown  # 40 ms of import (markdown_it) that every other command can skip

    return Markdown(path.read_text())


def _event_pieces(event: dict) -> list[tuple[str, str]]:
    """One event of a run's stream as (text, style) pieces, control codes removed: the line `inv logs` prints."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t", 0)))
    kind = event.get("event", "?")
    status = event.get("status")
    pieces = [(f"{stamp} {kind:<10} ", "")]
    if status:
        pieces.append((f"{status} ", STATUS_STYLE.get(status, "")))
    pieces.append((" ".join(f"{k}={v}" for k, v in event.items()
                            if k not in ("t", "event", "status") and not isinstance(v, (dict, list))), ""))
    return [(strip_control_codes(text), style) for text, style in pieces]


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
    console.print(_EventLines(events))


def runs_table(answers: list[dict]) -> Table:
    table = Table(title="runs", title_justify="left")
    for column in ("host", "run", "task", "gpu", "status", "phase", "age", "headline"):
        table.add_column(column)
    for answer in answers:
        if not answer["ok"]:
            table.add_row(answer["host"], "", Text(answer.get("error", ""), style="red"), "", "", "", "", "")
            continue
        for run in answer["runs"]:
            gpu = run.get("gpu") or {}
            headline = run.get("headline") or {}
            table.add_row(
                answer["host"], run.get("run_id", "?"), run.get("task", "?"),
                f"{gpu.get('index', '-')}" if gpu else "-",
                Text(run.get("status", "?"), style=STATUS_STYLE.get(run.get("status", ""), "")),
                run.get("phase", ""), _age(run.get("started")),
                f"{headline['geomean']:.3f}x" if headline.get("geomean") else "-",
            )
    return table


def _age(started: Optional[str]) -> str:
    if not started:
        return "?"
    from datetime import datetime, timezone

    try:
        then = datetime.fromisoformat(str(started).replace("Z", "+00:00"))
    except ValueError:
        return "?"
    seconds = int((datetime.now(timezone.utc) - then).total_seconds())
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
