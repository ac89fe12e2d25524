"""hosts.toml: the host inventory, validated with pydantic, with errors that name file, table and field."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .agent import protocol
from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

NAME_PATTERN = f"^{protocol.NAME_PATTERN}$"
ARCHES = ("b200", "h200", "h100", "auto", "any")
HOSTS_ENV = "KPREMOTE_HOSTS"

# Slurm settings (issue 15). They reach sbatch as separate argv words, never through a shell; the patterns keep
# them to what Slurm itself accepts, so a typo is refused here and not by a job that fails later.
SLURM_KEYS = ("partition", "account", "qos", "gres", "time_limit", "constraint", "sbatch_args")
SLURM_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
SLURM_LIST_PATTERN = r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$"
SLURM_GRES_PATTERN = r"^[a-z][a-z0-9_]*(:[A-Za-z0-9_.-]+)?(:[0-9]+)?(,[a-z][a-z0-9_]*(:[A-Za-z0-9_.-]+)?(:[0-9]+)?)*$"
SLURM_TIME_PATTERN = r"^([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}$|^(UNLIMITED|INFINITE)$"
SLURM_CONSTRAINT_PATTERN = r"^[A-Za-z0-9_.&|*:,()\[\]!-]+$"
SLURM_FORMS = {
    "partition": (SLURM_LIST_PATTERN, "a partition name, or several separated by commas (e.g. \"gpu\")"),
    "account": (SLURM_NAME_PATTERN, "an account name (letters, digits, '_', '.', '-')"),
    "qos": (SLURM_NAME_PATTERN, "a QOS name (letters, digits, '_', '.', '-')"),
    "gres": (SLURM_GRES_PATTERN, "NAME[:TYPE][:COUNT], comma-separated (e.g. \"gpu:h200:1\")"),
    "time_limit": (SLURM_TIME_PATTERN, "Slurm's time form: MINUTES, HH:MM:SS or D-HH:MM:SS (e.g. \"0:30:00\")"),
    "constraint": (SLURM_CONSTRAINT_PATTERN, "a feature expression without spaces (e.g. \"h200&ib\")"),
}
# Extra sbatch options a hosts.toml may add. The ones kpremote sets itself (output, chdir, job-name, requeue,
# export, wrap, ...) are not here: a run's record and folder depend on them.
SBATCH_ALLOWED = ("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu", "gpus", "gpus-per-node",
                  "gpu-bind", "nodelist", "exclude", "reservation", "nice", "comment", "wckey", "licenses",
                  "tmp", "hint", "exclusive", "mail-type", "mail-user", "clusters", "begin", "deadline",
                  "priority", "distribution", "ntasks", "nodes")
SBATCH_OWN = {"partition": "partition", "p": "partition", "account": "account", "A": "account", "qos": "qos",
              "q": "qos", "gres": "gres", "time": "time_limit", "t": "time_limit", "constraint": "constraint",
              "C": "constraint"}


def check_sbatch_arg(arg: str) -> None:
    """One extra sbatch option: `--key=value` with key on the allow-list and a value without control characters."""
    if not isinstance(arg, str) or not arg.startswith("--") or "=" not in arg:
        raise ValueError(f"{arg!r}: write each option as '--key=value'")
    key, value = arg[2:].split("=", 1)
    if key in SBATCH_OWN:
        raise ValueError(f"{arg!r}: use the host's {SBATCH_OWN[key]} field instead")
    if key not in SBATCH_ALLOWED:
        raise ValueError(f"{arg!r}: --{key} is not allowed{_suggestion(key, SBATCH_ALLOWED)}")
    if not value or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{arg!r}: the value must be non-empty, without control characters")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IdlePolicy(_Strict):
    """When a GPU counts as idle (defaults from the users' incident write-up)."""

    max_memory_mib: int = Field(protocol.IdlePolicy.max_memory_mib, ge=0)
    max_util_pct: int = Field(protocol.IdlePolicy.max_util_pct, ge=0, le=100)
    allow_processes: bool = protocol.IdlePolicy.allow_processes


class _Common(_Strict):
    remote_root: Optional[str] = None
    python: Optional[str] = None
    connect_timeout: Optional[float] = Field(None, gt=0, le=600)
    idle: Optional[IdlePolicy] = None
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = None
    ssh_config: Optional[str] = None
    max_summary_mb: Optional[float] = Field(None, gt=0)

    @field_validator("remote_root")
    @classmethod
    def _root_is_absolute_or_home(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        if not (value.startswith("/") or value == "~" or value.startswith("~/")):
            raise ValueError("must be an absolute path or start with ~/")
        if any(part == ".." for part in value.split("/")):
            raise ValueError("must not contain '..'")
        return value


class DefaultsModel(_Common):
    pass


class HostModel(_Common):
    ssh: Optional[str] = None
    transport: Literal["ssh", "openssh", "paramiko", "local"] = "ssh"  # ssh: the client connect.py picks
    arch: Literal["b200", "h200", "h100", "auto", "any"] = "auto"
    container: Optional[str] = Field(None, pattern=NAME_PATTERN)
    groups: list[str] = []
    # --- Slurm (issue 15): `ssh` is then the login node; the other keys become sbatch options (docs/slurm.md)
    scheduler: Optional[Literal["slurm"]] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    gres: Optional[str] = None
    time_limit: Optional[str] = None
    constraint: Optional[str] = None
    sbatch_args: Optional[list[str]] = None

    @field_validator("partition", "account", "qos", "gres", "time_limit", "constraint")
    @classmethod
    def _slurm_value_has_slurms_form(cls, value: Optional[str], info: Any) -> Optional[str]:
        pattern, form = SLURM_FORMS[info.field_name]
        if value is not None and not re.fullmatch(pattern, value):
            raise ValueError(f"expected {form}")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args_are_allowed_options(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        for arg in value or []:
            check_sbatch_arg(arg)
        return value

    @field_validator("ssh")
    @classmethod
    def _ssh_target_is_one_word(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.@:\[\]-]+", value):
            raise ValueError("must be an ~/.ssh/config alias or user@host[:port] (letters, digits, . _ - @ : only)")
        if value is not None:
            _check_user_host_port(value)
        return value

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        for group in value:
            if not re.fullmatch(NAME_PATTERN, group):
                raise ValueError(f"group {group!r} must match {NAME_PATTERN}")
        return value


def _check_user_host_port(target: str) -> None:
    """user@host:port as the SSH connection reads it: a user and a host when written, and a port from 1 to 65535
    after a single ':' (more than one ':' is an IPv6 address, without a port)."""
    user, at, host_port = target.rpartition("@")
    if at and not user:
        raise ValueError("nothing before '@': write user@host, or leave the user out")
    if host_port.count(":") != 1:
        if not host_port:
            raise ValueError("no host after '@'")
        return
    host, _, port = host_port.partition(":")
    if not host:
        raise ValueError("no host before ':'")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"port {port!r} after ':' is not a port number (1 to 65535)")


class HostsFileModel(_Strict):
    defaults: DefaultsModel = DefaultsModel()
    hosts: dict[str, HostModel]


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
    idle: IdlePolicy
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


def _suggestion(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    hint = f" — did you mean {close[0]!r}?" if close else ""
    return f"{hint} (known: {', '.join(choices)})" if choices else hint


def find_hosts_file(explicit: Optional[str] = None) -> Path:
    """--hosts FILE, else $KPREMOTE_HOSTS, else the project's hosts.toml (project.py), else the user's."""
    from .project import default_hosts_file

    if explicit:
        return Path(explicit)
    if os.environ.get(HOSTS_ENV):
        return Path(os.environ[HOSTS_ENV])
    return default_hosts_file()


def load_inventory(path: Optional[str | Path] = None) -> Inventory:
    """The hosts of --hosts FILE or $KPREMOTE_HOSTS alone; else the project's, with the user's own file
    (~/.config/kpremote/hosts.toml) layered over them: its hosts added, a host of the same name replaced whole, each
    file's [defaults] applying to its own hosts."""
    from .project import user_hosts_file

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
    try:
        model = HostsFileModel.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, file)) from None
    hosts = {}
    for name, spec in model.hosts.items():
        if not re.fullmatch(NAME_PATTERN, name):
            raise ConfigError(f"{file}: [hosts.{name}]: host names may use letters, digits, '.', '_' and '-' only")
        if spec.transport != "local" and not spec.ssh:
            raise ConfigError(f"{file}: [hosts.{name}] ssh is missing: an ~/.ssh/config alias or user@host[:port]")
        stray = [key for key in SLURM_KEYS if getattr(spec, key) is not None] if spec.scheduler is None else []
        if stray:
            raise ConfigError(f"{file}: [hosts.{name}] {stray[0]}: a Slurm setting, but the host has no "
                              'scheduler = "slurm"')
        hosts[name] = _resolve(name, spec, model.defaults)
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
    from .project import find_root

    return str((find_root() or Path.cwd()).resolve() / LOCAL_ROOT)


def _resolve(name: str, spec: HostModel, defaults: DefaultsModel) -> Host:
    def pick(field: str, fallback: Any) -> Any:
        value = getattr(spec, field)
        if value is None:
            value = getattr(defaults, field)
        return fallback if value is None else value

    local = spec.transport == "local"
    return Host(
        name=name,
        transport=spec.transport,
        ssh=spec.ssh,
        arch=spec.arch,
        container=spec.container,
        # The local host's runs belong to this checkout (the folder the commands run in, which holds kernels/):
        # another checkout's `inv status --host local` must not list them. [defaults] remote_root describes the
        # remote hosts, so only the local table's own remote_root overrides that.
        remote_root=(spec.remote_root or local_remote_root()) if local else pick("remote_root", "~/kpremote"),
        # The local host runs the agent with the interpreter kpremote itself runs under (it has torch there):
        # [defaults] python describes the remote hosts, so only the local table's own python overrides that.
        python=(spec.python or sys.executable) if local else pick("python", "python3"),
        connect_timeout=float(pick("connect_timeout", 10)),
        idle=pick("idle", IdlePolicy()),
        groups=tuple(spec.groups),
        identity_file=pick("identity_file", None),
        known_hosts=pick("known_hosts", "~/.ssh/known_hosts"),
        ssh_config=pick("ssh_config", None),
        max_summary_mb=float(pick("max_summary_mb", 20)),
        scheduler=spec.scheduler,
        slurm={key: getattr(spec, key) for key in SLURM_KEYS} if spec.scheduler else None,
    )


def _describe(exc: ValidationError, file: Path) -> str:
    """Turn pydantic's report into lines that name the table and field and say what is allowed."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        table, field = _table_and_field(loc)
        where = f"[{table}] {field}" if field else f"[{table}]"
        kind = error["type"]
        if kind == "extra_forbidden":
            where = f"[{table}]"
            message = f"unknown field {field!r}{_suggestion(field, _allowed_fields(loc))}"
        elif kind == "literal_error":
            message = f"= {error.get('input')!r}: allowed: {error['ctx']['expected']}"
        elif kind == "missing":
            message = "is required"
        else:
            message = f"= {error.get('input')!r}: {error['msg']}"
        lines.append(f"{file}: {where} {message}")
    return "\n".join(lines)


def _table_and_field(loc: list[str]) -> tuple[str, str]:
    if loc and loc[0] == "hosts" and len(loc) >= 2:
        rest = loc[2:]
        table = f"hosts.{loc[1]}"
    elif loc and loc[0] == "defaults":
        rest = loc[1:]
        table = "defaults"
    else:
        return "(top level)", ".".join(loc)
    if len(rest) >= 2 and rest[0] == "idle":
        return f"{table}.idle", ".".join(rest[1:])
    return table, ".".join(rest)


def _allowed_fields(loc: list[str]) -> list[str]:
    if loc[0] == "hosts" and len(loc) >= 4 and loc[2] == "idle":
        return list(IdlePolicy.model_fields)
    if loc[0] == "defaults" and len(loc) >= 3 and loc[1] == "idle":
        return list(IdlePolicy.model_fields)
    if loc[0] == "hosts":
        return list(HostModel.model_fields)
    if loc[0] == "defaults":
        return list(DefaultsModel.model_fields)
    return list(HostsFileModel.model_fields)
