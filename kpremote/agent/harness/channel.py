"""The wire between a row's judge and its side processes: commands down, JSON bytes up, tensors shared.

Judge -> side: a pickled dict (the judge is trusted, so the side may unpickle it), with file descriptors
attached through SCM_RIGHTS. CUDA tensors travel as torch's CUDA IPC handles (torch.multiprocessing's
reductions); CPU tensors live in memfd shared memory that the judge creates and hands over as a descriptor,
so the CPU smoke run crosses the very same process boundary as a GPU run.

Side -> judge: JSON bytes only, capped in size. The judge never unpickles anything a side sends: a side
holds candidate code, and unpickling is code execution.
"""

from __future__ import annotations

import array
import json
import os
import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!QI")  # payload length, number of descriptors attached
MAX_REPLY_BYTES = 1 << 20  # a side's reply is an ack or a few numbers: anything larger is refused
MAX_FDS = 64


class ChannelClosed(Exception):
    """The other end went away (a side that crashed or exited)."""


class BadReply(Exception):
    """A side sent something that is not a small JSON object."""


class Channel:
    """One end of a Unix socket pair carrying framed messages."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def close(self) -> None:
        self.sock.close()

    # ---------------------------------------------------------------- judge -> side

    def send_command(self, command: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
        payload = _dumps_with_torch_reductions(command)
        self._send_frame(payload, list(fds))

    def recv_command(self) -> tuple[dict[str, Any], list[int]]:
        """Side only: the next command and the descriptors that came with it."""
        payload, fds = self._recv_frame(limit=None)
        return pickle.loads(payload), fds

    # ---------------------------------------------------------------- side -> judge

    def send_reply(self, reply: dict[str, Any]) -> None:
        self._send_frame(json.dumps(reply, default=str, allow_nan=True).encode(), [])

    def recv_reply(self) -> dict[str, Any]:
        """Judge only: a JSON object, never a pickle; descriptors a side tries to attach are closed unread."""
        payload, fds = self._recv_frame(limit=MAX_REPLY_BYTES)
        for fd in fds:
            os.close(fd)
        try:
            reply = json.loads(payload)
        except ValueError as exc:
            raise BadReply(f"not JSON: {exc}") from None
        if not isinstance(reply, dict):
            raise BadReply(f"a JSON {type(reply).__name__}, not an object")
        return reply

    # ---------------------------------------------------------------- framing

    def _send_frame(self, payload: bytes, fds: list[int]) -> None:
        header = HEADER.pack(len(payload), len(fds))
        try:
            if fds:
                self.sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(header)
            self.sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from None

    def _recv_frame(self, *, limit: int | None) -> tuple[bytes, list[int]]:
        try:
            header, fds = _recv_header(self.sock)
        except ConnectionResetError as exc:
            raise ChannelClosed(str(exc)) from None
        length, _count = HEADER.unpack(header)
        if limit is not None and length > limit:
            for fd in fds:
                os.close(fd)
            raise BadReply(f"a reply of {length} bytes (at most {limit})")
        return self._recv_exactly(length), fds

    def _recv_exactly(self, size: int) -> bytes:
        chunks, got = [], 0
        while got < size:
            try:
                chunk = self.sock.recv(min(size - got, 1 << 20))
            except ConnectionResetError as exc:
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                raise ChannelClosed("the other end closed the channel")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


def _recv_header(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, ancillary, _flags, _addr = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(blob[: len(blob) - len(blob) % received.itemsize])
            fds.extend(received)
    if not data:
        raise ChannelClosed("the other end closed the channel")
    while len(data) < HEADER.size:
        more = sock.recv(HEADER.size - len(data))
        if not more:
            raise ChannelClosed("the other end closed the channel mid-frame")
        data += more
    return data, fds


def _dumps_with_torch_reductions(value: Any) -> bytes:
    """Pickle with torch's reductions registered, so a CUDA tensor becomes an IPC handle, not a copy."""
    import io
    from multiprocessing.reduction import ForkingPickler

    try:
        import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler
    except ImportError:
        pass
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------- shared tensors


class SharedCpuTensor:
    """A CPU tensor's bytes in a memfd: the judge keeps the fd, the side maps the same pages."""

    def __init__(self, fd: int, nbytes: int, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...],
                 offset: int) -> None:
        self.fd, self.nbytes, self.dtype, self.shape, self.stride, self.offset = fd, nbytes, dtype, shape, stride, offset

    def describe(self, fd_index: int) -> dict[str, Any]:
        return {"kind": "cpu", "fd_index": fd_index, "nbytes": self.nbytes, "dtype": str(self.dtype).split(".")[-1],
                "shape": list(self.shape), "stride": list(self.stride), "offset": self.offset}


def share_cpu_tensor(tensor: Any) -> tuple[Any, SharedCpuTensor]:
    """A copy of `tensor` (same shape, stride and offset) whose storage is shared memory, and its handle."""
    import torch

    storage = tensor.untyped_storage()
    nbytes = max(1, storage.nbytes())
    fd = os.memfd_create("kp-shared", 0)
    os.ftruncate(fd, nbytes)
    shared_storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", True, nbytes)
    if storage.nbytes():
        shared_storage.copy_(storage)
    shared = torch.empty(0, dtype=tensor.dtype).set_(shared_storage, tensor.storage_offset(), tensor.shape,
                                                     tensor.stride())
    return shared, SharedCpuTensor(fd, nbytes, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                                   tensor.storage_offset())


def open_cpu_tensor(description: dict[str, Any], fds: list[int]) -> Any:
    """Side: map a tensor the judge shared as a memfd."""
    import torch

    fd = fds[description["fd_index"]]
    storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", True, description["nbytes"])
    dtype = getattr(torch, description["dtype"])
    return torch.empty(0, dtype=dtype).set_(storage, description["offset"], tuple(description["shape"]),
                                            tuple(description["stride"]))


def encode_values(values: dict[str, Any], fds: list[int], keep: list[Any]) -> dict[str, Any]:
    """Judge: a command's view of inputs/outputs (tensors in place of their handles; other values as they are).

    CPU tensors must already be shared (share_cpu_tensor); their fds are appended to `fds`. CUDA tensors are
    left as tensors: pickling them through torch's reductions produces IPC handles.
    """
    import torch

    encoded: dict[str, Any] = {}
    for name, value in values.items():
        if torch.is_tensor(value) and value.device.type == "cpu":
            handle = keep_handle(value, keep)
            fds.append(handle.fd)
            encoded[name] = {"__shared_cpu__": handle.describe(len(fds) - 1)}
        else:
            encoded[name] = value
    return encoded


def keep_handle(tensor: Any, keep: list[Any]) -> SharedCpuTensor:
    for shared, handle in keep:
        if shared is tensor:
            return handle
    raise ValueError("a CPU tensor that was not shared with share_cpu_tensor")


def decode_values(values: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Side: the tensors behind a command's handles."""
    return {name: open_cpu_tensor(value["__shared_cpu__"], fds) if isinstance(value, dict) and "__shared_cpu__" in value
            else value for name, value in values.items()}
