"""`inv hosts`: the inventory as a compact table; with --check, each host's versions and its failure whole."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

from rich.console import Group
from rich.text import Text

from ..hosts.config import Host
from . import terminal
from .layout import Column, fitted_table
from .terminal import error_lines

if TYPE_CHECKING:  # annotations only
    from ..hosts.gpustatus import HostInfo


def hosts_view(hosts: Iterable[Host], infos: Optional[dict[str, HostInfo]] = None) -> Group:
    """The inventory as a compact table; with --check, each host's versions, and each failure on lines of its own
    below the table (a refused host key's trust-host command is never squeezed into a column)."""
    hosts = list(hosts)
    checking = infos is not None
    # Listing, the inventory is the point; checking, what each host has is: then the inventory's columns go first
    # (groups, container, address, arch), then the rarer packages, hostname, python, nvidia-ml-py, triton, torch, and
    # the sandbox last: whether a run's sides can be sandboxed there decides what its numbers are worth.
    columns = [Column("host", [h.name for h in hosts], whole=True),
               Column("address", [h.address for h in hosts], whole=True, drop=3 if checking else 0),
               Column("arch", [h.arch for h in hosts], whole=True, drop=4 if checking else 0),
               Column("container", [h.container or "-" for h in hosts], drop=2),
               Column("groups", [", ".join(h.groups) or "-" for h in hosts], drop=1)]
    failures: list[Text] = []
    if infos is not None:
        checked = [infos[h.name] for h in hosts]
        columns.append(Column("reachable", [Text("yes", style="green") if i.reachable else Text("no", style="red")
                                            for i in checked], whole=True))
        if any(i.slurm is not None or h.is_cluster for h, i in zip(hosts, checked)):
            columns.append(Column("slurm", [_slurm_cell(h, i) for h, i in zip(hosts, checked)], whole=True))
        for header, attribute, drop in (("hostname", "hostname", 7), ("python", "python", 8), ("torch", "torch", 11),
                                        ("triton", "triton", 10), ("nvidia-ml-py", "pynvml", 9),
                                        ("tvm-ffi", "tvm_ffi", 5), ("cutlass-dsl", "cutlass_dsl", 6),
                                        ("sandbox", "sandbox", 12)):
            missing = "?" if attribute in ("hostname", "python") else "missing"
            columns.append(Column(header, [(getattr(i, attribute) or missing) if i.reachable else "" for i in checked],
                                  drop=drop))
        # The error names the host already ("gone: unreachable: ..."); a refused key's message carries its command.
        failures = [line for i in checked if not i.ok for line in error_lines(i.error or f"{i.host}: failed")]
    return Group(fitted_table(columns, terminal.console.width, title="hosts"), *failures)


def _slurm_cell(host: Host, info: "HostInfo") -> Text:
    """A cluster's Slurm check: ok (sinfo, partition, sbatch --test-only all passed) or no (the error below says
    which); "-" for a host without Slurm, "?" where the check could not run."""
    if not host.is_cluster:
        return Text("-", style="dim")
    if info.slurm is None:
        return Text("?", style="red")
    return Text("ok", style="green") if info.slurm.get("ok") else Text("no", style="red")
