"""Stage 1, discover: find every input of a job directory and classify it by content.

Walks the directory read-only (never following symlinks out of the root), reads `.gz` files and
`.tar` members in place, streamed, with size and ratio caps, sniffs each file's first bytes to decide its
format, and records path-layout hints (torchrun `attempt_N/<local_rank>/`, per-rank file names)
that correlate uses for attribution. Nothing here parses lines.
"""

from __future__ import annotations

import codecs
import errno
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Caps that keep one hostile input from exhausting the machine.
MAX_FILES = 200_000
MAX_DECOMPRESSED_BYTES = 4 << 30
MAX_COMPRESSION_RATIO = 200
# Deflate tops out near 1,030:1; text logs compress 5-50:1, a page of one repeated line ~300:1.
BOMB_RATIO = 500
BOMB_CHECK_AFTER = 16 << 20
MAX_ARCHIVE_MEMBER_BYTES = 512 << 20
SNIFF_BYTES = 64 << 10
CHUNK_BYTES = 32 << 20
# A line still without a newline after this many characters is cut there and the rest of it
# skipped, so a 200 MB line costs one chunk of memory (lines.py keeps 4,096 characters anyway).
MAX_LINE_CHARS_READ = 1 << 20

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PICKLE_PROTOCOL_2_PLUS = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"
SQLITE_MAGIC = b"SQLite format 3\x00"  # `nsys export --type sqlite`; the parser checks the tables
# A profiler trace can be GBs: recognise it from its head instead of parsing the whole document.
_KINETO_HEAD = re.compile(rb'"traceEvents"\s*:\s*\[|^\s*\{\s*"schemaVersion"\s*:')
# `nsys stats --format csv` reports: a header row of columns such as "Total Time (ns)" or "Start (ns)".
_NSYS_STATS_CSV = re.compile(rb"^[^\n]*(?:Time \(%\)|Start \(ns\)|Projected Start \(ns\))[^\n]*,[^\n]*\(ns\)")
# safetensors: 8-byte little-endian header length, then a JSON header starting with '{"'.
_SAFETENSORS_HEADER = re.compile(rb"^[\s\S]{4}\x00{4}\{\"", re.DOTALL)
# Pickled checkpoints: torch.save's legacy (non-zip) format opens with its pickled magic number;
# a torch.distributed.checkpoint `.metadata` names its module within the first bytes.
_TORCH_PICKLE_CHECKPOINT = re.compile(rb"^\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19|^\x80[\x02-\x05][\s\S]{0,96}torch\.distributed\.checkpoint")

_TORCHRUN_RANK_DIR = re.compile(r"attempt_(\d+)/(\d+)/(?:stdout|stderr)\.log(?:\.gz)?$")
_PYSPY_TEXT = re.compile(rb"\s*Process \d+: .*\n(?:Python v|Thread )")
# nccl-tests / rccl-tests output (its header, column header or summary line), read as text too.
_NCCL_TESTS = re.compile(
    rb"(?m)^[^\n]{0,48}?(?:#\s*)?nThread \d+ nGpus \d+ |^[^\n]{0,48}?#?\s*Avg bus bandwidth\s*:|^[^\n]{0,48}?#\s+size\s+count\s+type\s"
    rb"|^[^\n]{0,48}?#\s+\(B\)\s+\(elements\)"  # a pasted table: its unit line, or a row of a type nccl-tests names
    rb"|^(?:\[\d+\])?\s*\d+\s+\d+\s+(?:float|double|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|f8e\w+)\s+(?:sum|prod|min|max|avg|none|mulsum|-?\d+)\s"
)
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)(?:\D|$)", re.IGNORECASE)
# A run of NULs inside text is crash padding (blocks allocated but never written before the host
# died); scattered NULs are binary structure.
_NUL_RUN = re.compile(rb"\x00{16,}")
# Characters a file name may hold that must not reach a report verbatim: C0/C1 controls drive the
# terminal, and lone surrogates (undecodable bytes under surrogateescape) are not valid UTF-8.
_UNPRINTABLE_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class DiscoveryError(Exception):
    """The job cannot be analysed at all (missing path, nothing readable)."""


