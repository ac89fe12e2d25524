"""hosts.toml's one reader: what each field may hold, and the file's tables read by those rules (read_tables).

A value is taken as TOML writes it, of exactly its field's type ("10" is not a number, 1 is not true) and within its
rules; read_tables returns every table with every field (defaults filled in) or refuses the file with one line per
thing wrong, each naming the file, the table and the field, and saying what the field takes. config.py makes the
Host records from the tables. Standard library only: the file is read on every command's start.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..agent import protocol
from ..errors import ConfigError

NAME_PATTERN = f"^{protocol.NAME_PATTERN}$"
ARCHES = ("b200", "h200", "h100", "auto", "any")
TRANSPORTS = ("ssh", "openssh", "paramiko", "local")  # ssh: the client connect.py picks
SCHEDULERS = ("slurm",)
CONNECT_TIMEOUT_MAX_S = 600
UTIL_PCT_MAX = 100

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


def suggestion(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    hint = f" — did you mean {close[0]!r}?" if close else ""
    return f"{hint} (known: {', '.join(choices)})" if choices else hint


# ------------------------------------------------------------------------------------ the checks of single values

def check_sbatch_arg(arg: str) -> None:
    """One extra sbatch option: `--key=value` with key on the allow-list and a value without control characters."""
    if not isinstance(arg, str) or not arg.startswith("--") or "=" not in arg:
        raise ValueError(f"{arg!r}: write each option as '--key=value'")
    key, value = arg[2:].split("=", 1)
    if key in SBATCH_OWN:
        raise ValueError(f"{arg!r}: use the host's {SBATCH_OWN[key]} field instead")
    if key not in SBATCH_ALLOWED:
        raise ValueError(f"{arg!r}: --{key} is not allowed{suggestion(key, SBATCH_ALLOWED)}")
    if not value or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{arg!r}: the value must be non-empty, without control characters")


def check_sbatch_args(value: Optional[list[str]]) -> Optional[list[str]]:
    for arg in value or []:
        check_sbatch_arg(arg)
    return value


def check_remote_root(value: Optional[str]) -> Optional[str]:
    if value is None:
        return value
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise ValueError("must be an absolute path or start with ~/")
    if any(part == ".." for part in value.split("/")):
        raise ValueError("must not contain '..'")
    return value


def check_slurm_value(field: str, value: Optional[str]) -> Optional[str]:
    pattern, form = SLURM_FORMS[field]
    if value is not None and not re.fullmatch(pattern, value):
        raise ValueError(f"expected {form}")
    return value


def check_ssh_target(value: Optional[str]) -> Optional[str]:
    if value is not None and not re.fullmatch(r"[A-Za-z0-9_.@:\[\]-]+", value):
        raise ValueError("must be an ~/.ssh/config alias or user@host[:port] (letters, digits, . _ - @ : only)")
    if value is not None:
        check_user_host_port(value)
    return value


def check_user_host_port(target: str) -> None:
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


def check_group_names(value: list[str]) -> list[str]:
    for group in value:
        if not re.fullmatch(NAME_PATTERN, group):
            raise ValueError(f"group {group!r} must match {NAME_PATTERN}")
    return value


# ------------------------------------------------------------------------------------ the reader

Read = Callable[[Any], Any]
"""A field's reader: the value as the tables hold it, or ValueError saying what the field takes."""


def text(check: Optional[Callable[[str], Any]] = None) -> Read:
    """A string; check(value) raises ValueError for one outside the field's rules."""
    def read(value: Any) -> str:
        if type(value) is not str:
            raise ValueError("expected a string (in quotes)")
        if check is not None:
            check(value)
        return value

    return read


def number(low: float, high: float = math.inf) -> Read:
    """An int or a float (never a bool), finite, above low and at most high; read as a float."""
    def read(value: Any) -> float:
        if type(value) not in (int, float):
            raise ValueError("expected a number (without quotes)")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite or not low < value <= high:
            raise ValueError(f"must be above {low:g}" + (f" and at most {high:g}" if math.isfinite(high) else "")
                             + ("" if finite else " (and finite)"))
        return float(value)

    return read


def whole(low: int, high: float = math.inf) -> Read:
    def read(value: Any) -> int:
        if type(value) is not int:
            raise ValueError("expected a whole number (without quotes)")
        if not low <= value <= high:
            raise ValueError(f"must be at least {low}" + (f" and at most {high:g}" if math.isfinite(high) else ""))
        return value

    return read


