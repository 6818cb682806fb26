"""Stage 1, discover: find every input of a job and classify it by content.

Walks the directory read-only and iteratively (never following symlinks out of the root, never
deeper than MAX_DEPTH levels), or reads one file, or standard input (`-`). Compressed files
(gzip, xz, bzip2, zstd) and archives (tar, compressed tar, zip) are recognised by their first bytes
and read in memory, never extracted, under size, ratio and memory caps: members of a tar on disk
are read in place on demand, members of a compressed tar or a zip (and standard input) are read
once and held zstd-compressed. Each input's first bytes decide its format. Every cap that leaves
something unread says so with a row (status skipped, `capped` set), so a report can never pass off
unread evidence as a clean run. Path-layout hints (torchrun `attempt_N/<local_rank>/`, per-rank
file names) are recorded for correlate. Nothing here parses lines.
"""

from __future__ import annotations

import bz2
import codecs
import errno
import io
import json
import lzma
import os
import re
import stat
import sys
import tarfile
import tomllib
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath

import zstandard

from analyzer.bounds import MAX_NAME_CHARS, cap_text, rank_number
from analyzer.resources import data_dir

# Caps that keep one hostile input from exhausting the machine.
MAX_FILES = 200_000  # inputs read from one directory (or one archive)
MAX_LISTED = 1_000_000  # directory entries listed; the file cap chooses among them
MAX_DEPTH = 64  # directory levels walked below the root
MAX_NESTING = 1  # archives opened inside an archive's member (a .tar.gz inside a .zip), not deeper
MAX_DECOMPRESSED_BYTES = 4 << 30
MAX_COMPRESSION_RATIO = 200
# Deflate tops out near 1,030:1; text logs compress 5-50:1, a page of one repeated line ~300:1.
BOMB_RATIO = 500
BOMB_CHECK_AFTER = 16 << 20
MAX_ARCHIVE_MEMBER_BYTES = 512 << 20
# Archive members and standard input are held in memory zstd-compressed (level 1: ~400 MB/s, text
# 5-20:1); past this many held bytes, what is left is not read.
MAX_HELD_BYTES = 768 << 20
HOLD_LEVEL = 1
XZ_MEMLIMIT = 256 << 20  # xz -9 needs 65 MiB to decode
ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit (128 MiB); `--long=31` frames are refused
SNIFF_BYTES = 64 << 10
PRIORITY_SNIFF_BYTES = 4 << 10  # what the file cap reads of each file to rank it
CHUNK_BYTES = 32 << 20
# A line still without a newline after this many characters is cut there and the rest of it
# skipped, so a 200 MB line costs one chunk of memory (lines.py keeps 4,096 characters anyway).
MAX_LINE_CHARS_READ = 1 << 20

