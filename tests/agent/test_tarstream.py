"""The agent's tar reader against tarfile's writer, the client's own writer, and broken or foreign streams."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kpremote.agent.tarstream import TarStream, TarStreamError
from kpremote.runs.sync import write_tar_member


def read_all(data: bytes, *, read1: bool = True) -> list[tuple[str, bytes, int, bool]]:
    stream = io.BufferedReader(io.BytesIO(data)) if read1 else _OnlyRead(data)
    tar = TarStream(stream)
    found = []
    for member in tar.members():
        pieces: list[bytes] = []
        tar.copy_data(member, lambda piece: pieces.append(bytes(piece)))
        found.append((member.name, b"".join(pieces), member.mode, member.regular))
    return found


class _OnlyRead:
    """A stream with read() and nothing else, returning short reads as a pipe does."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int) -> bytes:
        chunk, self.data = self.data[:min(size, 7000)], self.data[min(size, 7000):]
        return chunk


def tarfile_archive(files: dict[str, bytes], fmt: int, mode: int = 0o644) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


FILES = {
    "a.py": b"print('a')\n",
    "empty.txt": b"",
    "deep/" * 30 + "long_name.py": b"x = 1\n",  # 186 characters: a PAX path (or a ustar prefix)
    "données/ñ.py": "é = 1\n".encode(),
    "big.bin": bytes(range(256)) * 12289,  # 3 MiB + 256 bytes: spans several reads, odd padding
}


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_reads_what_tarfile_writes(fmt):
    files = FILES if fmt == tarfile.PAX_FORMAT else {k: v for k, v in FILES.items() if k.isascii()}
    found = read_all(tarfile_archive(files, fmt, mode=0o755))
    assert [(name, data) for name, data, _, _ in found] == list(files.items())
    assert all(mode == 0o755 and regular for _, _, mode, regular in found)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(
    st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\0"), min_size=1,
                     max_size=40), min_size=1, max_size=6).map("/".join),
    st.binary(max_size=2000), max_size=8))
def test_reads_back_whatever_the_client_writes(files):
    out = io.BytesIO()
    for name, data in files.items():
        write_tar_member(out, name, data, executable=len(data) % 2 == 1)
    out.write(b"\0" * 1024)
    found = read_all(out.getvalue(), read1=False)
    assert [(name, data) for name, data, _, _ in found] == list(files.items())
    assert [mode for *_, mode, _ in found] == [0o755 if len(d) % 2 else 0o644 for d in files.values()]


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE,
                                  tarfile.GNUTYPE_LONGNAME])
def test_members_that_are_not_regular_files_say_so(kind):
    out = io.BytesIO()
    info = tarfile.TarInfo("x")
    info.type = kind
    out.write(info.tobuf(format=tarfile.GNU_FORMAT))
    out.write(b"\0" * 1024)
    [(_, _, _, regular)] = read_all(out.getvalue())
    assert not regular


def test_a_corrupt_header_is_an_error_not_a_member():
    data = bytearray(tarfile_archive({"a.py": b"a"}, tarfile.USTAR_FORMAT))
    data[3] ^= 0x20  # one bit of the name: the checksum no longer matches
    with pytest.raises(TarStreamError, match="checksum"):
        read_all(bytes(data))


@pytest.mark.parametrize("cut", [100, 512 + 3, 2 * 512 + 100])
def test_a_cut_stream_is_an_error(cut):
    data = tarfile_archive({"a.py": b"a" * 700}, tarfile.USTAR_FORMAT)
    with pytest.raises(TarStreamError, match="ended"):
        read_all(data[:cut])


def test_a_malformed_pax_record_is_refused():
    out = io.BytesIO()
    records = b"99 path=x\n"  # claims 99 bytes, has 10
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, len(records)
    out.write(pax.tobuf(format=tarfile.USTAR_FORMAT) + records + b"\0" * (512 - len(records)))
    out.write(tarfile.TarInfo("x").tobuf(format=tarfile.USTAR_FORMAT) + b"\0" * 1024)
    with pytest.raises(TarStreamError, match="PAX"):
        read_all(out.getvalue())


def test_base256_sizes_are_read_and_negative_ones_refused():
    header = bytearray(tarfile.TarInfo("a").tobuf(format=tarfile.USTAR_FORMAT))
    for first, expect in ((0x80, 1000), (0xC0, None)):
        header[124:136] = bytes([first]) + (1000).to_bytes(11, "big")
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        data = bytes(header) + b"z" * 1000 + b"\0" * (24 + 1024)
        if expect is None:
            with pytest.raises(TarStreamError, match="negative"):
                read_all(data)
        else:
            [(_, content, _, _)] = read_all(data)
            assert content == b"z" * 1000
