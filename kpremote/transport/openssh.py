"""Commands on an SSH host through the system's `ssh` client, over one master connection per host that every
command and every kpremote process on this machine shares while it lives (ControlMaster, ControlPersist).

Every ssh_config feature works, since OpenSSH reads the user's config itself (it is Included). kpremote adds only its
policy, first in a generated config file that ProxyJump hops read too (ssh passes -F on to them): strict host keys
against kpremote's known_hosts and nothing else, batch mode (never a prompt), keepalives. The command travels as
argv: one `ssh` argument list, the remote command one quoted string (command_line), never a local shell.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import selectors
import shutil
import stat
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from ..agent.filelock import held  # standard library only, shared by both halves (test_transport_seam.py)
from .base import ChannelCounter, Command, Completed, ConnectsInBackground, command_line
from .errors import HostError, HostKeyError, changed_host_key, no_greeting, not_ssh, unknown_host_key
from .streams import Output, feed_in_background

CONTROL_DIR_ENV = "KPREMOTE_SSH_CONTROL_DIR"
PERSIST = "10m"  # how long an idle master stays for the next command (of this process or another)
KEEPALIVE_S = 5  # at most this long between keepalives
KEEPALIVES_MISSED = 3  # unanswered in a row: the link is dead
SOCKET_PATH_MAX = 104 - 17  # sun_path's limit, less the suffix ssh adds while it creates the socket
MASTER_SETUP_S = 30  # beyond connect_timeout: authentication, ProxyJump hops


def ssh_client() -> Optional[str]:
    """The system's ssh client, or None where there is none."""
    return shutil.which("ssh")


def control_dir(host: str) -> Path:
    """The private folder of the masters' sockets: $KPREMOTE_SSH_CONTROL_DIR, else $XDG_RUNTIME_DIR/kpremote-ssh,
    else /tmp/kpremote-ssh-UID. Short (a socket path has ~104 bytes), ours alone, mode 0700: whoever can open a
    master's socket runs commands as us on every host it reaches."""
    if os.environ.get(CONTROL_DIR_ENV):
        path = Path(os.environ[CONTROL_DIR_ENV])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "kpremote-ssh"
    else:
        path = Path(tempfile.gettempdir()) / f"kpremote-ssh-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise HostError(host, f"cannot make the folder of ssh's control sockets {path}: {exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise HostError(host, f"{path} must be a folder of yours with mode 0700 (it holds ssh's control sockets): "
                               f"fix it with chmod 700 {path}, or set {CONTROL_DIR_ENV} to another folder")
    return path


def split_target(target: str) -> tuple[list[str], str]:
    """hosts.toml's `ssh` as ssh's arguments: user@host:port becomes -p PORT user@host; an alias stays as it is."""
    match = re.fullmatch(r"((?:[^@]+@)?)(\[[^\]]+\]|[^:\[\]]+):([0-9]+)", target)
    if not match:
        return [], target
    host = match[2][1:-1] if match[2].startswith("[") else match[2]
    return ["-p", match[3]], match[1] + host


def _quoted(path: str, tokens: bool = True) -> str:
    """A path as one ssh_config word; % doubled where ssh expands %-tokens in it."""
    if any(ch in path for ch in '"\n\r'):
        raise ValueError(f"{path!r}: a path in ssh_config cannot hold quotes or line breaks")
    return '"' + (path.replace("%", "%%") if tokens else path) + '"'