STDIN = "-"  # the path that names standard input
STDIN_NAME = "<stdin>"  # how standard input is shown in the report

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
# zstd: a frame's magic, or a skippable frame's (0x184D2A50-5F, pzstd writes one first).
_ZSTD_HEAD = re.compile(rb"\x28\xb5\x2f\xfd|[\x50-\x5f]\x2a\x4d\x18")
# bzip2: "BZh", the block size digit, then a block's or the end-of-stream's magic (pi, sqrt(pi)).
_BZIP2_HEAD = re.compile(rb"BZh[1-9](?:\x31\x41\x59\x26\x53\x59|\x17\x72\x45\x38\x50\x90)")
PICKLE_PROTOCOL_2_PLUS = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"
ZIP_EMPTY_MAGIC = b"PK\x05\x06"
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
# Source code and markup beside the logs (a training script, a documentation folder) hold words
# such as "Error" and "failed" that are code, not events. A text whose first lines are mostly
# code-shaped and carry no log marker is skipped as source, so it can neither raise a finding nor
# pass for a training log.
_LOG_MARKER = re.compile(
    rb"Traceback \(most recent call last\)|NCCL (?:INFO|WARN)|\[rank\d+\]|ProcessGroup\w*\.cpp"
    rb"|^\s*\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d|^[IWEF]\d{4} \d\d:\d\d|^\w[\w.\-]*:\d+:\d+ \[\d+\]"
    # a launch script or an environment dump: the settings a finding's cause may be read from
    rb"|\b(?:NCCL|TORCH|GLOO|CUDA|MASTER|UCX)_[A-Z0-9_]+=",
    re.MULTILINE,
)
_MARKUP_HEAD = re.compile(rb"^\s*(?:<!DOCTYPE\s+html|<html\b|<\?xml\b|<svg\b)", re.IGNORECASE)
_CODE_LINE = re.compile(
    rb"^\s*(?:"
    rb"[^{}\n;]*\{[^{}\n]*\}\s*(?:/\*.*\*/)?"  # a CSS rule on one line
    rb"|[^{}\n;]+\{|\}[);,]*"  # a block opened or closed (CSS, JS)
    rb"|[\w\-]+\s*:\s*[^;\n]+;(?:\s*/\*.*\*/)?"  # a CSS property
    rb"|(?:/\*|\*/|\*\s|//|#!?\s).*"  # a comment
    rb"|(?:def|class|async def)\s+\w+.*:|(?:import|from)\s+[\w.]+.*|@\w[\w.]*(?:\(.*\))?"  # Python
    rb"|(?:return|raise|elif|while|for|if|with|try|except|finally|else)\b.*"
    rb"|(?:function|var|let|const)\b.*"  # JavaScript
    rb")\s*$"
)
SOURCE_SNIFF_LINES = 200
SOURCE_SHARE = 0.6


def _looks_like_source(head: bytes) -> bool:
    if _LOG_MARKER.search(head):
        return False
    if _MARKUP_HEAD.match(head):
        return True
    lines = [line for line in head.split(b"\n")[:SOURCE_SNIFF_LINES] if line.strip()]
    code = sum(1 for line in lines if _CODE_LINE.match(line))
    return len(lines) >= 5 and code >= SOURCE_SHARE * len(lines)


# `python -m torch.utils.collect_env` output (both layouts), and pip freeze / pip list output (one
# package per line with a version, naming torch or an NVIDIA wheel): read by analyzer/parse/collect_env.py.
_COLLECT_ENV = re.compile(rb"Collecting environment information|^PyTorch version\s*:.*\n(?:.*\n){0,3}Is debug build\s*:", re.M)
_PIP_LINE = re.compile(rb"^(?:[A-Za-z0-9][\w.\-]*(?:\[[\w,]+\])?(?:==|\s{2,})\d[\w.+\-!]*|Package\s+Version|-{3,}\s+-{3,})\s*$")
_PIP_STACK = re.compile(rb"^(?:torch|nvidia-nccl-cu\d+|deepspeed)(?:==|\s{2,})\d", re.M)


def _stack_listing(head: bytes) -> str:
    if _COLLECT_ENV.search(head):
        return "collect_env"
    lines = [line for line in head.splitlines()[:-1] if line.strip()]  # the last may be cut by the sniff
    if len(lines) >= 2 and all(_PIP_LINE.match(line) for line in lines) and _PIP_STACK.search(head):
        return "pip_freeze"
    return ""
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
# torch.save's zip layout: `<archive>/data.pkl` beside `<archive>/version` (or byteorder, .format_version).
_TORCH_ZIP_MARKERS = ("version", "byteorder", ".format_version")


class DiscoveryError(Exception):
    """The job cannot be analysed at all (missing path, nothing readable)."""


class DecompressionLimit(Exception):
    """A compressed input or archive passed a size or ratio cap (a bomb, or more than is read)."""


class CorruptStream(ValueError):
    """Compressed data the codec cannot decode (zstd's own errors, given a type the stages know)."""


# What reading a compressed input or an archive may raise on bad data: a per-input status, never a crash.
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile,
               DecompressionLimit)
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
    attempt: int | None = None
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
            raw = io.BufferedReader(_SpanReader(*self._span))
        else:
            raw = open(self._disk_path, "rb")  # noqa: SIM115 - the caller closes it
        if self._codec:
            return _DecodingReader(raw, self._codec, self.size)
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


