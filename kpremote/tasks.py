"""The `inv` commands. Each task parses flags, calls one module that does the work, and renders the result."""

from __future__ import annotations

import time
from typing import Optional

from invoke import Collection

from . import gpustatus, view
from .cli import command, finish, print_json
from .config import load_inventory

HOSTS_HELP = "hosts file (default: $KPREMOTE_HOSTS, else ./hosts.toml)"


@command(help={"check": "also connect to each host (in parallel): hostname, python, torch, triton, nvidia-ml-py",
               "hosts": HOSTS_HELP, "json": "print JSON instead of a table"})
def hosts(c, check=False, hosts=None, json=False):
    """List the hosts of hosts.toml (name, address, arch, container, groups); --check reaches each one."""
    inventory = load_inventory(hosts)
    selected = inventory.select(None)
    infos = None
    if check:
        infos = {info.host: info for info in gpustatus.on_every_host(selected, gpustatus.info_host)}
    if json:
        print_json([
            {"name": h.name, "address": h.address, "arch": h.arch, "container": h.container, "groups": list(h.groups),
             **({"check": infos[h.name].model_dump()} if infos else {})}
            for h in selected
        ])
    else:
        view.console.print(view.hosts_table(selected, infos))
    finish(infos is None or all(info.ok for info in infos.values()))


@command(help={"host": "a host name or a group (default: every host)", "hosts": HOSTS_HELP,
               "json": "print the kpremote.gpu-status/1 JSON document (see README)",
               "watch": "refresh every SECONDS until Ctrl-C"})
def gpu_status(c, host=None, hosts=None, json=False, watch: Optional[float] = None):
    """Every GPU of every host, queried in parallel through NVML: memory, util, clocks, processes, lease, idle verdict."""
    selected = load_inventory(hosts).select(host)
    if watch:
        _watch_gpus(selected, float(watch))
        return
    reports = gpustatus.gpu_status(selected)
    if json:
        print_json(gpustatus.gpu_status_json(reports))
    else:
        view.console.print(view.gpu_table(reports))
    finish(all(r.ok for r in reports))


def _watch_gpus(selected, seconds: float) -> None:
    from rich.live import Live

    try:
        with Live(view.gpu_table(gpustatus.gpu_status(selected)), console=view.console, auto_refresh=False) as live:
            while True:
                time.sleep(seconds)
                live.update(view.gpu_table(gpustatus.gpu_status(selected)), refresh=True)
    except KeyboardInterrupt:
        pass


@command(help={"host": "the host whose key to accept", "fingerprint": "the SHA256:... fingerprint you verified",
               "hosts": HOSTS_HELP})
def trust_host(c, host, fingerprint, hosts=None):
    """Add a host's key to known_hosts, only if it has the fingerprint you verified out of band."""
    from .hostkeys import trust

    [selected] = load_inventory(hosts).select(host)
    line = trust(selected, fingerprint)
    view.console.print(f"added to {selected.known_hosts}: {line}")


ns = Collection(hosts, gpu_status, trust_host)
