"""What each hosts.toml field may hold, in one place: the rules that config.py's plain reader (on every command's
start, without pydantic) and hostsschema.py's pydantic models (the authority on coercions and error wording) share.

plain_tables(data) takes a file only as it is written, each value of exactly its field's type and within its rules,
and returns the tables the pydantic schema would return for it (every field, defaults filled in); anything else (a
value pydantic would coerce, an unknown field, a wrong value) is None: the schema decides, and says why.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Callable, Iterable, Optional

from ..agent import protocol

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


# ------------------------------------------------------------------------------------ the plain reader

def _text(check: Optional[Callable[[Any], Any]] = None) -> Callable[[Any], bool]:
    return lambda value: type(value) is str and _passes(check, value)


def _number(low: float, high: float = math.inf) -> Callable[[Any], bool]:
    """An int or a float (never a bool), finite, above low and at most high."""
    def takes(value: Any) -> bool:
        try:
            return type(value) in (int, float) and math.isfinite(value) and low < value <= high
        except OverflowError:  # an int too large for a float
            return False

    return takes


def _whole(low: int, high: float = math.inf) -> Callable[[Any], bool]:
    return lambda value: type(value) is int and low <= value <= high


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda value: type(value) is str and value in choices


def _texts(check: Callable[[Any], Any]) -> Callable[[Any], bool]:
    return lambda value: type(value) is list and all(type(v) is str for v in value) and _passes(check, value)


def _passes(check: Optional[Callable[[Any], Any]], value: Any) -> bool:
    """check(value) neither raises ValueError nor answers None (a check returns the value, or a match)."""
    try:
        return check is None or check(value) is not None
    except ValueError:
        return False


IDLE_FIELDS: dict[str, tuple[Callable[[Any], bool], Any]] = {
    "max_memory_mib": (_whole(0), protocol.IdlePolicy.max_memory_mib),
    "max_util_pct": (_whole(0, UTIL_PCT_MAX), protocol.IdlePolicy.max_util_pct),
    "allow_processes": (lambda value: type(value) is bool, protocol.IdlePolicy.allow_processes),
}
COMMON_FIELDS: dict[str, tuple[Callable[[Any], bool], Any]] = {  # field: (what it takes as written, its default)
    "remote_root": (_text(check_remote_root), None),
    "python": (_text(), None),
    "connect_timeout": (_number(0, CONNECT_TIMEOUT_MAX_S), None),
    "idle": (lambda value: _plain_idle(value) is not None, None),
    "identity_file": (_text(), None),
    "known_hosts": (_text(), None),
    "ssh_config": (_text(), None),
    "max_summary_mb": (_number(0), None),
}
HOST_FIELDS: dict[str, tuple[Callable[[Any], bool], Any]] = {
    **COMMON_FIELDS,
    "ssh": (_text(check_ssh_target), None),
    "transport": (_one_of(TRANSPORTS), "ssh"),
    "arch": (_one_of(ARCHES), "auto"),
    "container": (_text(lambda value: re.fullmatch(NAME_PATTERN, value)), None),
    "groups": (_texts(check_group_names), []),
    "scheduler": (_one_of(SCHEDULERS), None),
    **{key: (_text(lambda value, key=key: check_slurm_value(key, value)), None) for key in SLURM_KEYS[:-1]},
    "sbatch_args": (_texts(check_sbatch_args), None),
}
FLOAT_FIELDS = ("connect_timeout", "max_summary_mb")


def plain_tables(data: Any) -> Optional[dict[str, Any]]:
    """{"defaults": {...}, "hosts": {name: {...}}} with every field, when data is a hosts file taken as written;
    else None (the pydantic schema decides)."""
    if type(data) is not dict or not set(data) <= {"defaults", "hosts"} or type(data.get("hosts")) is not dict:
        return None
    if not all(type(name) is str for name in data["hosts"]):
        return None
    defaults = _plain_table(data.get("defaults", {}), COMMON_FIELDS)
    hosts = {name: _plain_table(table, HOST_FIELDS) for name, table in data["hosts"].items()}
    if defaults is None or any(table is None for table in hosts.values()):
        return None
    return {"defaults": defaults, "hosts": hosts}


def _plain_table(table: Any, fields: dict[str, tuple[Callable[[Any], bool], Any]]) -> Optional[dict[str, Any]]:
    if type(table) is not dict or not set(table) <= set(fields):
        return None
    if not all(fields[key][0](value) for key, value in table.items()):
        return None
    plain = {key: table.get(key, default) for key, (_, default) in fields.items()}
    plain.update({key: float(plain[key]) for key in FLOAT_FIELDS if plain[key] is not None})
    plain["idle"] = _plain_idle(plain["idle"]) if plain["idle"] is not None else None
    if "groups" in plain:
        plain["groups"] = list(plain["groups"])
    return plain


def _plain_idle(table: Any) -> Optional[dict[str, Any]]:
    if type(table) is not dict or not set(table) <= set(IDLE_FIELDS):
        return None
    if not all(IDLE_FIELDS[key][0](value) for key, value in table.items()):
        return None
    return {key: table.get(key, default) for key, (_, default) in IDLE_FIELDS.items()}