@dataclass(eq=False)
class InputFile:
    """One input: a file on disk, a decompressed .gz, or an archive member."""

    path: str  # shown to the user, relative to the job root
    format: str = "unknown"
    status: str = "pending"  # pending -> parsed | partial | skipped | error
    reason: str = ""
    size: int = 0
    rank_hint: int | None = None
    local_rank_hint: int | None = None
    attempt: int | None = None
    lines: int = 0
    unparsed_lines: int = 0
    ranks: list[int] = field(default_factory=list)
    _disk_path: Path | None = None
    _payload: bytes | None = None  # in-memory content (tests; sparse archive members)
    _span: tuple[Path, int, int] | None = None  # tar member: (archive, offset, size), read on demand
    _gzip: bool = False
    _head: bytes | None = None  # first bytes read while walking, so sniffing does not reopen the file

    def skip(self, reason: str, status: str = "skipped") -> None:
        self.status, self.reason = status, reason

    def open_bytes(self) -> io.BufferedIOBase:
        raw: io.BufferedIOBase
        if self._payload is not None:
            raw = io.BytesIO(self._payload)
        elif self._span is not None:
            raw = io.BufferedReader(_SpanReader(*self._span))
        else:
            raw = open(self._disk_path, "rb")  # noqa: SIM115 - the caller closes it
        if self._gzip:
            return _CappedReader(raw, self.size)
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


class _CappedReader(io.RawIOBase):
    """Gunzips a stream (every member) counting bytes in and out exactly, and stops a gzip bomb early.

    Two caps: the whole output may not pass MAX_COMPRESSION_RATIO times the file's size (at least
    1 MiB of it), and past BOMB_CHECK_AFTER of output, the output may not pass BOMB_RATIO times the
    input read so far; a bomb then fails on its first chunk instead of after hundreds of MB parsed.
    """

    def __init__(self, raw: io.BufferedIOBase, compressed_size: int):
        self._raw = raw
        self._limit = min(MAX_DECOMPRESSED_BYTES, max(compressed_size, 1 << 20) * MAX_COMPRESSION_RATIO)
        self._inflate = zlib.decompressobj(31)
        self._member_open = False  # inside a gzip member: input ending now means truncation
        self._pending = b""  # compressed input read but not yet consumed
        self._read = self._seen = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = self._limit + 1 if size is None or size < 0 else size
        parts, got = [], 0
        while got < want:
            if not self._pending:
                self._pending = self._raw.read(64 << 10)
                self._read += len(self._pending)
                if not self._pending:
                    if self._member_open:
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                    break
            if self._inflate.eof:  # the previous member ended and more input follows: the next member
                self._inflate = zlib.decompressobj(31)
            self._member_open = True
            data = self._inflate.decompress(self._pending, want - got)
            if self._inflate.eof:
                self._pending, self._member_open = self._inflate.unused_data, False
            else:
                self._pending = self._inflate.unconsumed_tail
            parts.append(data)
            got += len(data)
            self._seen += len(data)
            self._check()
        return b"".join(parts)

    def _check(self) -> None:
        if self._seen > self._limit:
            raise DecompressionLimit(f"decompressed size exceeds {self._limit} bytes (possible gzip bomb)")
        consumed = max(self._read - len(self._pending), 1)
        if self._seen > BOMB_CHECK_AFTER and self._seen > BOMB_RATIO * consumed:
            raise DecompressionLimit(f"{self._seen} bytes out of {consumed} compressed: over {BOMB_RATIO}x "
                                     "(possible gzip bomb)")

    def close(self) -> None:
        self._raw.close()
        super().close()


class DecompressionLimit(Exception):
    pass


class _SpanReader(io.RawIOBase):
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


def discover(root: str | os.PathLike[str]) -> list[InputFile]:
    """List and classify every input under `root` (a directory, a single file, or an archive)."""
    root_path = Path(root)
    if not root_path.exists():
        raise DiscoveryError(f"no such file or directory: {root}")
    if not os.access(root_path, os.R_OK):
        raise DiscoveryError(f"permission denied: {root}")
    if root_path.is_file():
        found = _expand(root_path, _display_name(root_path.name), root_path.parent.resolve())
    else:
        found = _walk(root_path)
    inputs = []
    for item in found:  # classified as found: a file's sniffed head is dropped before the next is read
        if item.status == "pending":
            _classify(item)
        item._head = None
        _apply_layout_hints(item)
        inputs.append(item)
    return sorted(inputs, key=lambda f: f.path)


def _walk(root: Path) -> Iterator[InputFile]:
    real_root = root.resolve()
    count = 0
    unlistable: list[OSError] = []  # os.walk reports a directory it cannot list here, then goes on
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=unlistable.append):
        yield from _unlistable_dirs(unlistable, root)
        dirnames.sort()
        for name in dirnames:  # os.walk lists a symlink to a directory here and does not descend it
            if os.path.islink(os.path.join(dirpath, name)):
                rel = _display_name((Path(dirpath) / name).relative_to(root).as_posix())
                yield InputFile(rel, status="skipped", reason="symlink to a directory; not followed")
        for name in sorted(filenames):
            count += 1
            full = Path(dirpath) / name
            rel = _display_name(full.relative_to(root).as_posix())
            if count > MAX_FILES:
                yield InputFile(rel, status="skipped", reason=f"more than {MAX_FILES} files; rest not read")
                return
            yield from _expand(full, rel, real_root)
    yield from _unlistable_dirs(unlistable, root)