# --- compressed streams ---------------------------------------------------------------------------


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


def _codec_of(head: bytes) -> str | None:
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


def _is_tar(head: bytes) -> bool:
    return len(head) >= 262 and head[257:262] == b"ustar"


def _is_zip(head: bytes) -> bool:
    return head.startswith((ZIP_MAGIC, ZIP_EMPTY_MAGIC))


class _DecodingReader(io.RawIOBase):
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


class _Prefixed(io.RawIOBase):
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


def _read_up_to(stream: io.IOBase, limit: int) -> bytes:
    """`limit` bytes of `stream`, fewer only at its end (a pipe or a member may return short reads)."""
    parts, got = [], 0
    while got < limit:
        block = stream.read(limit - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


@dataclass
class _Budget:
    """What one discovery has held in memory, against MAX_HELD_BYTES."""

    held: int = 0


# --- discovery ------------------------------------------------------------------------------------


def discover(root: str | os.PathLike[str]) -> list[InputFile]:
    """List and classify every input under `root`: a directory, a single file or archive, or `-`
    (standard input)."""
    budget = _Budget()
    if str(root) == STDIN:
        found = _stdin_inputs(budget)
    else:
        root_path = Path(root)
        if not root_path.exists():
            raise DiscoveryError(f"no such file or directory: {root}")
        if not os.access(root_path, os.R_OK):
            raise DiscoveryError(f"permission denied: {root}")
        if root_path.is_file():
            found = _expand(root_path, _display_name(root_path.name), root_path.parent.resolve(), budget)
        else:
            found = _walk(root_path, budget)
    inputs = []
    for item in found:  # classified as found: a file's sniffed head is dropped before the next is read
        if item.status == "pending":
            _classify(item)
        item._head = None
        _apply_layout_hints(item)
        inputs.append(item)
    return sorted(inputs, key=lambda f: f.path)


def _stdin_inputs(budget: _Budget) -> Iterator[InputFile]:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise DiscoveryError("standard input is closed: nothing to read for `-`")
    return _from_stream(STDIN_NAME, stream, None, 0, budget, limit=MAX_DECOMPRESSED_BYTES)


# --- the directory walk ---------------------------------------------------------------------------


def _walk(root: Path, budget: _Budget) -> Iterator[InputFile]:
    real_root = root.resolve()
    files: list[str] = []
    yield from _list_tree(root, files)
    if len(files) > MAX_FILES:
        files, left = _by_priority(root, files)
        yield InputFile(_display_name(left[0]), status="skipped", capped=True,
                        reason=f"file cap {MAX_FILES} reached: {len(left)} files not read")
    for rel in files:
        yield from _expand(root / rel, _display_name(rel), real_root, budget)


def _list_tree(root: Path, files: list[str]) -> Iterator[InputFile]:
    """Append every non-directory under `root` to `files` (relative paths), walking iteratively so
    any depth costs no stack; yields the rows for what the walk does not enter and why."""
    stack = [("", 0)]
    while stack:
        rel_dir, depth = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            yield InputFile(_display_name(rel_dir or str(root)) + "/", format="directory", status="error",
                            reason=f"cannot list directory: {exc.strerror or exc}")
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if _is_real_dir(entry):
                subdirs.append(rel)
            elif entry.is_symlink() and os.path.isdir(entry.path):
                yield InputFile(_display_name(rel), status="skipped", reason="symlink to a directory; not followed")
            elif len(files) < MAX_LISTED:
                files.append(rel)
            else:
                yield InputFile(_display_name(rel), status="skipped", capped=True,
                                reason=f"listing cap {MAX_LISTED} reached: the rest of the tree not listed")
                return
        if depth >= MAX_DEPTH:
            for rel in subdirs:
                yield InputFile(_display_name(rel) + "/", format="directory", status="skipped", capped=True,
                                reason=f"directory nesting deeper than {MAX_DEPTH} levels: not read")
        else:
            stack.extend((rel, depth + 1) for rel in reversed(subdirs))


def _is_real_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False  # vanished or unreadable: _expand says which


def _by_priority(root: Path, files: list[str]) -> tuple[list[str], list[str]]:
    """The MAX_FILES files to read and the ones left, when there are more: files whose first bytes
    look like a training log, dump or trace first, then files named like one (grammars/input_priority.toml)."""
    ranked = sorted(files, key=lambda rel: (_evidence_rank(root / rel, rel), rel))
    return sorted(ranked[:MAX_FILES]), ranked[MAX_FILES:]


def _evidence_rank(path: Path, rel: str) -> int:
    """0: its content looks like evidence; 1: its name does; 2: neither. Only regular files are opened."""
    content, names = _priority_patterns()
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as fh:
                if content.search(fh.read(PRIORITY_SNIFF_BYTES)):
                    return 0
    except OSError:
        pass  # unreadable: _expand gives it its row if it is read
    return 1 if names.search(rel.lower()) else 2


@cache
def _priority_patterns() -> tuple[re.Pattern[bytes], re.Pattern[str]]:
    """grammars/input_priority.toml: the content markers and name patterns of likely evidence."""
    doc = tomllib.loads((data_dir("grammars") / "input_priority.toml").read_text(encoding="utf-8"))
    content = b"|".join(b"(?:" + row["pattern"].encode("latin-1") + b")" for row in doc["content"])
    names = "|".join(f"(?:{row['pattern']})" for row in doc["name"])
    return re.compile(content), re.compile(names)


def _display_name(name: str) -> str:
    """File names are bytes: undecodable bytes and control characters are shown escaped (`\\xff`),
    and a name longer than MAX_NAME_CHARS (a 16 MB PAX member name) is cut, saying so."""
    if _UNPRINTABLE_NAME.search(name):
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        name = _UNPRINTABLE_NAME.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return cap_text(name, MAX_NAME_CHARS)


# --- one file on disk -----------------------------------------------------------------------------


def _expand(full: Path, rel: str, real_root: Path, budget: _Budget) -> Iterator[InputFile]:
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
    yield from _unpack(item, magic, 0, budget)


def _unpack(item: InputFile, head: bytes, depth: int, budget: _Budget) -> Iterator[InputFile]:
    """An input that can be reopened (a file, a member of a tar on disk): itself, its decompressed
    content, or an archive's members. `depth` counts the archives around it."""
    codec = _codec_of(head)
    if codec:
        item._codec = codec
        try:
            head = item.read_head()
        except READ_ERRORS as exc:
            item.format = codec
            item.skip(f"cannot read: {exc}", status="error")
            yield item
            return
        if _compressed_twice(item, codec, head):
            yield item
            return
    if _is_tar(head):
        if item._codec is None and item._span is None and item._disk_path is not None:
            yield from _tar_on_disk(item, depth, budget)
        else:
            with item.open_bytes() as stream:
                yield from _tar_stream(item, stream, depth, budget)
        return
    if _is_zip(head):
        if item._disk_path is not None:
            yield from _zip_members(item, item._disk_path, depth, budget)
        else:
            with item.open_bytes() as stream:
                yield from _zip_from_stream(item, stream, depth, budget)
        return
    item._head = head
    yield item


def _too_deep(item: InputFile, kind: str, depth: int) -> bool:
    if depth <= MAX_NESTING:
        return False
    item.format = kind
    item.capped = True
    item.skip(f"{kind} archive nested more than {MAX_NESTING} level(s) deep inside archives: not read")
    return True


# --- archives -------------------------------------------------------------------------------------


def _member_name_note(name: str) -> str:
    if ".." in PurePosixPath(name).parts or name.startswith("/"):
        return "member name escapes the archive root (read in place, never extracted)"
    return ""


def _tar_member_row(member: tarfile.TarInfo, rel: str) -> InputFile | None:
    """The row of a tar member that is not read (a link, a device, a sparse or oversized file), or None."""
    if member.issym() or member.islnk():
        return InputFile(rel, status="skipped", reason="link inside archive; not followed")
    if member.ischr() or member.isblk() or member.isfifo():
        return InputFile(rel, status="skipped", reason="device or FIFO inside archive; not read")
    if member.isfile() and member.issparse():  # its declared size is what reading would cost, whatever the archive's
        return InputFile(rel, status="skipped", size=member.size,
                         reason=f"GNU sparse member ({member.size} bytes declared): not read")
    if member.isfile() and member.size > MAX_ARCHIVE_MEMBER_BYTES:
        return InputFile(rel, status="skipped", size=member.size, capped=True,
                         reason=f"archive member larger than {MAX_ARCHIVE_MEMBER_BYTES} bytes ({member.size}): not read")
    return None


def _tar_entries(tar: tarfile.TarFile, archive: InputFile) -> Iterator[tuple[str, tarfile.TarInfo, InputFile | None]]:
    """(display name, member, row) per member of an open tar; `row` is the input row of a member
    that is not read (a link, a device, a sparse or oversized member; the member cap). The headers
    read are dropped as the iteration goes: a million members must not be kept."""
    for count, member in enumerate(tar, start=1):
        rel = f"{archive.path}!{_display_name(member.name)}"
        if count > MAX_FILES:
            yield rel, member, InputFile(rel, status="skipped", capped=True,
                                         reason=f"archive member cap {MAX_FILES} reached: the rest of the archive not read")
            return
        yield rel, member, _tar_member_row(member, rel)
        tar.members.clear()


def _tar_on_disk(archive: InputFile, depth: int, budget: _Budget) -> Iterator[InputFile]:
    """Members of an uncompressed tar on disk are read from the archive on demand, never extracted:
    `../` names cannot escape anything."""
    if _too_deep(archive, "tar", depth):
        yield archive
        return
    try:
        with tarfile.open(archive._disk_path, "r:") as tar:
            for rel, member, row in _tar_entries(tar, archive):
                if row is not None:
                    yield row
                    continue
                if not member.isfile():
                    continue
                if member.offset_data + member.size > archive.size:
                    present = max(archive.size - member.offset_data, 0)
                    yield InputFile(rel, status="error", reason=f"archive ends inside this member ({present} of {member.size} bytes)")
                    continue
                item = InputFile(rel, size=member.size, reason=_member_name_note(member.name),
                                 _span=(archive._disk_path, member.offset_data, member.size))
                if not member.size:
                    item.format = "empty"
                    item.skip("empty file")
                    yield item
                    continue
                try:
                    head = item.read_head()
                except OSError as exc:
                    item.skip(f"unreadable: {exc.strerror or exc}", status="error")
                    yield item
                    continue
                yield from _unpack(item, head, depth + 1, budget)
    except (tarfile.TarError, OSError, EOFError) as exc:
        archive.format = "tar"
        archive.skip(f"unreadable archive: {exc}", status="error")
        yield archive


def _tar_stream(archive: InputFile, stream: io.IOBase, depth: int, budget: _Budget) -> Iterator[InputFile]:
    """Members of a tar read as a stream (compressed, nested, standard input), in order, each read
    once and held; a member that is not read is never decompressed past."""
    if _too_deep(archive, "tar", depth):
        yield archive
        return
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for rel, member, row in _tar_entries(tar, archive):
                if row is not None:
                    yield row
                elif member.isfile():
                    yield from _from_stream(rel, tar.extractfile(member), member.size, depth + 1, budget,
                                            note=_member_name_note(member.name))
    except READ_ERRORS as exc:
        archive.format = "tar"
        archive.skip(f"archive not read to its end: {exc}", status="error")
        yield archive


def _is_torch_zip(names: set[str]) -> bool:
    """torch.save's zip: `<name>/data.pkl` beside `<name>/version` (or byteorder, .format_version)."""
    tops = {name[: -len("/data.pkl")] for name in names if name.endswith("/data.pkl")}
    return any(f"{top}/{marker}" in names for top in tops for marker in _TORCH_ZIP_MARKERS)


def _zip_from_stream(archive: InputFile, stream: io.IOBase, depth: int, budget: _Budget) -> Iterator[InputFile]:
    """A zip needs its central directory at the end: its bytes are held while its members are read."""
    if _too_deep(archive, "zip", depth):
        yield archive
        return
    try:
        data = _read_up_to(stream, MAX_ARCHIVE_MEMBER_BYTES + 1)
    except READ_ERRORS as exc:
        archive.format = "zip"
        archive.skip(f"cannot read: {exc}", status="error")
        yield archive
        return
    if len(data) > MAX_ARCHIVE_MEMBER_BYTES or budget.held + len(data) > MAX_HELD_BYTES:
        archive.format, archive.capped = "zip", True
        archive.skip(f"zip archive larger than {min(MAX_ARCHIVE_MEMBER_BYTES, MAX_HELD_BYTES - budget.held)} bytes "
                     "inside another input: not read")
        yield archive
        return
    archive.size = len(data)
    budget.held += len(data)
    try:
        yield from _zip_members(archive, io.BytesIO(data), depth, budget)
    finally:
        budget.held -= len(data)  # let go once its members are held


def _zip_members(archive: InputFile, source: Path | io.BytesIO, depth: int, budget: _Budget) -> Iterator[InputFile]:
    """A zip is a torch.save checkpoint when its members say so (audited, not read here); otherwise
    an archive of inputs, each member read once and held."""
    if _too_deep(archive, "zip", depth):
        yield archive
        return
    try:
        with zipfile.ZipFile(source) as zf:
            infos = zf.infolist()
            if _is_torch_zip({i.filename for i in infos}):
                archive.format = "checkpoint"
                archive.skip("checkpoint (torch.save zip): audited by the checkpoint analysis, not parsed as a log")
                yield archive
                return
            yield from _zip_entries(archive, zf, infos, depth, budget)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        archive.format = "zip"
        archive.skip(f"unreadable zip archive: {exc}", status="error")
        yield archive


def _zip_entries(archive: InputFile, zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo], depth: int,
                 budget: _Budget) -> Iterator[InputFile]:
    # The declared sizes are what zipfile decompresses at most: they are checked before anything is
    # inflated, together against the archive's own size, and entries sharing bytes (a zip bomb's
    # overlapping entries) are not read at all.
    total_limit = min(MAX_DECOMPRESSED_BYTES, max(archive.size, 1 << 20) * MAX_COMPRESSION_RATIO)
    overlapping = _overlapping_entries(infos)
    total = 0
    for count, info in enumerate(infos, start=1):
        rel = f"{archive.path}!{_display_name(info.filename)}"
        if count > MAX_FILES:
            yield InputFile(rel, status="skipped", capped=True,
                            reason=f"archive member cap {MAX_FILES} reached: the rest of the archive not read")
            return
        if info.is_dir():
            continue
        row = _zip_member_row(info, rel, id(info) in overlapping)
        if row is None and total + info.file_size > total_limit:
            row = InputFile(rel, status="skipped", size=info.file_size, capped=True,
                            reason=f"members add up to more than {total_limit} bytes decompressed "
                                   "(possible zip bomb): not read")
        if row is not None:
            yield row
            continue
        total += info.file_size
        try:
            with zf.open(info) as fh:
                yield from _from_stream(rel, fh, info.file_size, depth + 1, budget, note=_member_name_note(info.filename))
        except (NotImplementedError, RuntimeError, *READ_ERRORS) as exc:  # an unknown method, a password
            yield InputFile(rel, status="error", size=info.file_size, reason=f"cannot read: {exc}")


