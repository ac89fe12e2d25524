"""hosts.toml's one reader (hostrules.read_tables): a value is taken as TOML writes it and within its field's rules,
every table comes back with every field, and anything else is refused with a line per thing wrong that names the
file, the table and the field and says what the field takes."""

from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kpremote.errors import ConfigError
from kpremote.hosts.config import parse_inventory
from kpremote.hosts.hostrules import COMMON_FIELDS, HOST_FIELDS, IDLE_FIELDS, read_tables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
FILE = Path("hosts.toml")

# Values a TOML file can hold, each near some field's edge: exact types, quoted numbers and booleans, refusals.
VALUES = st.sampled_from([
    "a", "~/kp", "/abs", "relative", "../x", "/a/../b", "me@host:22", "me@host:0", "host:65536", "@h", "x;y", "x\n",
    "h200", "auto", "b300", "openssh", "paramiko", "local", "ssh", "slurm", "gpu", "gpu:h200:1", "0:30:00", "a b",
    "--mem=4G", "--output=x", "10", "1.5", "true", "yes", "", 0, 1, 5, 100, 101, 600, 601, -1, 2048, 10 ** 19,
    0.5, 3.0, 600.0, 600.5, -0.5, math.inf, math.nan, True, False, [], ["h200"], ["a b"], ["--mem=4G"], ["--x=1"],
    [1], {}, {"max_memory_mib": 100}, {"max_util_pct": 101}, {"allow_processes": "true"}, {"max_util": 3},
    datetime.date(2026, 1, 1),
])
KEYS = st.sampled_from([*HOST_FIELDS, *IDLE_FIELDS, "contianer", "port"])
TABLES = st.dictionaries(KEYS, VALUES, max_size=4)


@settings(max_examples=400, deadline=None)
@given(hosts=st.dictionaries(st.sampled_from(["a", "b", "local", "a b"]), TABLES, min_size=1, max_size=2),
       defaults=st.one_of(st.none(), TABLES))
def test_a_file_is_read_whole_or_refused_with_a_line_per_field_it_names(hosts, defaults):
    data = {"hosts": hosts, **({"defaults": defaults} if defaults is not None else {})}
    try:
        tables = read_tables(data, FILE)
    except ConfigError as exc:
        lines = str(exc).splitlines()
        assert lines and all(line.startswith("hosts.toml: [") for line in lines)
        named = {line.split("] ", 1)[1].split(" ")[0] for line in lines if "] " in line}
        assert named, lines
        return
    assert set(tables["defaults"]) == set(COMMON_FIELDS)
    for name, table in tables["hosts"].items():
        assert set(table) == set(HOST_FIELDS)
        assert table["idle"] is None or set(table["idle"]) == set(IDLE_FIELDS)
        for field, value in hosts[name].items():  # what the file says is what is read, floats as floats
            if field in HOST_FIELDS and field != "idle":
                assert table[field] == value and type(table[field]) in (type(value), float)
    written = {"defaults": as_written(tables["defaults"]),  # what a file would say for them (TOML has no null)
               "hosts": {name: as_written(table) for name, table in tables["hosts"].items()}}
    assert read_tables(written, FILE) == tables  # read again, the tables read the same


def as_written(table: dict) -> dict:
    return {key: as_written(value) if type(value) is dict else value for key, value in table.items()
            if value is not None}


def test_the_shipped_file_and_a_full_one_are_read_as_written():
    shipped = tomllib.loads((REPO / "hosts.toml").read_text())
    full = tomllib.loads("""
[defaults]
remote_root = "~/kp"
python = "python3"
connect_timeout = 10
idle = { max_memory_mib = 2048, max_util_pct = 5, allow_processes = false }
known_hosts = "~/.ssh/known_hosts"
max_summary_mb = 20.5
[hosts.a]
ssh = "me@a:2200"
transport = "openssh"
arch = "h200"
container = "box"
groups = ["h200"]
identity_file = "~/.ssh/id"
ssh_config = "~/.ssh/config"
[hosts.c]
ssh = "login"
scheduler = "slurm"
partition = "gpu"
gres = "gpu:h200:1"
time_limit = "0:30:00"
sbatch_args = ["--mem=4G"]
[hosts.local]
transport = "local"
""")
    read_tables(shipped, FILE)
    tables = read_tables(full, FILE)
    assert tables["defaults"]["connect_timeout"] == 10.0 and type(tables["defaults"]["connect_timeout"]) is float
    assert tables["defaults"]["idle"] == {"max_memory_mib": 2048, "max_util_pct": 5, "allow_processes": False}
    assert tables["hosts"]["a"]["groups"] == ["h200"] and tables["hosts"]["c"]["sbatch_args"] == ["--mem=4G"]
    assert tables["hosts"]["local"]["transport"] == "local" and tables["hosts"]["local"]["arch"] == "auto"


@pytest.mark.parametrize("table, line", [
    ({"connect_timeout": "10"}, "[hosts.a] connect_timeout = '10': expected a number (without quotes)"),
    ({"connect_timeout": True}, "[hosts.a] connect_timeout = True: expected a number (without quotes)"),
    ({"idle": {"allow_processes": "true"}},
     "[hosts.a.idle] allow_processes = 'true': expected true or false (without quotes)"),
    ({"idle": {"max_memory_mib": 1.0}}, "[hosts.a.idle] max_memory_mib = 1.0: expected a whole number"),
    ({"max_summary_mb": math.inf}, "[hosts.a] max_summary_mb = inf: must be above 0 (and finite)"),
    ({"groups": "h200"}, "[hosts.a] groups = 'h200': expected a list of strings"),
    ({"container": "x;y"}, "[hosts.a] container = 'x;y': letters, digits, '.', '_' and '-' only"),
])
def test_a_value_not_as_its_field_takes_it_is_refused_naming_what_it_takes(table, line):
    with pytest.raises(ConfigError) as err:
        parse_inventory({"hosts": {"a": {"ssh": "a", **table}}}, FILE)
    assert str(err.value).startswith(f"hosts.toml: {line}"), str(err.value)


def test_every_thing_wrong_is_said_at_once():
    data = {"hosts": {"a": {"ssh": "a", "connect_timeout": 601, "contianer": "x"}}, "defualts": {}}
    with pytest.raises(ConfigError) as err:
        parse_inventory(data, FILE)
    assert str(err.value).splitlines() == [
        "hosts.toml: [(top level)] unknown field 'defualts' — did you mean 'defaults'? (known: defaults, hosts)",
        "hosts.toml: [hosts.a] connect_timeout = 601: must be above 0 and at most 600",
        "hosts.toml: [hosts.a] unknown field 'contianer' — did you mean 'container'? (known: "
        + ", ".join(HOST_FIELDS) + ")",
    ]


@pytest.mark.parametrize("data, line", [
    ({}, "[(top level)] hosts is required"),
    ({"hosts": 3}, "[(top level)] hosts = 3: expected a [hosts.NAME] table for each host"),
    ({"hosts": {"a": "x"}}, "[hosts.a] = 'x': expected a table"),
    ({"hosts": {"a": {"ssh": "a", "idle": 3}}}, "[hosts.a.idle] = 3: expected a table"),
])
def test_a_file_of_another_shape_is_refused_naming_the_table(data, line):
    with pytest.raises(ConfigError) as err:
        read_tables(data, FILE)
    assert str(err.value).startswith(f"hosts.toml: {line}"), str(err.value)
