"""The transports, over real OpenSSH servers on loopback (tests/rig.py)."""

from __future__ import annotations

import os
import time

import pytest

from kpremote.hosts.config import load_inventory
from kpremote.errors import HostError, HostKeyError
from kpremote.hosts.hostkeys import trust
from kpremote.hosts.connect import open_transport
from kpremote.transport import ContainerTransport, LocalTransport
from rig import free_port

HOSTILE = ["a b", "$(touch {canary})", "`touch {canary}`", "x; touch {canary}", "new\nline", "'quoted'", '"dq"', "*", "~"]


@pytest.fixture(scope="module")
def plain(rig):
    return rig.add_host("plain")


@pytest.fixture(scope="module")
def boxed(rig):
    return rig.add_host("boxed", container="sglang_bbuf")


def inventory_for(rig, tmp_path, hosts, **overrides):
    return load_inventory(rig.write_hosts_toml(tmp_path / "hosts.toml", hosts, overrides=overrides))


def test_binary_stdin_and_stdout_round_trip(rig, client, plain, tmp_path):
    host = inventory_for(rig, tmp_path, [plain]).hosts["plain"]
    transport = open_transport(host)
    payload = os.urandom(3 * 1024 * 1024)
    result = transport.run(["cat"], stdin=payload)
    assert result.ok and result.stdout == payload
    result = transport.run(["sh", "-c", "echo oops >&2; exit 7"])
    assert (result.exit_code, result.stderr) == (7, b"oops\n")
    assert transport.channels.opened == 2
    transport.close()


@pytest.mark.parametrize("container", [False, True])
def test_hostile_words_are_never_executed(rig, client, plain, boxed, tmp_path, container):
    chosen = boxed if container else plain
    host = inventory_for(rig, tmp_path, [chosen]).hosts[chosen.name]
    canary = chosen.home / "canary"
    words = [w.format(canary=canary) for w in HOSTILE]
    result = open_transport(host).run(["printf", "%s\\0", *words])
    assert result.ok, result.stderr
    assert result.stdout.split(b"\0")[:-1] == [w.encode() for w in words]
    assert not canary.exists()


def test_container_wrapping_runs_the_script_inside(rig, client, boxed, tmp_path):
    host = inventory_for(rig, tmp_path, [boxed]).hosts["boxed"]
    transport = open_transport(host)
    assert isinstance(transport, ContainerTransport)
    # $KPREMOTE_IN_CONTAINER exists only inside the stand-in container: expansion must happen there, once.
    result = transport.run(["sh", "-c", 'echo "in:$KPREMOTE_IN_CONTAINER"; cat'], stdin=b"payload after the script")
    assert result.stdout == b"in:sglang_bbuf\npayload after the script"
    assert boxed.docker_calls.read_text().splitlines()[-1] == "exec -i sglang_bbuf bash -s"


def test_unknown_host_key_is_refused_with_fingerprint_and_remedy(rig, client, tmp_path):
    stranger = rig.add_host(f"stranger-{client}", trusted=False)
    host = inventory_for(rig, tmp_path, [stranger]).hosts[stranger.name]
    with pytest.raises(HostKeyError) as err:
        open_transport(host).run(["true"])
    message = str(err.value)
    assert message.startswith(f"{stranger.name}: host key of ") and "SHA256:" in message
    fingerprint = message.split("--fingerprint ")[1].split()[0]
    assert f"inv trust-host --host {stranger.name} --fingerprint {fingerprint}" in message

    with pytest.raises(HostKeyError, match="nothing written"):
        trust(host, "SHA256:not-the-right-one")
    trust(host, fingerprint)
    assert open_transport(host).run(["true"]).ok


def test_changed_host_key_is_refused_loudly(rig, client, tmp_path):
    liar = rig.add_host(f"liar-{client}")
    other = rig.add_host(f"other-{client}")
    # known_hosts says liar has other's key: what a man in the middle would look like
    known = rig.known_hosts.read_text().replace(liar.host_key_pub, other.host_key_pub)
    (tmp_path / "known_hosts").write_text(known)
    host = inventory_for(rig, tmp_path, [liar], **{liar.name: {"known_hosts": str(tmp_path / "known_hosts")}}).hosts[
        liar.name]
    with pytest.raises(HostKeyError, match=r"HOST KEY CHANGED .* Refusing to connect.*ssh-keygen -R"):
        open_transport(host).run(["true"])


def test_unreachable_host_fails_fast_with_one_line(rig, client, plain, tmp_path):
    dead_port = free_port("127.0.0.1")
    host = inventory_for(rig, tmp_path, [plain], plain={"ssh": f"root@127.0.0.1:{dead_port}"}).hosts["plain"]
    started = time.monotonic()
    with pytest.raises(HostError, match=r"^plain: unreachable: 127.0.0.1:\d+: Connection refused"):
        open_transport(host).run(["true"])
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("reachable", [True, False])
def test_connecting_in_the_background_is_one_attempt_whose_outcome_run_gets(rig, client, plain, tmp_path, reachable):
    overrides = {} if reachable else {"plain": {"ssh": f"root@127.0.0.1:{free_port('127.0.0.1')}"}}
    host = inventory_for(rig, tmp_path, [plain], **overrides).hosts["plain"]
    transport = open_transport(host)
    attempts = []
    real_open = transport.open_connection
    transport.open_connection = lambda: (attempts.append(time.monotonic()), real_open())
    transport.connect_soon()
    time.sleep(0.3)  # the scan the caller does meanwhile
    if reachable:
        assert transport.run(["echo", "hi"]).stdout == b"hi\n"
    else:
        with pytest.raises(HostError, match=r"^plain: unreachable: .*Connection refused"):
            transport.run(["true"])
    assert len(attempts) == 1  # a failure is not tried again: that would wait out a connect timeout twice
    transport.close()


def test_refused_key_is_an_authentication_error(rig, client, plain, tmp_path):
    stray = tmp_path / "stray_key"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {stray}")
    host = inventory_for(rig, tmp_path, [plain], plain={"identity_file": str(stray)}).hosts["plain"]
    with pytest.raises(HostError, match="^plain: authentication failed for root@"):
        open_transport(host).run(["true"])


def test_local_transport_streams_stdout(tmp_path):
    seen: list[bytes] = []
    result = LocalTransport().run(["sh", "-c", "echo one; echo two >&2; cat"], stdin=b"three", on_stdout=seen.append)
    assert b"".join(seen) == b"one\nthree" and result.stderr == b"two\n" and result.stdout == b""
