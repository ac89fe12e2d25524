"""hosts.toml: the host inventory, with errors that name file, table and field.

The file's tables are read by hostrules.read_tables (each field's rules, in one place); this module makes the Host
records from them: [defaults] applied, the rules that span fields (ssh for a remote host, Slurm settings only with
scheduler = "slurm", a group named like no host), and the user's own file layered over the project's."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..agent import protocol
from ..errors import ConfigError
from .hostrules import NAME_PATTERN, SLURM_KEYS, read_tables, suggestion as _suggestion

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

HOSTS_ENV = "KPREMOTE_HOSTS"


@dataclass(frozen=True)
class Host:
    """One host with the file's defaults applied: what the rest of kpremote works with."""

    name: str
    transport: str
    ssh: Optional[str]
    arch: str
    container: Optional[str]
    remote_root: str
    python: str
    connect_timeout: float
    idle: protocol.IdlePolicy
    groups: tuple[str, ...]
    identity_file: Optional[str]
    known_hosts: str
    ssh_config: Optional[str]
    max_summary_mb: float
    scheduler: Optional[str] = None
    slurm: Optional[dict[str, Any]] = None  # partition, account, ... sbatch_args as in hosts.toml (None: unset)

    @property
    def is_cluster(self) -> bool:
        return self.scheduler == "slurm"

    @property
    def address(self) -> str:
        return "(this machine)" if self.transport == "local" else (self.ssh or "")


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict[str, Host]
    layers: tuple[Path, ...] = ()  # files layered over path (the user's own hosts): their hosts added or replaced
    chosen: bool = False  # path was named (--hosts FILE, $KPREMOTE_HOSTS), not found

    @property
    def files(self) -> str:
        return " + ".join(str(p) for p in (self.path, *self.layers))

    def select(self, name_or_group: Optional[str]) -> list[Host]:
        """All hosts, one host by name, or every host of a group; unknown names suggest the closest."""
        if not name_or_group:
            return list(self.hosts.values())
        if name_or_group in self.hosts:
            return [self.hosts[name_or_group]]
        members = [h for h in self.hosts.values() if name_or_group in h.groups]
        if members:
            return members
        known = sorted(set(self.hosts) | {g for h in self.hosts.values() for g in h.groups})
        raise ConfigError(f"{self.files}: unknown host or group {name_or_group!r}{_suggestion(name_or_group, known)}"
                          f"{'' if self.layers else OWN_HOSTS_HINT}")


OWN_HOSTS_HINT = "; list your own hosts in ~/.config/kpremote/hosts.toml: it layers over the project's"


def find_hosts_file(explicit: Optional[str] = None) -> Path:
    """--hosts FILE, else $KPREMOTE_HOSTS, else the project's hosts.toml (project.py), else the user's."""
    from ..project import default_hosts_file

    if explicit:
        return Path(explicit)
    if os.environ.get(HOSTS_ENV):
        return Path(os.environ[HOSTS_ENV])
    return default_hosts_file()


def load_inventory(path: Optional[str | Path] = None) -> Inventory:
    """The hosts of --hosts FILE or $KPREMOTE_HOSTS alone; else the project's, with the user's own file
    (~/.config/kpremote/hosts.toml) layered over them: its hosts added, a host of the same name replaced whole, each
    file's [defaults] applying to its own hosts."""
    from ..project import user_hosts_file

    file = find_hosts_file(str(path) if path else None)
    inventory = read_inventory(file)
    if path or os.environ.get(HOSTS_ENV):
        return dataclasses.replace(inventory, chosen=True)
    user = user_hosts_file()
    if user is None or user.resolve() == file.resolve():
        return inventory
    return Inventory(path=file, hosts={**inventory.hosts, **read_inventory(user).hosts}, layers=(user,))


def read_inventory(file: Path) -> Inventory:
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such hosts file (use --hosts FILE or set {HOSTS_ENV}, run inside a project "
                          "with a hosts.toml, or write ~/.config/kpremote/hosts.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_inventory(data, file)


def parse_inventory(data: dict[str, Any], file: Path) -> Inventory:
    tables = read_tables(data, file)
    hosts = {}
    for name, spec in tables["hosts"].items():
        if not re.fullmatch(NAME_PATTERN, name):
            raise ConfigError(f"{file}: [hosts.{name}]: host names may use letters, digits, '.', '_' and '-' only")
        if spec["transport"] != "local" and not spec["ssh"]:
            raise ConfigError(f"{file}: [hosts.{name}] ssh is missing: an ~/.ssh/config alias or user@host[:port]")
        stray = [key for key in SLURM_KEYS if spec[key] is not None] if spec["scheduler"] is None else []
        if stray:
            raise ConfigError(f"{file}: [hosts.{name}] {stray[0]}: a Slurm setting, but the host has no "
                              'scheduler = "slurm"')
        hosts[name] = _resolve(name, spec, tables["defaults"])
    for name, host in hosts.items():
        for group in host.groups:
            if group in hosts or group == "local":
                raise ConfigError(f"{file}: [hosts.{name}] groups: {group!r} is also a host's name, so --host {group} "
                                  "could not mean the group: name the group otherwise")
    return Inventory(path=file, hosts=hosts)


LOCAL_ROOT = Path(".kpremote") / "local"


def local_remote_root() -> str:
    """The `local` host's default remote root: .kpremote/local in this checkout (the project root that holds
    hosts.toml, found from the working folder; the working folder itself outside any project)."""
    from ..project import find_root

    return str((find_root() or Path.cwd()).resolve() / LOCAL_ROOT)


def _resolve(name: str, spec: dict[str, Any], defaults: dict[str, Any]) -> Host:
    def pick(field: str, fallback: Any) -> Any:
        value = spec[field]
        if value is None:
            value = defaults[field]
        return fallback if value is None else value

    local = spec["transport"] == "local"
    return Host(
        name=name,
        transport=spec["transport"],
        ssh=spec["ssh"],
        arch=spec["arch"],
        container=spec["container"],
        # The local host's runs belong to this checkout (the folder the commands run in, which holds kernels/):
        # another checkout's `inv status --host local` must not list them. [defaults] remote_root describes the
        # remote hosts, so only the local table's own remote_root overrides that.
        remote_root=(spec["remote_root"] or local_remote_root()) if local else pick("remote_root", "~/kpremote"),
        # The local host runs the agent with the interpreter kpremote itself runs under (it has torch there):
        # [defaults] python describes the remote hosts, so only the local table's own python overrides that.
        python=(spec["python"] or sys.executable) if local else pick("python", "python3"),
        connect_timeout=float(pick("connect_timeout", 10)),
        idle=protocol.IdlePolicy(**pick("idle", {})),
        groups=tuple(spec["groups"]),
        identity_file=pick("identity_file", None),
        known_hosts=pick("known_hosts", "~/.ssh/known_hosts"),
        ssh_config=pick("ssh_config", None),
        max_summary_mb=float(pick("max_summary_mb", 20)),
        scheduler=spec["scheduler"],
        slurm={key: spec[key] for key in SLURM_KEYS} if spec["scheduler"] else None,
    )