class OpenSSHTransport(ConnectsInBackground):
    """One `ssh` client process per command, multiplexed over the host's master connection."""

    def __init__(
        self,
        host: str,
        target: str,
        *,
        connect_timeout: float = 10,
        known_hosts: str = "~/.ssh/known_hosts",
        identity_file: Optional[str] = None,
        ssh_config: Optional[str] = None,
        persist: str = PERSIST,
    ) -> None:
        self.host = host
        self.target = target
        self.connect_timeout = connect_timeout
        self.known_hosts = os.path.expanduser(known_hosts)
        self.identity_file = os.path.abspath(os.path.expanduser(identity_file)) if identity_file else None
        self.ssh_config = os.path.abspath(os.path.expanduser(ssh_config)) if ssh_config else None
        self.persist = persist
        self.channels = ChannelCounter()
        self._port_args, self._destination = split_target(target)
        super().__init__()
        self._master: Optional[int] = None  # the pid of the master this transport's commands go through
        self._files: Optional[tuple[Path, str]] = None  # the policy file and the control path, made on first use
        self._probed: Optional[str] = None  # what a verbose ssh said after a failure (probe)

    # --- the policy file and the master's socket -------------------------------------------------------------

    def policy(self) -> str:
        """kpremote's ssh_config: its settings first (ssh takes the first value it reads), then the user's files."""
        try:
            return self._policy_lines()
        except ValueError as exc:
            raise HostError(self.host, str(exc)) from None

    def _policy_lines(self) -> str:
        lines = [
            "# Written by kpremote (kpremote/transport/openssh.py): its policy first, then the user's ssh_config.",
            "Host *",
            "  BatchMode yes",
            "  StrictHostKeyChecking yes",
            f"  UserKnownHostsFile {_quoted(self.known_hosts)}",
            "  GlobalKnownHostsFile /dev/null",
            "  UpdateHostKeys no",
            f"  ConnectTimeout {max(1, math.ceil(self.connect_timeout))}",
            # A dead link is given up on after ~connect_timeout without an answer, as paramiko's TCP_USER_TIMEOUT
            # does: OpenSSH counts unanswered keepalives even while data it sent waits unacknowledged.
            f"  ServerAliveInterval {self.keepalive_interval()}",
            f"  ServerAliveCountMax {KEEPALIVES_MISSED}",
        ]
        if self.identity_file:
            lines += [f"  IdentityFile {_quoted(self.identity_file)}", "  IdentitiesOnly yes"]
        lines.append("Match all")
        includes = [self.ssh_config] if self.ssh_config else [os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"]
        lines += [f"Include {_quoted(path, tokens=False)}" for path in includes]
        return "\n".join(lines) + "\n"

    def keepalive_interval(self) -> int:
        """Seconds between keepalives: KEEPALIVES_MISSED of them span about connect_timeout (1 to KEEPALIVE_S)."""
        return max(1, min(KEEPALIVE_S, math.ceil(self.connect_timeout / KEEPALIVES_MISSED)))

    def _prepare(self) -> tuple[Path, str]:
        """The policy file (named by its content, written once) and the ControlPath of this policy's masters."""
        if self._files is None:
            text = self.policy()
            # known_hosts as it is now is part of the name: a master is reused only under the very keys it was
            # verified against, so a key removed or replaced takes effect at the next command, as with paramiko.
            digest = hashlib.sha256(text.encode() + b"\0" + _contents(self.known_hosts)).hexdigest()[:10]
            folder = control_dir(self.host)
            config = folder / f"{digest}.conf"
            if not config.exists():
                fd, tmp = tempfile.mkstemp(prefix=".conf-", dir=folder)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, config)
            control = f"{folder}/{digest}-%C"  # %C: a hash of this host, the target's host, port, user, ProxyJump
            if len(control) - 2 + 40 > SOCKET_PATH_MAX:
                raise HostError(self.host, f"{folder}: too long a folder for ssh's control sockets (a socket path "
                                           f"has {SOCKET_PATH_MAX + 17} bytes at most): set {CONTROL_DIR_ENV}")
            self._files = (config, control)
        return self._files

    def ssh_argv(self, *options: str, control_path: bool = True) -> list[str]:
        """`ssh` with kpremote's policy, the given options and the destination; the remote words go after it."""
        config, control = self._prepare()
        path = ["-o", f"ControlPath={control}"] if control_path else ["-o", "ControlPath=none"]
        return ["ssh", "-F", str(config), *path, *options, *self._port_args, "--", self._destination]

    @property
    def hostname(self) -> str:
        return self.resolved()["hostname"]

    @property
    def port(self) -> int:
        return int(self.resolved()["port"])

    def resolved(self) -> dict[str, str]:
        """What ssh makes of the target with every config applied (`ssh -G`: no connection)."""
        result = subprocess.run(self.ssh_argv("-G"), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        pairs = (line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        return {key: value for key, value in pairs}

    # --- the master ---------------------------------------------------------------------------------------------

    def master_pid(self) -> Optional[int]:
        """The pid of the running master for this host (`ssh -O check`: a question to the socket, no network)."""
        check = subprocess.run(self.ssh_argv("-O", "check"), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        found = re.search(r"pid=([0-9]+)", check.stderr)
        return int(found[1]) if check.returncode == 0 and found else None

    def is_open(self) -> bool:
        return self._master is not None

    def open_connection(self) -> None:
        """Use the host's master, or start it: one process at a time (a lock file), so two panes that start
        together share one master instead of racing for the socket."""
        self._master = self.master_pid()
        if self._master is not None:
            return
        with self._creating():
            self._master = self.master_pid()  # another process may have made it while we waited
            if self._master is None:
                self._start_master()
                self._master = self.master_pid()
        if self._master is None:
            raise HostError(self.host, "ssh connected, but its master connection did not stay (ControlPersist)")

    @contextmanager
    def _creating(self) -> Iterator[None]:
        config, _ = self._prepare()
        name = hashlib.sha256(f"{config}\0{self.target}".encode()).hexdigest()[:16]
        with held(config.parent / f"{name}.lock"):
            yield

    def _start_master(self) -> None:
        """`ssh -N -f` with ControlMaster: it returns once authenticated, leaving the master in the background."""
        argv = self.ssh_argv("-o", "ControlMaster=auto", "-o", f"ControlPersist={self.persist}", "-N", "-f")
        with tempfile.TemporaryFile() as errors:  # a file, not a pipe: the master keeps what it inherits
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=self.connect_timeout + MASTER_SETUP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise HostError(self.host, f"ssh did not finish connecting within "
                                           f"{self.connect_timeout + MASTER_SETUP_S:g} s") from None
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            errors.seek(0)
            text = errors.read().decode("utf-8", "replace")
        if code != 0:
            raise self.failure(text)

    # --- why ssh failed -----------------------------------------------------------------------------------------

    def failure(self, stderr: str) -> HostError:
        """One line for what ssh said when it could not connect (exit 255)."""
        if "UNKNOWN port 65535" in stderr and "Host key verification failed" not in stderr:
            # A ProxyJump hop failed, and with ControlPersist ssh sends the hop's own words to /dev/null: ask again
            # without the master, where they are heard.
            stderr = self.probe()
        lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("debug")]
        text = "\n".join(lines)
        if "Host key verification failed" in text:
            return self.host_key_refusal()
        if "Permission denied" in text:
            info = self.resolved()
            said = next(line for line in lines if "Permission denied" in line)
            return HostError(self.host, f"authentication failed for {info.get('user')}@{info.get('hostname')}:"
                                        f"{info.get('port')} ({said.split(': ', 1)[-1]})")
        refused = re.search(r"connect to host (\S+) port ([0-9]+): (.+)", text)
        if refused:
            where = f"{refused[1]}:{refused[2]}"
            if "timed out" in refused[3]:
                return HostError(self.host, f"unreachable: no answer from {where} within {self.connect_timeout:g} s")
            return HostError(self.host, f"unreachable: {where}: {refused[3]}")
        if "banner exchange" in text:
            timed = re.search(r"Connection to (\S+) port ([0-9]+) timed out", text)
            return HostError(self.host, no_greeting(f"{timed[1]}:{timed[2]}" if timed else self.target,
                                                    self.connect_timeout))
        if "kex_exchange_identification" in text or "protocol version identification" in text:
            info = self.resolved()
            return HostError(self.host, not_ssh(f"{info.get('hostname')}:{info.get('port')}"))
        if "Could not resolve hostname" in text:
            return HostError(self.host, f"unreachable: {next(l for l in lines if 'Could not resolve' in l)}")
        return HostError(self.host, f"ssh could not connect: {lines[-1] if lines else 'exit 255 and no message'}")

    def probe(self) -> str:
        """What `ssh -v ... true` says, without the master (only on a failure path: it connects once more)."""
        if self._probed is None:
            argv = self.ssh_argv("-v", "-o", "ControlMaster=no", "-T", control_path=False) + ["true"]
            try:
                self._probed = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                              errors="replace", timeout=self.connect_timeout + MASTER_SETUP_S).stderr
            except subprocess.TimeoutExpired:
                self._probed = ""
        return self._probed

    def host_key_refusal(self) -> HostKeyError:
        """The hop whose key is unknown or changed, with its fingerprint: ssh names the key it was offered only
        when asked verbosely, so ask once more that way."""
        said = self.probe().splitlines()
        offered = None
        for line in said:
            key = re.match(r"debug1: Server host key: (\S+) (\S+)", line)
            if key:
                offered = (key[1], key[2])
            unknown = re.match(r"No \S+ host key is known for (\S+) and you have requested strict checking", line)
            changed = re.match(r"Host key for (\S+) has changed and you have requested strict checking", line)
            if (unknown or changed) and offered:
                entry = (unknown or changed)[1]
                what = self._hop_label(entry, changed is not None)
                if unknown:
                    return unknown_host_key(self.host, what, self.known_hosts, *offered)
                return changed_host_key(self.host, what, entry, self.known_hosts, self._known_key(entry), offered)
        words = [line.strip() for line in said if line.strip() and not line.startswith("debug")]
        return HostKeyError(self.host, f"host key verification failed ({'; '.join(words[-2:])}); nothing was sent. "
                                       f"Check the key's fingerprint (ssh-keyscan), then: inv trust-host --host "
                                       f"{self.host} --fingerprint FINGERPRINT")

    def _hop_label(self, entry: str, changed: bool) -> str:
        info = self.resolved()
        port = int(info.get("port", 22))
        own = info.get("hostname", "") if port == 22 else f"[{info.get('hostname')}]:{port}"
        if entry == own:
            return entry
        if changed:
            return f"jump host {entry} (ProxyJump for {self.host})"
        return f"jump host (ProxyJump for {self.host}) {entry}"

    def _known_key(self, entry: str) -> tuple[str, str]:
        from . import known_hosts as known  # paramiko: only on this failure path

        keys = known.keys_for(self.known_hosts, entry)
        return (keys[0].get_name(), keys[0].fingerprint) if keys else ("another key", "(unreadable)")

    # --- commands -----------------------------------------------------------------------------------------------

    def send(self, command: Command) -> Completed:
        """Run the command over the master; if the master died before the command printed anything, once more
        (with the same stdin: bytes or none), else the connection was lost (HostError)."""
        replayable = command.stdin is None or isinstance(command.stdin, (bytes, bytearray, memoryview))
        for attempt in (1, 2):
            try:
                self.connect()
            except HostError as exc:
                if attempt == 1:
                    raise
                raise HostError(self.host, f"connection lost mid-command, and connecting again failed: "
                                           f"{exc.cause}") from None
            self.channels.note(command.argv)
            master = self._master
            result, heard = self._exec(command)
            if result.exit_code != 255 or self.master_pid() == master:
                return result  # 255 with the master still there: the command's own exit code
            self._master = None  # the master died or expired under the command (ControlPersist's race)
            if heard or attempt == 2 or not replayable:  # it may have done something: running it again is not ours
                raise HostError(self.host, "connection lost mid-command (the master connection to the host ended)")
        raise AssertionError("unreachable")

    def _exec(self, command: Command) -> tuple[Completed, bool]:
        """One ssh client process for the command; returns what it left and whether any stdout came."""
        argv = self.ssh_argv("-T", "-o", "ControlMaster=auto", "-o", f"ControlPersist={self.persist}")
        proc = subprocess.Popen([*argv, command_line(command.argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)  # Ctrl-C reaches us, not ssh
        feeder = feed_in_background(command.stdin, _writer(proc.stdin), proc.stdin.close)
        output = Output(command)
        heard = False
        try:
            heard = self._pump(proc, output, command)
            code = proc.wait()
        except BaseException:
            proc.kill()  # the master closes the command's channel: what a closed paramiko channel does
            proc.wait()
            raise
        finally:
            feeder.join(timeout=5)
            proc.stdout.close()
            proc.stderr.close()
        return output.completed(code), heard

    def _pump(self, proc: subprocess.Popen, output: Output, command: Command) -> bool:
        """Read stdout and stderr until both end; the deadline and the idle limit kill the client."""
        deadline = command.deadline()
        heard = False
        last_byte = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ, output.stdout)
            selector.register(proc.stderr, selectors.EVENT_READ, output.stderr)
            while selector.get_map():
                for key, _ in selector.select(0.5):
                    chunk = os.read(key.fileobj.fileno(), 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    last_byte = time.monotonic()
                    heard = heard or key.fileobj is proc.stdout
                    key.data(chunk)
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise HostError(self.host, "command timed out")
                if command.idle_timeout is not None and now - last_byte > command.idle_timeout:
                    raise HostError(self.host, f"connection lost: no answer for {command.idle_timeout:g} s")
        return heard

    def close(self) -> None:
        """Nothing to close: the master stays for the next command, of this process or another, until
        ControlPersist ends it."""


def _contents(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _writer(pipe):
    def write(chunk: bytes) -> None:
        pipe.write(chunk)
        pipe.flush()  # a chunk producer's bytes go now: the command may be waiting for them

    return write
