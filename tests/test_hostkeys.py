"""Host keys over real sshd hosts: the right remedy for every case (ProxyJump hops included), `trust-host` that
replaces a changed key, known_hosts lines OpenSSH would skip, and ports that are not SSH or never answer."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from kpremote.hosts.config import load_inventory
from kpremote.errors import HostError, HostKeyError
from kpremote.hosts.hostkeys import trust
from kpremote.hosts.connect import open_transport
from rig import run_inv

MALFORMED = [
    "127.0.0.9 ssh-ed25519 !!!notbase64",
    "127.0.0.9 ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQ",
    "127.0.0.9 bogus-type AAAA",
    "|1|bad|hash ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "@cert-authority *.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "only-two fields",
]


@pytest.fixture(scope="module")
def jump(rig):
    return rig.add_host("hk-jump", trusted=False)


@pytest.fixture(scope="module")
def target(rig):
    return rig.add_host("hk-target", trusted=False)


def write_hosts(rig, tmp_path: Path, hosts, known: list[str], **overrides) -> dict:
    (tmp_path / "known_hosts").write_text("".join(line + "\n" for line in known))
    toml = rig.write_hosts_toml(tmp_path / "hosts.toml", hosts, local=False, overrides={
        h.name: {"known_hosts": str(tmp_path / "known_hosts"), **overrides.get(h.name, {})} for h in hosts})
    return load_inventory(toml).hosts


def via_jump(rig, tmp_path: Path, jump, target, known: list[str]):
    """The target, reached through `ProxyJump jump` from an ssh_config file."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host via-jump\n  HostName {target.address}\n  Port {target.port}\n  User root\n"
                      f"  ProxyJump root@{jump.address}:{jump.port}\n"
                      f"Host *\n  IdentityFile {rig.client_key}\n  IdentitiesOnly yes\n")
    return write_hosts(rig, tmp_path, [target], known, **{
        target.name: {"ssh": "via-jump", "ssh_config": str(config)}})[target.name]


def refusal(host) -> str:
    with pytest.raises(HostKeyError) as err:
        open_transport(host).run(["true"])
    return str(err.value)


def fingerprint_in(message: str) -> str:
    return message.split("--fingerprint ")[1].split()[0]


def test_malformed_known_hosts_lines_are_skipped_as_openssh_does(rig, client, target, tmp_path) -> None:
    host = write_hosts(rig, tmp_path, [target], [*MALFORMED, target.known_hosts_line])[target.name]
    assert open_transport(host).run(["true"]).ok
    alone = write_hosts(rig, tmp_path, [target], MALFORMED)[target.name]  # only bad lines: the key is unknown
    assert "is not in" in refusal(alone)


def test_an_unknown_jump_host_names_itself_and_trust_host_accepts_it(rig, client, jump, target, tmp_path) -> None:
    host = via_jump(rig, tmp_path, jump, target, [target.known_hosts_line])
    message = refusal(host)
    assert f"jump host (ProxyJump for {target.name}) [{jump.address}]:{jump.port}" in message, message
    assert f"inv trust-host --host {target.name} --fingerprint" in message
    done = trust(host, fingerprint_in(message))
    assert done.entry == f"[{jump.address}]:{jump.port}" and not done.replaced
    assert open_transport(host).run(["true"]).ok


def test_an_unknown_host_behind_a_jump_host_is_trusted_through_it(rig, client, jump, target, tmp_path) -> None:
    host = via_jump(rig, tmp_path, jump, target, [jump.known_hosts_line])
    message = refusal(host)
    assert f"host key of [{target.address}]:{target.port} is not in" in message, message
    with pytest.raises(HostKeyError, match="nothing written"):
        trust(host, "SHA256:not-the-right-one")
    done = trust(host, fingerprint_in(message))
    assert done.entry == f"[{target.address}]:{target.port}" and done.hop == "the host"
    assert open_transport(host).run(["true"]).ok


def test_a_changed_jump_host_key_names_the_jump_hosts_entry_and_trust_host_replaces_it(rig, client, jump, target,
                                                                                      tmp_path) -> None:
    stale = jump.known_hosts_line.replace(jump.host_key_pub, target.host_key_pub)  # what a MITM would look like
    host = via_jump(rig, tmp_path, jump, target, [stale, target.known_hosts_line])
    message = refusal(host)
    entry = f"[{jump.address}]:{jump.port}"
    assert f"HOST KEY CHANGED for jump host {entry}" in message and f"ssh-keygen -R '{entry}'" in message, message
    assert f"[{target.address}]:{target.port}'" not in message  # following it must not delete the target's key
    done = trust(host, fingerprint_in(message))
    assert done.replaced and "replaced the key of" in done.describe("kh")
    known = (tmp_path / "known_hosts").read_text()
    assert stale not in known and target.known_hosts_line in known
    assert open_transport(host).run(["true"]).ok


def test_trust_host_with_the_new_fingerprint_replaces_a_changed_key_and_says_so(rig, client, jump, target, tmp_path) -> None:
    stale = target.known_hosts_line.replace(target.host_key_pub, jump.host_key_pub)
    host = write_hosts(rig, tmp_path, [target], [stale])[target.name]
    hosts = str(tmp_path / "hosts.toml")
    new = fingerprint_in(refusal(host))
    accepted = run_inv("trust-host", "--hosts", hosts, "--host", target.name, "--fingerprint", new, env={"COLUMNS": "80"})
    assert accepted.returncode == 0 and "replaced the key of the host" in accepted.stdout, accepted
    assert len(accepted.stdout.splitlines()) == 1, accepted.stdout  # its known_hosts path and key whole at 80 columns
    assert stale not in (tmp_path / "known_hosts").read_text()
    assert open_transport(load_inventory(hosts).hosts[target.name]).run(["true"]).ok


def serve(mode: str) -> int:
    """A TCP port on 127.0.0.1 that answers like a web server ("http") or accepts and stays silent ("silent")."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def loop() -> None:
        while True:
            conn, _ = listener.accept()
            if mode == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.close()
            else:
                threading.Timer(30, conn.close).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener.getsockname()[1]


@pytest.mark.parametrize("mode,says", [("http", "answered, but not as an SSH server"),
                                       ("silent", "accepted the connection but sent no SSH greeting within 2 s")])
def test_a_port_that_is_not_ssh_is_one_clear_line(rig, client, target, tmp_path, mode, says) -> None:
    port = serve(mode)
    hosts = write_hosts(rig, tmp_path, [target], [],
                        **{target.name: {"ssh": f"root@127.0.0.1:{port}", "connect_timeout": 2}})
    started = time.monotonic()
    with pytest.raises(HostError) as err:
        open_transport(hosts[target.name]).run(["true"])
    assert says in str(err.value) and time.monotonic() - started < 4
    result = run_inv("hosts", "--hosts", str(tmp_path / "hosts.toml"), "--check", "--json", timeout=60)
    assert result.returncode == 2 and says in result.stdout, result.stdout
    assert result.stderr.strip() == "" and "paramiko" not in result.stdout + result.stderr  # no banner spew
