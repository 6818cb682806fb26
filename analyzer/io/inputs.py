"""Stage 1, io (inputs): one input of a job, and its text read in bounded chunks.

`InputFile` is what the io stage hands on: a file on disk, a decompressed file, an archive member
or standard input, with its format (set by `analyzer.io.sniff`), its status and the reason when it
is not read. The parsers read it through `open_bytes` / `read_all`, or as text through
`iter_text_chunks` (invalid bytes, NULs and runaway lines handled, what was lost noted on it).
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from analyzer.bounds import MAX_NAME_CHARS, cap_text
from analyzer.io.streams import DecodingReader, SpanReader

SNIFF_BYTES = 64 << 10
CHUNK_BYTES = 32 << 20
# A line still without a newline after this many characters is cut there and the rest of it
# skipped, so a 200 MB line costs one chunk of memory (lines.py keeps 4,096 characters anyway).
MAX_LINE_CHARS_READ = 1 << 20

STDIN = "-"  # the path that names standard input
STDIN_NAME = "<stdin>"  # how standard input is shown in the report

# Characters a file name may hold that must not reach a report verbatim: C0/C1 controls drive the
# terminal, and lone surrogates (undecodable bytes under surrogateescape) are not valid UTF-8.
_UNPRINTABLE_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class DiscoveryError(Exception):
    """The job cannot be analysed at all (missing path, nothing readable)."""


@dataclass(eq=False)
class InputFile:
    """One input: a file on disk, a decompressed file, an archive member or standard input."""

    path: str  # shown to the user, relative to the job root
    format: str = "unknown"
    status: str = "pending"  # pending -> parsed | partial | skipped | error
    reason: str = ""
    size: int = 0
    rank_hint: int | None = None
    local_rank_hint: int | None = None
    lines: int = 0
    unparsed_lines: int = 0
    ranks: list[int] = field(default_factory=list)
    # Set when a cap (file count, directory depth, member size, memory) left this input, or the
    # inputs this row stands for, wholly or partly unread: the evidence may be in what was not read.
    capped: bool = False
    _disk_path: Path | None = None
    _payload: bytes | None = None  # raw bytes in memory (tests)
    _held: bytes | None = None  # an archive member or standard input as read once, zstd-compressed
    _span: tuple[Path, int, int] | None = None  # member of a tar on disk: (archive, offset, size), read on demand
    _codec: str | None = None  # the raw bytes are compressed: gzip, xz, bzip2 or zstd (`size` is theirs)
    _head: bytes | None = None  # first bytes read while walking, so sniffing does not reopen the file

    def skip(self, reason: str, status: str = "skipped") -> None:
        self.status, self.reason = status, reason

    def open_bytes(self) -> io.BufferedIOBase:
        raw: io.BufferedIOBase
        if self._held is not None:
            return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(self._held), read_across_frames=True)
        if self._payload is not None:
            raw = io.BytesIO(self._payload)
        elif self._span is not None:
            raw = io.BufferedReader(SpanReader(*self._span))
        else:
            raw = open(self._disk_path, "rb")  # noqa: SIM115 - the caller closes it
        if self._codec:
            return DecodingReader(raw, self._codec, self.size)
        return raw

    def read_head(self, limit: int = SNIFF_BYTES) -> bytes:
        with self.open_bytes() as fh:
            return fh.read(limit)

    def read_all(self, limit: int) -> bytes:
        with self.open_bytes() as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"larger than {limit} bytes")
        return data


def display_name(name: str) -> str:
    """File names are bytes: undecodable bytes and control characters are shown escaped (`\\xff`),
    and a name longer than MAX_NAME_CHARS (a 16 MB PAX member name) is cut, saying so."""
    if _UNPRINTABLE_NAME.search(name):
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        name = _UNPRINTABLE_NAME.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return cap_text(name, MAX_NAME_CHARS)


def iter_text_chunks(item: InputFile, chunk_bytes: int | None = None) -> Iterator[str]:
    """Decoded text in chunks of about `chunk_bytes` that end on a line boundary (all but the last).

    Memory stays at about one chunk whatever the input: invalid bytes become U+FFFD, NUL bytes are
    dropped, and a line longer than MAX_LINE_CHARS_READ keeps only its head. What was lost is
    noted on `item` once the whole input has been read (NULs and cut lines make it `partial`).
    """
    utf16 = item.format == "text-utf16"
    decoder = None
    carry = ""
    skipping = False  # inside a cut line: drop text up to its newline
    nuls = cut_lines = replaced = 0
    with item.open_bytes() as fh:
        while True:
            block = fh.read(chunk_bytes or CHUNK_BYTES)  # read at call time: a test shrinks it
            if decoder is None:
                # -sig: a byte-order mark is consumed, not left in front of the first line's prefix.
                encoding, order = _utf16_codec(block) if utf16 else ("utf-8-sig", "utf-8")
                decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
                genuine = "\ufffd".encode(order)  # a U+FFFD that the data itself holds
            text = decoder.decode(block, final=not block)
            if "\ufffd" in text:
                replaced += text.count("\ufffd") - block.count(genuine)
            if "\x00" in text:
                nuls += text.count("\x00")
                text = text.replace("\x00", "")
            if skipping:
                newline = text.find("\n")
                text = "" if newline < 0 else text[newline + 1 :]
                skipping = newline < 0
            text = carry + text if carry else text
            end = text.rfind("\n") + 1
            carry = text[end:]
            if len(carry) > MAX_LINE_CHARS_READ:
                cut_lines += 1
                yield text[:end] + carry[:MAX_LINE_CHARS_READ] + "\n"
                carry, skipping = "", True
            elif end:
                yield text[:end]
            if not block:
                break
    if carry:
        yield carry
    _note_lossy_text(item, nuls, cut_lines, replaced, "UTF-16" if utf16 else "UTF-8")


def _utf16_codec(head: bytes) -> tuple[str, str]:
    """(codec, byte order) of UTF-16 text: from its BOM, else from where ASCII's zero bytes sit."""
    if head.startswith(b"\xff\xfe"):
        return "utf-16", "utf-16-le"  # the utf-16 codec consumes the BOM
    if head.startswith(b"\xfe\xff"):
        return "utf-16", "utf-16-be"
    order = "utf-16-le" if head[1::2].count(0) >= head[0::2].count(0) else "utf-16-be"
    return order, order


def _note_lossy_text(item: InputFile, nuls: int, cut_lines: int, replaced: int, encoding: str) -> None:
    notes = []
    if nuls:
        notes.append(f"{nuls} NUL bytes dropped (blocks never written before a crash, or binary data)")
    if cut_lines:
        notes.append(f"{cut_lines} line(s) longer than {MAX_LINE_CHARS_READ} characters cut")
    if replaced > 0:
        notes.append(f"{replaced} invalid {encoding} sequence(s) shown as U+FFFD")
    if notes:
        item.reason = "; ".join([item.reason, *notes] if item.reason else notes)
    # A cap that left part of the input unread (standard input past its cap, the memory cap) makes
    # it partial like a cut line: the rest may hold the evidence.
    if (nuls or cut_lines or item.capped) and item.status == "pending":
        item.status = "partial"
