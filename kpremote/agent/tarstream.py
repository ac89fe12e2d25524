"""Reading the sync's tar stream: the few member kinds the client writes, parsed straight from 512-byte blocks.

tarfile's streaming mode builds a TarInfo per member and reads through a 10 KiB record buffer: for 10,000 small
files that is ~0.6 s of CPU on the host, and syscalls (several per file) are what a first sync pays most for on
a slow or sandboxed kernel. This reader takes what the client sends (kpremote/runs/sync.py): ustar headers of regular
files, a PAX 'x' header before a long or non-ASCII name, zero blocks at the end. Anything else is refused, never
skipped: the sync stream has no business carrying links, devices or GNU extensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

BLOCK = 512
READ_SIZE = 1024 * 1024
REGULAR = (b"0", b"\0")
PAX_HEADER = b"x"
USTAR_MAGIC = b"ustar"
PAX_LIMIT = 1024 * 1024


class TarStreamError(Exception):
    """The stream is cut, corrupt, or holds a member kind the sync never sends."""


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    mode: int
    regular: bool


class TarStream:
    """Members of an uncompressed tar read from a byte stream, in order; each member's data is read once."""

    def __init__(self, stream: BinaryIO) -> None:
        self._read = getattr(stream, "read1", stream.read)  # read1: whatever one read of the pipe gives
        self._buffer = bytearray()
        self._pending_data = 0  # data + padding of the member last yielded, not consumed yet

    def members(self) -> Iterator[Member]:
        """Each member in turn; stops at the end-of-archive zero block. Call copy_data before the next one."""
        while True:
            if self._pending_data:
                raise TarStreamError("a member's data was not read before the next header")
            block = self._exact(BLOCK)
            if not any(block):
                return
            member = _parse_header(block)
            if member is PAX_HEADER:
                overrides = _parse_pax(self._exact(_padded(_header_size(block))), limit=PAX_LIMIT)
                member = _parse_header(self._exact(BLOCK))
                if member is PAX_HEADER:
                    raise TarStreamError("two PAX headers in a row")
                member = Member(overrides.get("path", member.name), int(overrides.get("size", member.size)),
                                member.mode, member.regular)
            self._pending_data = _padded(member.size)
            yield member

    def copy_data(self, member: Member, sink: Callable[[memoryview], None]) -> None:
        """Hand the member's data to sink in pieces (each valid only during the call), then skip its padding."""
        left = member.size
        while left:
            if not self._buffer:
                self._fill(1)
            piece = memoryview(self._buffer)[:left]
            try:
                sink(piece)
            finally:
                piece.release()
            taken = min(left, len(self._buffer))
            del self._buffer[:taken]
            left -= taken
        self._exact(_padded(member.size) - member.size)
        self._pending_data = 0

    def _exact(self, count: int) -> bytes:
        if len(self._buffer) < count:
            self._fill(count)
        taken = bytes(self._buffer[:count])
        del self._buffer[:count]
        return taken

    def _fill(self, count: int) -> None:
        while len(self._buffer) < count:
            chunk = self._read(max(READ_SIZE, count - len(self._buffer)))
            if not chunk:
                raise TarStreamError("the stream ended inside a member")
            self._buffer += chunk


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _parse_header(block: bytes) -> "Member | bytes":
    """The member a ustar header describes, or PAX_HEADER for an extended header that names the next one."""
    stored = _number(block[148:156], "checksum")
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])  # the checksum field counts as spaces
    if stored != computed:
        raise TarStreamError("a header's checksum does not match (corrupt stream)")
    kind = block[156:157]
    if kind == PAX_HEADER:
        return PAX_HEADER
    name = _text(block[0:100])
    if block[257:262] == USTAR_MAGIC:
        prefix = _text(block[345:500])
        name = f"{prefix}/{name}" if prefix else name
    return Member(name, _header_size(block), _number(block[100:108], "mode"), kind in REGULAR)


def _header_size(block: bytes) -> int:
    return _number(block[124:136], "size")


def _number(field: bytes, what: str) -> int:
    """An octal field (NUL/space terminated), or base-256 when its first byte has the high bit set."""
    if field[:1] and field[0] & 0x80:
        if field[0] & 0x40:
            raise TarStreamError(f"a header's {what} field is negative")
        return int.from_bytes(field[1:], "big") + ((field[0] & 0x3F) << (8 * (len(field) - 1)))
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarStreamError(f"a header's {what} field is not a number: {bytes(field)!r}") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes, limit: int) -> dict[str, str]:
    """'LEN key=value\\n' records; values are UTF-8."""
    if len(data) > limit:
        raise TarStreamError("a PAX header is implausibly large")
    records: dict[str, str] = {}
    at = 0
    while at < len(data) and data[at] != 0:
        space = data.find(b" ", at)
        try:
            length = int(data[at:space])
        except ValueError:
            raise TarStreamError("a PAX record has no valid length") from None
        record = data[space + 1:at + length]
        if length <= 0 or at + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise TarStreamError("a PAX record is malformed")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    if "size" in records and not records["size"].isdigit():
        raise TarStreamError(f"a PAX size is not a number: {records['size']!r}")
    return records
