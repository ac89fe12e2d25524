"""A loopback TCP proxy that adds round-trip delay and counts the bytes that cross it, both ways.

Real users sit a continent away from their GPU boxes; the benchmarks put this proxy in front of a loopback SSH
server to see what 50 ms or 150 ms of round trip does to each tool. Every chunk read on one side is written on
the other side half the round trip later, in order (one queue per direction). A new connection reaches the
server 1.5 round trips after the client connected, as the TCP handshake (SYN, SYN-ACK, ACK) would take. The
counters are TCP payload bytes (SSH's own framing and encryption included; IP/TCP headers not).

The proxy runs in its own process (a benchmark's client must not share a GIL with it) and stops by itself: after
`max_seconds`, or when the process that started it goes away.

    python benchmarks/delay_proxy.py --target 127.0.0.2:2222 --rtt-ms 50 [--port 0] [--max-seconds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256
"""At most this many chunks (16 MiB) wait in one direction: a reader that outruns its writer pauses."""


class DelayProxy:
    """The proxy as seen from a benchmark: start it, point SSH at (address, port), read the counters, stop it.

    The counters live in a small file both processes map: the proxy adds to them as it reads, so they are
    current the moment a client has finished.
    """

    def __init__(self, target: tuple[str, int], rtt_s: float, *, address: str = "127.0.0.1",
                 max_seconds: float = 3600.0) -> None:
        self.target = target
        self.rtt_s = rtt_s
        self.address = address
        self.max_seconds = max_seconds
        self.port = 0
        self._process: Optional[subprocess.Popen] = None
        self._counters: Optional[Counters] = None

    def start(self) -> "DelayProxy":
        fd, path = tempfile.mkstemp(prefix="kpremote-proxy-", suffix=".counters")
        os.write(fd, b"\0" * Counters.SIZE)
        os.close(fd)
        try:
            self._counters = Counters(path)
            argv = [sys.executable, str(Path(__file__).resolve()), "--target", f"{self.target[0]}:{self.target[1]}",
                    "--rtt-ms", str(self.rtt_s * 1000), "--address", self.address,
                    "--max-seconds", str(self.max_seconds), "--counters", path, "--exit-with-parent"]
            self._process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            line = self._process.stdout.readline()  # the proxy has opened the counters by then
        finally:
            os.unlink(path)  # both mappings stay valid; nothing is left behind
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        self.port = int(line.split()[2].rsplit(":", 1)[1])
        return self

    @property
    def bytes_up(self) -> int:
        return self._counters.up if self._counters else 0

    @property
    def bytes_down(self) -> int:
        return self._counters.down if self._counters else 0

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> "DelayProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Counters:
    """Two 64-bit byte counters (client->server, server->client) in a shared mapping of a file."""

    SIZE = 16

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)

    @property
    def up(self) -> int:
        return struct.unpack_from("<q", self._map, 0)[0]

    @property
    def down(self) -> int:
        return struct.unpack_from("<q", self._map, 8)[0]

    def set(self, offset: int, value: int) -> None:
        struct.pack_into("<q", self._map, offset, value)


class _Direction:
    """One counter of a Counters, seen as `.value += n` by the pumps (or a plain counter with no file)."""

    def __init__(self, counters: Optional[Counters], offset: int) -> None:
        self.counters = counters
        self.offset = offset
        self.total = 0

    @property
    def value(self) -> int:
        return self.total

    @value.setter
    def value(self, new: int) -> None:
        if self.counters is not None:
            self.counters.set(self.offset, new)
        self.total = new


# ------------------------------------------------------------------------------------------ the proxy process


async def serve(target: tuple[str, int], rtt_s: float, address: str, port: int, max_seconds: float,
                parent_pid: Optional[int], up: Any, down: Any, announce) -> None:
    """Accept connections until max_seconds have passed or the parent process is gone."""

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        await relay(client_reader, client_writer, target, rtt_s, up, down)

    server = await asyncio.start_server(handle, address, port)
    announce(server.sockets[0].getsockname()[1])
    deadline = time.monotonic() + max_seconds
    async with server:
        while time.monotonic() < deadline and (parent_pid is None or _alive(parent_pid)):
            await asyncio.sleep(0.5)


def _alive(pid: int) -> bool:
    return os.getppid() == pid  # re-parented: whoever started us is gone


async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, target: tuple[str, int],
                rtt_s: float, up: Any, down: Any) -> None:
    half = rtt_s / 2
    to_server: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
    # The client's first bytes are read (and queued with their delay) while the handshake's round trip passes.
    reading_client = asyncio.create_task(pump_in(client_reader, to_server, half, up))
    await asyncio.sleep(1.5 * rtt_s)
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        reading_client.cancel()
        client_writer.close()
        return
    _no_delay(server_writer)
    _no_delay(client_writer)
    to_client: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
    tasks = [
        reading_client,
        asyncio.create_task(pump_out(to_server, server_writer)),
        asyncio.create_task(pump_in(server_reader, to_client, half, down)),
        asyncio.create_task(pump_out(to_client, client_writer)),
    ]
    try:
        await asyncio.gather(*tasks)
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        for task in tasks:
            task.cancel()
        for writer in (server_writer, client_writer):
            writer.close()


async def pump_in(reader: asyncio.StreamReader, queue: asyncio.Queue, delay_s: float, counter: Any) -> None:
    """Read chunks, each stamped with the moment it may be delivered; None marks the end of the stream."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = await reader.read(CHUNK)
        except OSError:
            chunk = b""
        counter.value += len(chunk)
        await queue.put((loop.time() + delay_s, chunk or None))
        if not chunk:
            return


async def pump_out(queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due, chunk = await queue.get()
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if chunk is None:
            if writer.can_write_eof():
                writer.write_eof()
            return
        writer.write(chunk)
        await writer.drain()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the server behind the proxy")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="round trip added (half each way)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="listening port (0: any free one, printed)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop by itself after this long")
    parser.add_argument("--counters", default=None, help="file of 16 bytes to keep the byte counters in")
    parser.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    counters = Counters(args.counters) if args.counters else None
    up, down = _Direction(counters, 0), _Direction(counters, 8)

    def announce(port_number: int) -> None:
        print(f"listening on {args.address}:{port_number} -> {args.target}, +{args.rtt_ms:g} ms RTT", flush=True)

    try:
        asyncio.run(serve((host, int(port)), args.rtt_ms / 1000, args.address, args.port, args.max_seconds,
                          os.getppid() if args.exit_with_parent else None, up, down, announce))
    except KeyboardInterrupt:
        pass
    print(f"bytes client->server {up.value}, server->client {down.value}", file=sys.stderr)


if __name__ == "__main__":
    main()