def _zip_member_row(info: zipfile.ZipInfo, rel: str, overlaps: bool) -> InputFile | None:
    """The row of a zip member that is not read (a link, encrypted, overlapping, oversized), or None."""
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return InputFile(rel, status="skipped", reason="link inside archive; not followed")
    if info.flag_bits & 0x1:
        return InputFile(rel, status="skipped", reason="encrypted archive member: not read")
    if overlaps:
        return InputFile(rel, status="skipped", reason="its data overlaps another member's (possible zip bomb): not read")
    if info.file_size > MAX_ARCHIVE_MEMBER_BYTES:
        return InputFile(rel, status="skipped", size=info.file_size, capped=True,
                         reason=f"archive member larger than {MAX_ARCHIVE_MEMBER_BYTES} bytes ({info.file_size}): not read")
    if info.file_size > BOMB_CHECK_AFTER and info.file_size > BOMB_RATIO * max(info.compress_size, 1):
        return InputFile(rel, status="skipped", size=info.file_size,
                         reason=f"{info.file_size} bytes from {info.compress_size} compressed: over {BOMB_RATIO}x "
                                "(possible zip bomb): not read")
    return None


def _overlapping_entries(infos: list[zipfile.ZipInfo]) -> set[int]:
    """ids of the entries whose local header and data start inside another entry's (a local header
    is at least 30 bytes plus the name)."""
    overlapping: set[int] = set()
    end = -1
    previous = None
    for info in sorted(infos, key=lambda i: i.header_offset):
        if info.header_offset < end:
            overlapping.update((id(info), id(previous)))
        extent = info.header_offset + 30 + len(info.orig_filename.encode("utf-8", "surrogateescape")) + info.compress_size
        if extent > end:
            end, previous = extent, info
    return overlapping


