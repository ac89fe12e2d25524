"""What the OpenSSH transport adds, over real sshd hosts on loopback (tests/rig.py): one master per host shared by
commands and by processes, a master that dies under a command retried once, and the command semantics (cancel,
timeouts, streaming) the same over both SSH clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kpremote.hosts.config import load_inventory
from kpremote.hosts.connect import open_transport
from kpremote.errors import HostError
from kpremote.transport.openssh import CONTROL_DIR_ENV, OpenSSHTransport, split_target
from waiting import alive, wait_for


@pytest.fixture(scope="module")
def box(rig):
    return rig.add_host("ossh")


def transport_for(rig, box, tmp_path: Path, client: str = "openssh"):
    rig.client = client
    try:
        toml = rig.write_hosts_toml(tmp_path / "hosts.toml", [box], local=False)
    finally:
        rig.client = None
    return open_transport(load_inventory(toml).hosts[box.name]), toml


ANCESTRY = 'p=$$; while [ "$p" -gt 1 ]; do q=$(cut -d" " -f4 /proc/$p/stat); echo "$p $q"; p=$q; done'


def connection_of(ancestry: str, box) -> int:
    """The sshd process of the connection a command ran in (the listener's child): one per handshake."""
    pairs = [line.split() for line in ancestry.splitlines()]
    return next(int(pid) for pid, parent in pairs if int(parent) == box.proc.pid)


def test_the_target_forms_become_ssh_arguments():
    assert split_target("root@10.0.0.5:2222") == (["-p", "2222"], "root@10.0.0.5")
    assert split_target("[fe80::1]:2200") == (["-p", "2200"], "fe80::1")
    assert split_target("ion8-h200") == ([], "ion8-h200")
    assert split_target("me@ion8-h200") == ([], "me@ion8-h200")


def test_one_master_serves_commands_of_this_process_and_the_next(rig, box, tmp_path):
    transport, toml = transport_for(rig, box, tmp_path)
    assert isinstance(transport, OpenSSHTransport)
    first = connection_of(transport.run(["sh", "-c", ANCESTRY]).stdout.decode(), box)
    master = transport.master_pid()
    assert master is not None
    assert connection_of(transport.run(["sh", "-c", ANCESTRY]).stdout.decode(), box) == first
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from kpremote.hosts.config import load_inventory; "
         "from kpremote.hosts.connect import open_transport; "
         "t = open_transport(load_inventory(sys.argv[1]).hosts[sys.argv[2]]); "
         "print(t.master_pid()); print(t.run(['sh', '-c', sys.argv[3]]).stdout.decode())",
         str(toml), box.name, ANCESTRY], capture_output=True, text=True, timeout=60)
    pid, ancestry = other.stdout.split("\n", 1)
    assert int(pid) == master, other.stderr
    assert connection_of(ancestry, box) == first  # another process, the same connection: no handshake of its own


def test_a_master_that_dies_before_the_command_speaks_is_retried_once(rig, box, tmp_path):
    transport, _ = transport_for(rig, box, tmp_path)
    transport.connect()
    master = transport.master_pid()
    threading.Timer(0.5, os.kill, (master, signal.SIGTERM)).start()
    result = transport.run(["sh", "-c", "sleep 1.5; echo done"])
    assert (result.exit_code, result.stdout) == (0, b"done\n")
    assert transport.channels.opened == 2  # the command ran twice: the first one's channel died with the master
    assert transport.master_pid() not in (None, master)


def test_a_master_that_dies_after_the_command_spoke_is_a_lost_connection(rig, box, tmp_path):
    transport, _ = transport_for(rig, box, tmp_path)
    transport.connect()
    threading.Timer(0.7, os.kill, (transport.master_pid(), signal.SIGTERM)).start()
    heard: list[bytes] = []
    with pytest.raises(HostError, match="connection lost"):
        transport.run(["sh", "-c", "echo started; sleep 1.5; echo done"], on_stdout=heard.append)
    assert heard == [b"started\n"]


def test_a_command_that_exits_255_itself_is_not_retried(rig, box, tmp_path):
    transport, _ = transport_for(rig, box, tmp_path)
    assert transport.run(["sh", "-c", "exit 255"]).exit_code == 255
    assert transport.channels.opened == 1


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_an_interrupted_command_closes_its_channel_and_the_remote_command_ends(rig, box, tmp_path, client):
    transport, _ = transport_for(rig, box, tmp_path, client)
    pid_file = box.home / f"ticker-{client}.pid"
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            transport.run(["sh", "-c", f'echo $$ > {pid_file}; while true; do echo tick; sleep 0.1; done'])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    ticker = int(pid_file.read_text())
    wait_for(lambda: not alive(ticker), 10, "the remote command gone once its channel closed")
    assert transport.run(["echo", "after"]).stdout == b"after\n"  # the connection (the master) is still there


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
@pytest.mark.parametrize("limit, says", [("timeout", "command timed out"),
                                         ("idle_timeout", "connection lost: no answer for 1 s")])