def _unlistable_dirs(errors: list[OSError], root: Path) -> Iterator[InputFile]:
    """A directory that cannot be listed is an input-table entry, not a silent gap."""
    while errors:
        exc = errors.pop(0)
        where = Path(exc.filename) if exc.filename else root
        try:
            rel = where.relative_to(root).as_posix()
        except ValueError:
            rel = str(where)
        yield InputFile(_display_name(rel if rel != "." else str(root)) + "/", format="directory",
                        status="error", reason=f"cannot list directory: {exc.strerror or exc}")


def _display_name(name: str) -> str:
    """File names are bytes: undecodable bytes and control characters are shown escaped (`\\xff`)."""
    if not _UNPRINTABLE_NAME.search(name):
        return name
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _UNPRINTABLE_NAME.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _expand(full: Path, rel: str, real_root: Path) -> Iterator[InputFile]:
    item = InputFile(rel, _disk_path=full)
    try:
        if full.is_symlink():
            try:
                target = full.resolve(strict=True)
            except FileNotFoundError:
                item.skip("dangling symlink: its target does not exist")
                yield item
                return
            except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop before Python 3.13
                if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
                    item.skip("symlink loop; not followed")
                else:
                    item.skip(f"unreadable symlink: {exc.strerror or exc}", status="error")
                yield item
                return
            if not target.is_relative_to(real_root):
                item.skip("symlink points outside the job directory; not followed")
                yield item
                return
            if not target.is_file():
                item.skip("symlink to something that is not a regular file")
                yield item
                return
        if not full.is_file():
            item.skip("not a regular file")
            yield item
            return
        item.size = full.stat().st_size
        with open(full, "rb") as fh:
            magic = fh.read(SNIFF_BYTES)
    except OSError as exc:
        item.skip(f"unreadable: {exc.strerror or exc}", status="error")
        yield item
        return
    if item.size == 0:
        item.format = "empty"
        item.skip("empty file")
        yield item
        return
    if magic.startswith(GZIP_MAGIC):
        item._gzip = True
        yield item
        return
    if magic.startswith(ZSTD_MAGIC):
        item.format = "zstd"
        item.skip("zstd-compressed; decompress it first (zstd -d) or install a zstd reader")
        yield item
        return
    if len(magic) >= 262 and magic[257:262] == b"ustar":
        yield from _tar_members(item)
        return
    item._head = magic
    yield item


def _tar_members(archive: InputFile) -> Iterator[InputFile]:
    """Archive members are read from the archive on demand, never extracted: `../` names cannot escape anything."""
    try:
        with tarfile.open(archive._disk_path, "r:*") as tar:
            for count, member in enumerate(tar, start=1):
                rel = f"{archive.path}!{_display_name(member.name)}"
                if count > MAX_FILES:
                    yield InputFile(rel, status="skipped", reason=f"more than {MAX_FILES} archive members; rest not read")
                    break
                if member.issym() or member.islnk():
                    yield InputFile(rel, status="skipped", reason="link inside archive; not followed")
                    continue
                if member.ischr() or member.isblk() or member.isfifo():
                    yield InputFile(rel, status="skipped", reason="device or FIFO inside archive; not read")
                    continue
                if not member.isfile():
                    continue
                if member.size > MAX_ARCHIVE_MEMBER_BYTES:
                    yield InputFile(rel, status="skipped", reason=f"archive member larger than {MAX_ARCHIVE_MEMBER_BYTES} bytes")
                    continue
                if member.issparse():  # its bytes are not one range of the archive
                    fh = tar.extractfile(member)
                    item = InputFile(rel, size=member.size, _payload=fh.read() if fh else b"")
                elif member.offset_data + member.size > archive.size:
                    present = max(archive.size - member.offset_data, 0)
                    yield InputFile(rel, status="error", reason=f"archive ends inside this member ({present} of {member.size} bytes)")
                    continue
                else:
                    item = InputFile(rel, size=member.size, _span=(archive._disk_path, member.offset_data, member.size))
                if ".." in Path(member.name).parts or member.name.startswith("/"):
                    item.reason = "member name escapes the archive root (read in place, never extracted)"
                if not member.size:
                    item.format = "empty"
                    item.skip("empty file")
                elif item.read_head(len(GZIP_MAGIC)) == GZIP_MAGIC:
                    item._gzip = True
                yield item
    except (tarfile.TarError, OSError, EOFError) as exc:
        archive.format = "tar"
        archive.skip(f"unreadable archive: {exc}", status="error")
        yield archive


