from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kpremote.hosts.config import load_inventory, parse_inventory
from kpremote.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_shipped_inventory_has_the_users_hosts():
    inventory = load_inventory(REPO / "hosts.toml")
    assert {"local", "ion-b200", "ion8-h200", "ion9-h200"} <= set(inventory.hosts)
    assert [h.name for h in inventory.select("h200")] == ["ion8-h200", "ion9-h200"]
    assert all(inventory.hosts[n].container == "sglang_bbuf" for n in ("ion-b200", "ion8-h200", "ion9-h200"))
    assert inventory.hosts["ion-b200"].remote_root == "/home/sglang-omni/bbuf/kda_runs"
    assert inventory.hosts["ion8-h200"].remote_root == "~/kpremote"  # from [defaults]


def test_defaults_apply_and_local_uses_this_python(tmp_path):
    inventory = load_inventory(write(tmp_path, """
[defaults]
connect_timeout = 3
python = "/opt/conda/bin/python3"
idle = { max_memory_mib = 100 }
[hosts.a]
ssh = "me@example:2200"
[hosts.local]
transport = "local"
"""))
    a = inventory.hosts["a"]
    assert (a.connect_timeout, a.idle.max_memory_mib, a.idle.max_util_pct) == (3, 100, 5)
    assert a.python == "/opt/conda/bin/python3"
    assert inventory.hosts["local"].python == sys.executable  # [defaults] python is for the remote hosts


@pytest.mark.parametrize("text, expected", [
    ('[hosts.a]\nssh = "a"\narch = "b300"', "[hosts.a] arch = 'b300': allowed: 'b200', 'h200', 'h100', 'auto' or 'any'"),
    ('[hosts.a]\nssh = "a"\ntransport = "libssh"',
     "[hosts.a] transport = 'libssh': allowed: 'ssh', 'openssh', 'paramiko' or 'local'"),
    ('[hosts.a]\ntransport = "openssh"', "[hosts.a] ssh is missing"),
    ('[hosts.a]\nssh = "a"\ncontianer = "x"', "[hosts.a] unknown field 'contianer' — did you mean 'container'?"),
    ('[hosts.a]\nssh = "a"\nidle = { max_util = 3 }', "[hosts.a.idle] unknown field 'max_util' — did you mean 'max_util_pct'?"),
    ('[defaults]\nconnect_timeout = -1\n[hosts.a]\nssh = "a"', "[defaults] connect_timeout = -1"),
    ('[hosts.a]\narch = "h200"', "[hosts.a] ssh is missing"),
    ('[hosts.a]\nssh = "a; rm -rf /"', "[hosts.a] ssh = 'a; rm -rf /'"),
    ('[hosts.a]\nssh = "a"\nremote_root = "relative/dir"', "[hosts.a] remote_root = 'relative/dir': must be an absolute path"),
    ('[hosts."a b"]\nssh = "a"', "[hosts.a b]: host names may use"),
    ('[hosts.a]\nssh = "a"\ncontainer = "x;y"', "[hosts.a] container = 'x;y'"),
    ('[hosts.a\nssh = "a"', "not valid TOML"),
    ('[hosts.gpu1]\nssh = "user@gpu1:notaport"', "[hosts.gpu1] ssh = 'user@gpu1:notaport': port 'notaport'"),
    ('[hosts.gpu1]\nssh = "user@gpu1:"', "[hosts.gpu1] ssh = 'user@gpu1:': port '' after ':'"),
    ('[hosts.gpu1]\nssh = "gpu1:65536"', "[hosts.gpu1] ssh = 'gpu1:65536': port '65536'"),
    ('[hosts.gpu1]\nssh = "@gpu1"', "[hosts.gpu1] ssh = '@gpu1': nothing before '@'"),
    ('[hosts.gpu1]\nssh = "me@"', "[hosts.gpu1] ssh = 'me@': no host after '@'"),
    ('[hosts.gpu1]\nssh = "me@:22"', "[hosts.gpu1] ssh = 'me@:22': no host before ':'"),
    ('[hosts.a]\nssh = "a"\ngroups = ["b"]\n[hosts.b]\nssh = "b"', "[hosts.a] groups: 'b' is also a host's name"),
    ('[hosts.a]\nssh = "a"\ngroups = ["local"]', "[hosts.a] groups: 'local' is also a host's name"),
])
def test_errors_name_file_table_and_field(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert str(err.value).startswith(str(path) + ": ")
    assert expected in str(err.value)


def test_unknown_host_suggests_the_closest(tmp_path):
    inventory = load_inventory(REPO / "hosts.toml")
    with pytest.raises(ConfigError, match="unknown host or group 'ion8-h20' — did you mean 'ion8-h200'"):
        inventory.select("ion8-h20")


def test_hosts_file_from_environment(tmp_path, monkeypatch):
    path = write(tmp_path, '[hosts.only]\ntransport = "local"')
    monkeypatch.setenv("KPREMOTE_HOSTS", str(path))
    assert list(load_inventory().hosts) == ["only"]


def test_missing_file_says_how_to_choose_one(tmp_path):
    with pytest.raises(ConfigError, match="no such hosts file .*--hosts FILE"):
        load_inventory(tmp_path / "nope.toml")


toml_values = st.recursive(
    st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["defaults", "hosts", "junk"]),
                       st.dictionaries(st.text(max_size=8), toml_values, max_size=3), max_size=3))
def test_any_document_gives_a_clean_error_or_an_inventory(data):
    try:
        parse_inventory(data, Path("fuzz.toml"))
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml: ")


def test_the_local_hosts_root_belongs_to_the_checkout_unless_its_table_names_one(tmp_path, monkeypatch):
    """Two checkouts must not see each other's local runs: [defaults] remote_root is for the remote hosts."""
    text = '[defaults]\nremote_root = "~/kpremote"\n[hosts.local]\ntransport = "local"\n'
    for checkout in ("one", "two"):  # each checkout with its hosts.toml; the commands run in a subfolder
        (tmp_path / checkout / "kernels").mkdir(parents=True)
        monkeypatch.chdir(tmp_path / checkout / "kernels")
        root = load_inventory(write(tmp_path / checkout, text)).hosts["local"].remote_root
        assert root == str((tmp_path / checkout / ".kpremote" / "local").resolve())
    named = load_inventory(write(tmp_path, text + 'remote_root = "/srv/runs"\n')).hosts["local"].remote_root
    assert named == "/srv/runs"


@pytest.mark.parametrize("target", ["me@example:2200", "gpu1", "a.b-c_d", "me@10.0.0.1:22", "me@fe80::1"])
def test_an_ssh_target_the_file_accepts_is_one_the_connection_can_read(tmp_path, target):
    from fabric import Connection

    [host] = load_inventory(write(tmp_path, f'[hosts.a]\nssh = "{target}"')).hosts.values()
    connection = Connection(host.ssh)  # reads user, host and port; connects to nothing
    assert connection.host and connection.port
