"""hosts.toml's schema as pydantic models: the authority on what a hosts file may say, its coercions and the words
of its errors (each naming file, table and field). Imported only when config.py's plain reader does not take a file
as it is written: pydantic's start-up is too slow for every command (benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import hostrules as rules
from ..agent import protocol
from ..errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IdlePolicy(_Strict):
    """When a GPU counts as idle (defaults from the users' incident write-up)."""

    max_memory_mib: int = Field(protocol.IdlePolicy.max_memory_mib, ge=0)
    max_util_pct: int = Field(protocol.IdlePolicy.max_util_pct, ge=0, le=rules.UTIL_PCT_MAX)
    allow_processes: bool = protocol.IdlePolicy.allow_processes


class _Common(_Strict):
    remote_root: Optional[str] = None
    python: Optional[str] = None
    connect_timeout: Optional[float] = Field(None, gt=0, le=rules.CONNECT_TIMEOUT_MAX_S)
    idle: Optional[IdlePolicy] = None
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = None
    ssh_config: Optional[str] = None
    max_summary_mb: Optional[float] = Field(None, gt=0)

    @field_validator("remote_root")
    @classmethod
    def _root_is_absolute_or_home(cls, value: Optional[str]) -> Optional[str]:
        return rules.check_remote_root(value)


class DefaultsModel(_Common):
    pass


class HostModel(_Common):
    ssh: Optional[str] = None
    transport: Literal["ssh", "openssh", "paramiko", "local"] = "ssh"  # ssh: the client connect.py picks
    arch: Literal["b200", "h200", "h100", "auto", "any"] = "auto"
    container: Optional[str] = Field(None, pattern=rules.NAME_PATTERN)
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
        return rules.check_slurm_value(info.field_name, value)

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args_are_allowed_options(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        return rules.check_sbatch_args(value)

    @field_validator("ssh")
    @classmethod
    def _ssh_target_is_one_word(cls, value: Optional[str]) -> Optional[str]:
        return rules.check_ssh_target(value)

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        return rules.check_group_names(value)


class HostsFileModel(_Strict):
    defaults: DefaultsModel = DefaultsModel()
    hosts: dict[str, HostModel]


def validated_tables(data: dict[str, Any], file: Path) -> dict[str, Any]:
    """The file's tables as hostrules.plain_tables gives them (every field, defaults filled in), or a ConfigError
    with a line for each thing wrong."""
    try:
        return HostsFileModel.model_validate(data).model_dump()
    except ValidationError as exc:
        raise ConfigError(_describe(exc, file)) from None


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
            message = f"unknown field {field!r}{rules.suggestion(field, _allowed_fields(loc))}"
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
