"""Stage 1, io (decompression): compressed streams read under size and ratio caps.

gzip (every member of a `cat a.gz b.gz`), xz, bzip2 and zstd are recognised by their first bytes
(`codec_of`) and decoded as a stream by `DecodingReader`, which stops a bomb on its first chunks.
`SpanReader` streams a byte range of a file (a member of a tar on disk), `Prefixed` puts a sniffed
head back in front of a stream that cannot be reopened.
"""

from __future__ import annotations

import bz2
import io
import lzma
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import zstandard

from analyzer.bounds import DecompressionLimit

# Caps that keep one hostile compressed input from exhausting the machine.
MAX_DECOMPRESSED_BYTES = 4 << 30
MAX_COMPRESSION_RATIO = 200
# Deflate tops out near 1,030:1; text logs compress 5-50:1, a page of one repeated line ~300:1.
BOMB_RATIO = 500
BOMB_CHECK_AFTER = 16 << 20
XZ_MEMLIMIT = 256 << 20  # xz -9 needs 65 MiB to decode
ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit (128 MiB); `--long=31` frames are refused

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
# zstd: a frame's magic, or a skippable frame's (0x184D2A50-5F, pzstd writes one first).
_ZSTD_HEAD = re.compile(rb"\x28\xb5\x2f\xfd|[\x50-\x5f]\x2a\x4d\x18")
# bzip2: "BZh", the block size digit, then a block's or the end-of-stream's magic (pi, sqrt(pi)).
_BZIP2_HEAD = re.compile(rb"BZh[1-9](?:\x31\x41\x59\x26\x53\x59|\x17\x72\x45\x38\x50\x90)")
ZIP_MAGIC = b"PK\x03\x04"
ZIP_EMPTY_MAGIC = b"PK\x05\x06"


class CorruptStream(ValueError):
    """Compressed data the codec cannot decode (zstd's own errors, given a type the stages know)."""


# What reading a compressed input or an archive may raise on bad data: a per-input status, never a crash.
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile,
               DecompressionLimit)


class _ZlibDecoder:
    """zlib's gzip decoder behind the interface of lzma's and bz2's decompressors (eof, unused_data,
    needs_input, decompress with an output bound)."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(31)
        self._tail = b""  # input given but not yet consumed (zlib hands it back, lzma keeps it)

    @property
    def eof(self) -> bool:
        return self._inflate.eof

    @property
    def unused_data(self) -> bytes:
        return self._inflate.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._tail

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._inflate.decompress(self._tail + data if self._tail else data, max_length)
        self._tail = self._inflate.unconsumed_tail
        return out


class _ZstdDecoder:
    """zstandard's decompressobj has no output bound, so it is fed small pieces: one call yields at
    most FEED bytes times zstd's best ratio (~32,000:1), 32 MiB, before the bomb check runs."""

    FEED = 1 << 10

    def __init__(self) -> None:
        self._frame = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj()
        self._tail = b""

    @property
    def eof(self) -> bool:
        return self._frame.eof

    @property
    def unused_data(self) -> bytes:
        return self._frame.unused_data + self._tail

    @property
    def needs_input(self) -> bool:
        return not self._tail

    def decompress(self, data: bytes, max_length: int) -> bytes:
        data = self._tail + data if self._tail else data
        piece, self._tail = data[: self.FEED], data[self.FEED :]
        try:
            return self._frame.decompress(piece)
        except zstandard.ZstdError as exc:
            raise CorruptStream(f"zstd: {exc}") from exc


_DECODERS: dict[str, Callable[[], object]] = {
    "gzip": _ZlibDecoder,
    "xz": lambda: lzma.LZMADecompressor(memlimit=XZ_MEMLIMIT),  # .xz and legacy .lzma
    "bzip2": bz2.BZ2Decompressor,
    "zstd": _ZstdDecoder,
}