# --- inputs read once from a stream ---------------------------------------------------------------


def _from_stream(rel: str, stream: io.IOBase, declared: int | None, depth: int, budget: _Budget,
                 limit: int = MAX_ARCHIVE_MEMBER_BYTES, note: str = "") -> Iterator[InputFile]:
    """An input that can be read only once (an archive member, standard input): decompressed if it
    is compressed, expanded if it is an archive, otherwise held in memory for the parsers."""
    item = InputFile(rel, size=declared or 0, reason=note)
    codec = None
    try:
        head = _read_up_to(stream, SNIFF_BYTES)
        codec = _codec_of(head)
        if codec:
            stream = _DecodingReader(_Prefixed(head, stream), codec, declared)
            head = _read_up_to(stream, SNIFF_BYTES)
            if _compressed_twice(item, codec, head):
                yield item
                return
        if _is_tar(head):
            yield from _tar_stream(item, _Prefixed(head, stream), depth, budget)
            return
        if _is_zip(head):
            yield from _zip_from_stream(item, _Prefixed(head, stream), depth, budget)
            return
        if not head:
            item.format = "empty"
            item.skip("empty file" if not codec else "empty after decompression")
        elif _format_of_head(head, lambda: "json")[1]:
            item._head = head  # skipped from its head (binary, a checkpoint): the rest is never read
        elif budget.held >= MAX_HELD_BYTES:
            item.capped = True
            item.skip(f"memory cap for archives and standard input ({MAX_HELD_BYTES} bytes) reached: not read")
        else:
            _hold(item, head, stream, limit, budget)
    except READ_ERRORS as exc:
        item.format = codec or item.format
        item.skip(f"cannot read: {exc}", status="error")
    yield item


