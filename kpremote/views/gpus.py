"""`gpu-status` in gpustat's layout: a line per host, a line per GPU (its lease or why it is not idle), details
that do not fit on an indented second line; with --watch, redrawn under an "updated at" line."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from rich.cells import cell_len
from rich.console import Group
from rich.text import Text

from . import terminal
from .terminal import error_lines

if TYPE_CHECKING:  # annotations only: `inv run` need not import the gpu-status models
    from ..agent.protocol import ProbedGpu
    from ..hosts.gpustatus import HostReport


@dataclass
class GpuViewOptions:
    """What gpu-status shows besides each GPU's one line (gpustat's -p/-u/-a, adapted)."""

    pids: bool = False   # -p: each process as name/pid(MiB)
    uuid: bool = False   # -u: the GPU's UUID
    all: bool = False    # -a: power, SM clock, clock events and the busy reason as well


def _verdict(gpu: ProbedGpu) -> Text:
    if gpu.lease:
        holder = gpu.lease.get("run_id") or f"pid {gpu.lease.get('pid')}"
        user = f" ({gpu.lease['user']})" if gpu.lease.get("user") else ""  # whom to ask about it
        return Text(f"leased by {holder}{user}", style="yellow")
    if not gpu.arch_ok:
        return Text("wrong arch", style="magenta")
    if gpu.idle:
        return Text("idle", style="green")
    if gpu.util_pct is None or gpu.processes is None:
        return Text("unreadable", style="red")  # NVML could not say whether it is idle: never leased
    return Text("busy", style="red")


def _processes(gpu: ProbedGpu, pids: bool) -> str:
    return " ".join(f"{p['name'] or '?'}{'/' + str(p['pid']) if pids else ''}"
                    f"({p['used_mib'] if p['used_mib'] is not None else '?'}M)" for p in gpu.processes)


def _details(gpu: ProbedGpu, options: GpuViewOptions) -> list[str]:
    details = []
    if options.uuid or options.all:
        details.append(gpu.uuid)
    if gpu.processes:
        details.append(_processes(gpu, options.pids or options.all))
    if options.all:
        details.append("-" if gpu.power_w is None else f"{gpu.power_w:.0f} W")
        if gpu.sm_clock_mhz is not None:
            details.append(f"SM {gpu.sm_clock_mhz}/{gpu.sm_clock_max_mhz or '?'} MHz")
        if gpu.clock_event_reasons:
            details.append(",".join(gpu.clock_event_reasons))
        if gpu.reason and not gpu.idle:
            details.append(f"busy: {gpu.reason}")
        if gpu.arch_reason and not gpu.arch_ok:
            details.append(f"wrong arch: {gpu.arch_reason}")
    return details


def _host_header(report: HostReport) -> Text:
    header = Text(report.host, style="bold")
    if report.hostname and report.hostname != report.host:
        header.append(f" ({report.hostname})")
    if not report.ok:
        return header.append("  unreachable" if "unreachable" in (report.error or "") else "  failed", style="red")
    if report.driver:
        header.append(f"  driver {report.driver}", style="dim")
    if report.source and report.source != "nvml":
        header.append(f"  {report.source}", style="dim")
    idle = sum(1 for g in report.gpus if g.idle and not g.lease and g.arch_ok)
    header.append(f"  {len(report.gpus)} GPU{'s' if len(report.gpus) != 1 else ''}, {idle} idle", style="dim")
    return header


def gpu_view(reports: list[HostReport], options: Optional[GpuViewOptions] = None, width: Optional[int] = None,
             header: Optional[Text] = None) -> Group:
    """gpustat's layout: a line per host, then one line per GPU; what does not fit the width (processes, UUID,
    details) goes on one indented second line. A host that failed shows its error whole, on a line of its own."""
    options = options or GpuViewOptions()
    width = width or terminal.console.width
    parts: list[Any] = [header] if header is not None else []
    gpus = [g for r in reports for g in r.gpus]
    name_w = max((cell_len(g.name) for g in gpus), default=0)
    used_w = max((len(str(g.memory_used_mib)) for g in gpus), default=0)
    total_w = max((len(str(g.memory_total_mib)) for g in gpus), default=0)
    for report in reports:
        parts.append(_host_header(report))
        if not report.ok:
            parts += error_lines(report.error or "failed", indent="  ")
            continue
        if not report.gpus and report.source in (None, "none"):
            parts.append(Text("  no GPUs here (no NVIDIA driver): runs on this host are CPU smoke runs", style="dim"))
        elif not report.gpus:
            parts.append(Text(f"  no GPUs ({report.source})", style="dim"))
        for gpu in report.gpus:
            parts += _gpu_lines(gpu, options, width, (name_w, used_w, total_w))
    return Group(*parts)


def _gpu_lines(gpu: ProbedGpu, options: GpuViewOptions, width: int, widths: tuple[int, int, int]) -> list[Text]:
    name_w, used_w, total_w = widths
    temperature = "  -" if gpu.temperature_c is None else f"{gpu.temperature_c:>3}"
    line = Text.assemble(
        (f"[{gpu.index}] ", "cyan"), (gpu.name.ljust(name_w), "blue"), " │ ",
        (f"{temperature}°C", "red" if (gpu.temperature_c or 0) >= 80 else ""),
        _utilization(gpu.util_pct), " │ ",
        (f"{gpu.memory_used_mib:>{used_w}} / {gpu.memory_total_mib:>{total_w}} MiB", "yellow"), " │ ",
        _verdict(gpu),
    )
    details = "  ".join(_details(gpu, options))
    if not details:
        return [line]
    if cell_len(line.plain) + 2 + cell_len(details) <= width:
        return [line.append(f"  {details}", style="dim")]
    # The second line: cut with an ellipsis rather than wrapped, unless what is asked for (-u, -a) must stay whole.
    more = Text(f"    {details}", style="dim", no_wrap=not (options.uuid or options.all), overflow="ellipsis")
    return [line, more]


def _utilization(util_pct: Optional[int]) -> tuple[str, str]:
    if util_pct is None:
        return ("   ? %", "red")
    return (f" {util_pct:>3} %", "green" if util_pct < 5 else "yellow")


def show_every(seconds: float, frame: Callable[[], Any]) -> None:
    """Show frame() every SECONDS until interrupted: redrawn in place on a terminal, else printed in turn (a log of
    the refreshes)."""
    if not terminal.console.is_terminal:
        while True:
            terminal.show(frame())
            time.sleep(seconds)
    from rich.live import Live

    with Live(frame(), console=terminal.console, auto_refresh=False) as live:
        while True:
            time.sleep(seconds)
            live.update(frame(), refresh=True)


def watch_header(seconds: float) -> Text:
    return Text(f"updated at {time.strftime('%H:%M:%S')} · every {seconds:g} s · Ctrl-C stops", style="dim")