def one_of(choices: tuple[str, ...]) -> Read:
    names = [repr(choice) for choice in choices]
    allowed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

    def read(value: Any) -> str:
        if type(value) is not str or value not in choices:
            raise ValueError(f"allowed: {allowed}")
        return value

    return read


def boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError("expected true or false (without quotes)")
    return value


def texts(check: Callable[[list[str]], Any]) -> Read:
    def read(value: Any) -> list[str]:
        if type(value) is not list or not all(type(v) is str for v in value):
            raise ValueError('expected a list of strings, e.g. ["a", "b"]')
        check(value)
        return list(value)

    return read


def check_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(protocol.NAME_RULE)
    return value


Fields = dict[str, tuple[Any, Any]]
"""A table's fields: name -> (its reader, or the Fields of a table inside it; its default)."""
IDLE_FIELDS: Fields = {
    "max_memory_mib": (whole(0), protocol.IdlePolicy.max_memory_mib),
    "max_util_pct": (whole(0, UTIL_PCT_MAX), protocol.IdlePolicy.max_util_pct),
    "allow_processes": (boolean, protocol.IdlePolicy.allow_processes),
}
COMMON_FIELDS: Fields = {  # what [defaults] and each host may set: (its reader, its default)
    "remote_root": (text(check_remote_root), None),
    "python": (text(), None),
    "connect_timeout": (number(0, CONNECT_TIMEOUT_MAX_S), None),
    "idle": (IDLE_FIELDS, None),  # [hosts.NAME.idle], or an inline table
    "identity_file": (text(), None),
    "known_hosts": (text(), None),
    "ssh_config": (text(), None),
    "max_summary_mb": (number(0), None),
}
HOST_FIELDS: Fields = {
    **COMMON_FIELDS,
    "ssh": (text(check_ssh_target), None),
    "transport": (one_of(TRANSPORTS), "ssh"),
    "arch": (one_of(ARCHES), "auto"),
    "container": (text(check_name), None),
    "groups": (texts(check_group_names), []),
    "scheduler": (one_of(SCHEDULERS), None),
    **{key: (text(lambda value, key=key: check_slurm_value(key, value)), None) for key in SLURM_KEYS[:-1]},
    "sbatch_args": (texts(check_sbatch_args), None),
}
TOP_FIELDS = ("defaults", "hosts")


def read_tables(data: Any, file: Path) -> dict[str, Any]:
    """{"defaults": {...}, "hosts": {name: {...}}}, every field there with its default where the file has none; or
    ConfigError with a line for each thing wrong, naming the file, the table and the field."""
    problems: list[str] = []
    if type(data) is not dict:
        raise ConfigError(f"{file}: [(top level)] expected tables of hosts")
    for key in data:
        if key not in TOP_FIELDS:
            problems.append(f"[(top level)] unknown field {key!r}{suggestion(str(key), TOP_FIELDS)}")
    defaults = read_table("defaults", data.get("defaults", {}), COMMON_FIELDS, problems)
    hosts: dict[str, Any] = {}
    if "hosts" not in data:
        problems.append("[(top level)] hosts is required: a [hosts.NAME] table for each host")
    elif type(data["hosts"]) is not dict:
        problems.append(f"[(top level)] hosts = {data['hosts']!r}: expected a [hosts.NAME] table for each host")
    else:
        hosts = {name: read_table(f"hosts.{name}", table, HOST_FIELDS, problems)
                 for name, table in data["hosts"].items()}
    if problems:
        raise ConfigError("\n".join(f"{file}: {problem}" for problem in problems))
    return {"defaults": defaults, "hosts": hosts}


def read_table(where: str, table: Any, fields: Fields, problems: list[str]) -> dict[str, Any]:
    """The table with every field (read, or its default); what is wrong goes to problems, a line each."""
    if type(table) is not dict:
        problems.append(f"[{where}] = {table!r}: expected a table")
        return {}
    read = {key: default for key, (_, default) in fields.items()}
    for key, value in table.items():
        if key not in fields:
            problems.append(f"[{where}] unknown field {key!r}{suggestion(str(key), fields)}")
        elif isinstance(fields[key][0], dict):
            read[key] = read_table(f"{where}.{key}", value, fields[key][0], problems)
        else:
            try:
                read[key] = fields[key][0](value)
            except ValueError as exc:
                problems.append(f"[{where}] {key} = {value!r}: {exc}")
    return read