def _compressed_twice(item: InputFile, codec: str, head: bytes) -> bool:
    """A compressed input whose content is compressed again, or a zip, is not opened a second time."""
    if _is_zip(head):
        item.skip(f"zip archive inside {codec}-compressed data: not read")
    elif _codec_of(head):
        item.skip(f"{_codec_of(head)}-compressed data inside {codec}-compressed data: not decompressed twice")
    else:
        return False
    item.format = codec
    return True


def _hold(item: InputFile, head: bytes, stream: io.IOBase, limit: int, budget: _Budget) -> None:
    """Read the rest of `stream` into `item`, zstd-compressed, up to `limit` decoded bytes and the
    memory budget; what a cap leaves unread is noted on the item (and makes it partial)."""
    sink = io.BytesIO()
    size, cut = 0, ""
    with zstandard.ZstdCompressor(level=HOLD_LEVEL).stream_writer(sink, closefd=False) as writer:
        block = head
        while block:
            if size + len(block) > limit:
                block, cut = block[: limit - size], f"longer than {limit} bytes: the first {limit} read"
            writer.write(block)
            size += len(block)
            if cut:
                break
            if budget.held + sink.tell() > MAX_HELD_BYTES:
                cut = f"memory cap for archives and standard input ({MAX_HELD_BYTES} bytes) reached: the first {size} bytes read"
                break
            block = stream.read(1 << 20)
    item._held, item._head, item.size = sink.getvalue(), head, size
    budget.held += len(item._held)
    if cut:
        item.capped, item.reason = True, "; ".join(filter(None, [item.reason, cut]))