def codec_of(head: bytes) -> str | None:
    """The compression a stream's first bytes show, or None."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(XZ_MAGIC):
        return "xz"
    if _ZSTD_HEAD.match(head):
        return "zstd"
    if _BZIP2_HEAD.match(head):
        return "bzip2"
    return None


def is_tar(head: bytes) -> bool:
    return len(head) >= 262 and head[257:262] == b"ustar"


def is_zip(head: bytes) -> bool:
    return head.startswith((ZIP_MAGIC, ZIP_EMPTY_MAGIC))


class DecodingReader(io.RawIOBase):
    """Decompresses a stream (every gzip member, xz or bzip2 stream, zstd frame in turn), counting
    bytes in and out, and stops a bomb early.

    Two caps: the whole output may not pass MAX_COMPRESSION_RATIO times the input's size (at least
    1 MiB of it; a stream of unknown size, standard input, only MAX_DECOMPRESSED_BYTES), and past
    BOMB_CHECK_AFTER of output, the output may not pass BOMB_RATIO times the input read so far; a
    bomb then fails on its first chunks instead of after hundreds of MB parsed.
    """

    READ_BYTES = 16 << 10  # small reads keep the input count, and so the ratio check, close to exact

    def __init__(self, raw: io.BufferedIOBase, codec: str, compressed_size: int | None):
        self._raw, self._codec, self._new = raw, codec, _DECODERS[codec]
        self._decoder = self._new()
        self._limit = MAX_DECOMPRESSED_BYTES
        if compressed_size:
            self._limit = min(self._limit, max(compressed_size, 1 << 20) * MAX_COMPRESSION_RATIO)
        self._out = b""  # decoded but not yet returned (a zstd piece may decode to more than asked)
        self._read = self._seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        want = self._limit + 1 if size is None or size < 0 else size
        parts, got = ([self._out], len(self._out)) if self._out else ([], 0)
        while got < want:
            data = self._decode(want - got)
            if data is None:
                break
            parts.append(data)
            got += len(data)
        data = b"".join(parts)
        data, self._out = data[:want], data[want:]
        return data

    def _decode(self, want: int) -> bytes | None:
        """Up to about `want` more decoded bytes (maybe none yet); None at the end of the input."""
        if self._decoder.eof:  # a member ended: more input means another member (`cat a.gz b.gz`)
            feed = self._decoder.unused_data or self._next_input()
            if not feed:
                return None
            self._decoder = self._new()
        elif self._decoder.needs_input:
            feed = self._next_input()
            if not feed:
                if self._read:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return None
        else:
            feed = b""
        data = self._decoder.decompress(feed, want)
        self._seen += len(data)
        self._check()
        return data

    def _next_input(self) -> bytes:
        block = self._raw.read(self.READ_BYTES)
        self._read += len(block)
        return block

    def _check(self) -> None:
        if self._seen > self._limit:
            raise DecompressionLimit(f"decompressed size exceeds {self._limit} bytes (possible {self._codec} bomb)")
        if self._seen > BOMB_CHECK_AFTER and self._seen > BOMB_RATIO * max(self._read, 1):
            raise DecompressionLimit(f"{self._seen} bytes out of {self._read} compressed: over {BOMB_RATIO}x "
                                     f"(possible {self._codec} bomb)")

    def close(self) -> None:
        self._raw.close()
        super().close()


class SpanReader(io.RawIOBase):
    """A byte range of a file (an uncompressed tar member), streamed: a member is never held whole."""

    def __init__(self, path: Path, offset: int, size: int):
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._fh.seek(offset)
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._left)
        if n <= 0:
            return 0
        got = self._fh.readinto(memoryview(buffer)[:n])
        self._left -= got
        return got

    def close(self) -> None:
        self._fh.close()
        super().close()


class Prefixed(io.RawIOBase):
    """A stream whose first bytes were already read to sniff it: those bytes, then the rest."""

    def __init__(self, head: bytes, stream: io.IOBase):
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def read_up_to(stream: io.IOBase, limit: int) -> bytes:
    """`limit` bytes of `stream`, fewer only at its end (a pipe or a member may return short reads)."""
    parts, got = [], 0
    while got < limit:
        block = stream.read(limit - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)
