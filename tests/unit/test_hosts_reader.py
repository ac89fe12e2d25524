"""hosts.toml's two readers agree: whatever the plain reader (hostrules.plain_tables, no pydantic) takes, it reads as
the pydantic schema (hostsschema.py) does; whatever it does not take goes to the schema, which decides and words the
error as before."""

from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kpremote.hosts.config import parse_inventory
from kpremote.errors import ConfigError
from kpremote.hosts.hostrules import HOST_FIELDS, IDLE_FIELDS, plain_tables
from kpremote.hosts.hostsschema import validated_tables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
FILE = Path("hosts.toml")

# Values a TOML file can hold, each near some field's edge: exact types, ones pydantic coerces, ones it refuses.
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
def test_what_the_plain_reader_takes_it_reads_as_the_schema_does(hosts, defaults):
    data = {"hosts": hosts, **({"defaults": defaults} if defaults is not None else {})}
    plain = plain_tables(data)
    if plain is not None:
        assert plain == validated_tables(data, FILE)


def test_the_shipped_file_and_a_full_one_are_read_without_the_schema():
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
    for data in (shipped, full):
        assert plain_tables(data) is not None
        assert plain_tables(data) == validated_tables(data, FILE)


@pytest.mark.parametrize("table", [{"connect_timeout": "10"}, {"connect_timeout": True}, {"groups": ("h200",)},
                                   {"idle": {"allow_processes": "true"}}, {"max_summary_mb": math.inf}])
def test_a_value_pydantic_coerces_is_left_to_it_and_read_as_before(table):
    data = {"hosts": {"a": {"ssh": "a", **table}}}
    assert plain_tables(data) is None
    try:
        expected = validated_tables(data, FILE)
    except ConfigError as exc:
        with pytest.raises(ConfigError) as err:
            parse_inventory(data, FILE)
        assert str(err.value) == str(exc)
        return
    host = parse_inventory(data, FILE).hosts["a"]
    assert host.groups == tuple(expected["hosts"]["a"]["groups"])
    assert host.connect_timeout == float(expected["hosts"]["a"]["connect_timeout"] or 10)
    assert host.idle.allow_processes == (expected["hosts"]["a"]["idle"] or {}).get("allow_processes", False)


def test_an_error_is_worded_by_the_schema():
    data = {"hosts": {"a": {"ssh": "a", "connect_timeout": 601, "contianer": "x"}}}
    assert plain_tables(data) is None
    with pytest.raises(ConfigError) as err:
        parse_inventory(data, FILE)
    assert str(err.value).splitlines() == [
        "hosts.toml: [hosts.a] connect_timeout = 601: Input should be less than or equal to 600",
        "hosts.toml: [hosts.a] unknown field 'contianer' — did you mean 'container'? (known: "
        + ", ".join(HOST_FIELDS) + ")",
    ]