def _classify(item: InputFile) -> None:
    try:
        head = item._head if item._head is not None else item.read_head()
    except (OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        item.format = "gzip" if item._gzip else "unknown"
        item.skip(f"cannot read: {exc}", status="error")
        return
    if not head:
        item.format = "empty"
        item.skip("empty after decompression")
        return
    if head.startswith(ZIP_MAGIC) or _SAFETENSORS_HEADER.match(head) or _TORCH_PICKLE_CHECKPOINT.match(head):
        item.format = "checkpoint"
        item.skip("checkpoint or zip archive: audited by the checkpoint analysis, not parsed as a log")
        return
    if head.startswith(PICKLE_PROTOCOL_2_PLUS):
        item.format = "pickle"
        return
    if head.startswith(SQLITE_MAGIC):
        item.format = "nsys_sqlite"
        return
    stripped = head.lstrip()
    if stripped[:1] == b"{" and _KINETO_HEAD.search(head):
        item.format = "kineto_trace"
        return
    if _NSYS_STATS_CSV.match(head):
        item.format = "nsys_stats_csv"
        return
    if stripped[:1] in (b"{", b"["):
        item.format = _json_kind(item, stripped)
        if item.format != "text":
            return
    if _PYSPY_TEXT.match(head):
        item.format = "pyspy_text"
        return
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _looks_utf16(head):
        item.format = "text-utf16"
        return
    if _looks_binary(head):
        item.format = "binary"
        if not head.strip(b"\x00"):
            item.skip("nothing but NUL bytes (blocks never written before a crash?)")
        else:
            item.skip("binary content (not a log, dump or trace this version reads)")
        return
    item.format = "nccl_tests" if _NCCL_TESTS.search(head) else "text"


def _json_kind(item: InputFile, head: bytes) -> str:
    try:
        doc = json.loads(item.read_all(64 << 20))
    except (ValueError, RecursionError, OSError, EOFError, zlib.error, DecompressionLimit):
        return "text"  # JSON Lines or a log that starts with a bracket
    if isinstance(doc, dict) and "postmortem_capture" in doc:
        return "capture_manifest"  # written by `postmortem capture`
    if isinstance(doc, dict) and "message" in doc:
        return "error_json"
    if isinstance(doc, dict) and ("entries" in doc or "pg_config" in doc):
        return "flight_recorder_json"
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "frames" in doc[0] and "thread_id" in doc[0]:
        return "pyspy_json"
    if isinstance(doc, dict) and "traceEvents" in doc:
        return "kineto_trace"
    return "json"


def _looks_binary(head: bytes) -> bool:
    # Runs of NULs are judged apart: a log whose last blocks never reached the disk before the host
    # died is NUL-padded text, and its lines are the evidence (the reader drops the NULs).
    text = _NUL_RUN.sub(b"", head)
    if not text.strip(b"\x00"):
        return True  # nothing but NULs
    if b"\x00" in text and not _looks_utf16(head):
        return True
    sample = text[:8192]
    control = sum(1 for b in sample if b < 9 or 13 < b < 27 or 27 < b < 32)
    return control > len(sample) * 0.10


def _looks_utf16(head: bytes) -> bool:
    sample = head[:4096]
    if len(sample) < 4:
        return False
    odd_zero = sample[1::2].count(0) / (len(sample) / 2)
    even_zero = sample[0::2].count(0) / (len(sample) / 2)
    # UTF-16 puts its zero bytes on one side only; NUL padding fills both.
    return (odd_zero > 0.4 or even_zero > 0.4) and min(odd_zero, even_zero) < 0.2


def _apply_layout_hints(item: InputFile) -> None:
    member_path = item.path.split("!")[-1]
    match = _TORCHRUN_RANK_DIR.search(member_path)
    if match:
        item.attempt, item.local_rank_hint = int(match.group(1)), int(match.group(2))
        return
    name_match = _RANK_IN_NAME.search(Path(member_path).name)
    if name_match:
        item.rank_hint = int(name_match.group(1))


def iter_text_chunks(item: InputFile, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
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
            block = fh.read(chunk_bytes)
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
    if not notes:
        return
    item.reason = "; ".join([item.reason, *notes] if item.reason else notes)
    if (nuls or cut_lines) and item.status == "pending":
        item.status = "partial"