def _classify(item: InputFile) -> None:
    try:
        head = item._head if item._head is not None else item.read_head()
    except READ_ERRORS as exc:
        item.format = item._codec or "unknown"
        item.skip(f"cannot read: {exc}", status="error")
        return
    item.format, reason = _format_of_head(head, lambda: _json_kind(item))
    if reason:
        item.skip(reason)


def _format_of_head(head: bytes, json_kind: Callable[[], str]) -> tuple[str, str]:
    """(format, reason to skip it or "") from an input's first bytes; `json_kind` says what a JSON
    document is (that needs the whole document)."""
    if not head:
        return "empty", "empty after decompression"
    if _is_zip(head) or _SAFETENSORS_HEADER.match(head) or _TORCH_PICKLE_CHECKPOINT.match(head):
        return "checkpoint", "checkpoint or zip archive: audited by the checkpoint analysis, not parsed as a log"
    if head.startswith(PICKLE_PROTOCOL_2_PLUS):
        return "pickle", ""
    if head.startswith(SQLITE_MAGIC):
        return "nsys_sqlite", ""
    stripped = head.lstrip()
    if stripped[:1] == b"{" and _KINETO_HEAD.search(head):
        return "kineto_trace", ""
    if _NSYS_STATS_CSV.match(head):
        return "nsys_stats_csv", ""
    if stripped[:1] in (b"{", b"["):
        kind = json_kind()
        if kind != "text":
            return kind, ""
    if _PYSPY_TEXT.match(head):
        return "pyspy_text", ""
    stack_format = _stack_listing(head)  # torch's collect_env report, a pip freeze / pip list
    if stack_format:
        return stack_format, ""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _looks_utf16(head):
        return "text-utf16", ""
    if _looks_binary(head):
        if not head.strip(b"\x00"):
            return "binary", "nothing but NUL bytes (blocks never written before a crash?)"
        return "binary", "binary content (not a log, dump or trace this version reads)"
    if _NCCL_TESTS.search(head):
        return "nccl_tests", ""
    if _looks_like_source(head):
        return "source", "source code or markup (CSS, HTML, JavaScript, Python), not a log"
    return "text", ""


def _json_kind(item: InputFile) -> str:
    try:
        doc = json.loads(item.read_all(64 << 20))
    except (RecursionError, *READ_ERRORS):
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
        # `attempt_<30 digits>/` or a huge rank directory is no hint (bounds.rank_number: None).
        item.attempt, item.local_rank_hint = rank_number(match.group(1)), rank_number(match.group(2))
        return
    name_match = _RANK_IN_NAME.search(Path(member_path).name)
    if name_match:
        item.rank_hint = rank_number(name_match.group(1))


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
    if notes:
        item.reason = "; ".join([item.reason, *notes] if item.reason else notes)
    # A cap that left part of the input unread (standard input past its cap, the memory cap) makes
    # it partial like a cut line: the rest may hold the evidence.
    if (nuls or cut_lines or item.capped) and item.status == "pending":
        item.status = "partial"
