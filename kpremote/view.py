"""What people see: rich tables for hosts and GPUs, one-line errors on stderr."""

from __future__ import annotations

from typing import Iterable, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .config import Host
from .gpustatus import GpuReport, HostInfo, HostReport

console = Console()
errors = Console(stderr=True)


def error_line(message: str) -> None:
    errors.print(Text(f"error: {message}", style="bold red"))


def hosts_table(hosts: Iterable[Host], infos: Optional[dict[str, HostInfo]] = None) -> Table:
    table = Table(title="hosts", title_justify="left")
    for column in ("host", "address", "arch", "container", "groups"):
        table.add_column(column)
    if infos is not None:
        for column in ("reachable", "hostname", "python", "torch", "triton", "nvidia-ml-py"):
            table.add_column(column)
    for host in hosts:
        row = [host.name, host.address, host.arch, host.container or "-", ", ".join(host.groups) or "-"]
        if infos is not None:
            info = infos[host.name]
            if info.ok:
                row += [Text("yes", style="green"), info.hostname or "?", info.python or "?",
                        info.torch or "missing", info.triton or "missing", info.pynvml or "missing"]
            else:
                row += [Text(info.error or "no", style="red"), "", "", "", "", ""]
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