def test_time_limits_end_the_command_with_one_line(rig, box, tmp_path, client, limit, says):
    transport, _ = transport_for(rig, box, tmp_path, client)
    with pytest.raises(HostError, match=f"^{box.name}: {says}"):
        transport.run(["sleep", "20"], **{limit: 1})


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_stdout_streams_to_on_stdout_and_stdin_can_be_a_producer(rig, box, tmp_path, client):
    transport, _ = transport_for(rig, box, tmp_path, client)
    chunks = iter([b"alpha ", b"beta", None])
    seen: list[bytes] = []
    result = transport.run(["sh", "-c", "cat; echo; echo to-stderr >&2; exit 3"], stdin=lambda: next(chunks),
                           on_stdout=seen.append)
    assert (b"".join(seen), result.stdout, result.stderr, result.exit_code) == (b"alpha beta\n", b"",
                                                                                b"to-stderr\n", 3)


def test_a_control_folder_others_can_open_is_refused_in_one_line(rig, box, tmp_path, monkeypatch):
    loose = tmp_path / "masters"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    monkeypatch.setenv(CONTROL_DIR_ENV, str(loose))
    transport, _ = transport_for(rig, box, tmp_path)
    with pytest.raises(HostError, match=f"^{box.name}: {loose} must be a folder of yours with mode 0700"):
        transport.run(["true"])


def test_paths_with_spaces_and_percent_signs_reach_ssh_as_they_are(rig, box, tmp_path):
    odd = tmp_path / "my keys %d %h"
    odd.mkdir()
    (odd / "known hosts").write_text(rig.known_hosts.read_text())
    rig.client = "openssh"
    try:
        toml = rig.write_hosts_toml(tmp_path / "hosts.toml", [box], local=False,
                                    overrides={box.name: {"known_hosts": str(odd / "known hosts")}})
    finally:
        rig.client = None
    assert open_transport(load_inventory(toml).hosts[box.name]).run(["echo", "ok"]).stdout == b"ok\n"
    (odd / "known hosts").write_text("")  # the same path, the key gone: refused, so that file was the one read
    with pytest.raises(HostError, match="is not in .*my keys %d %h/known hosts"):
        open_transport(load_inventory(toml).hosts[box.name]).run(["true"])


def test_without_an_ssh_client_the_default_is_paramiko_and_openssh_is_one_line(rig, box, tmp_path, monkeypatch):
    from kpremote.transport.ssh import SSHTransport

    toml = rig.write_hosts_toml(tmp_path / "hosts.toml", [box], local=False)  # no transport: the default client
    assert isinstance(open_transport(load_inventory(toml).hosts[box.name]), OpenSSHTransport)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert isinstance(open_transport(load_inventory(toml).hosts[box.name]), SSHTransport)
    chosen = rig.write_hosts_toml(tmp_path / "chosen.toml", [box], local=False,
                                  overrides={box.name: {"transport": "openssh"}})
    with pytest.raises(HostError, match=f'^{box.name}: transport = "openssh", but there is no ssh client on PATH'):
        open_transport(load_inventory(chosen).hosts[box.name])


def test_a_connection_started_early_is_the_one_the_command_then_uses(rig, box, tmp_path):
    from kpremote.hosts.connect import connect_early

    transport, toml = transport_for(rig, box, tmp_path)
    subprocess.run(transport.ssh_argv("-O", "exit"), capture_output=True)  # no master: the day's first command
    host = load_inventory(toml).hosts[box.name]
    connect_early([host])
    assert wait_for(lambda: transport.master_pid())  # the handshake went on while nothing asked for the host yet
    early = open_transport(host)
    assert early.run(["echo", "ok"]).stdout == b"ok\n"
    assert open_transport(host) is not early  # handed over once; later transports find the master by its socket


def test_an_early_connection_that_failed_is_said_once_and_not_tried_again(rig, tmp_path):
    """A host that is not SSH (it closes every connection at once): connect_early, then the command's own
    connect_soon and command: one connection, one line."""
    import socket

    from kpremote.hosts.connect import connect_early

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[int] = []

    def close_each() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    toml = tmp_path / "hosts.toml"
    toml.write_text(f'[defaults]\nknown_hosts = "{rig.known_hosts}"\n[hosts.notssh]\n'
                    f'ssh = "root@127.0.0.1:{listener.getsockname()[1]}"\ntransport = "openssh"\n')
    host = load_inventory(toml).hosts["notssh"]
    try:
        connect_early([host])
        transport = open_transport(host)
        transport.connect_soon()  # what start_run does next
        with pytest.raises(HostError, match="answered, but not as an SSH server"):
            transport.run(["true"])
    finally:
        listener.close()
    assert accepted == [1]
