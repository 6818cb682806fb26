"""Stage 1, discover: find every input of a job directory and classify it by content.

Walks the directory read-only (never following symlinks out of the root), opens `.gz` files and
`.tar` archives in memory with size and ratio caps, sniffs each file's first bytes to decide its
format, and records path-layout hints (torchrun `attempt_N/<local_rank>/`, per-rank file names)
that correlate uses for attribution. Nothing here parses lines.
"""

from __future__ import annotations

import gzip
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
MAX_ARCHIVE_MEMBER_BYTES = 512 << 20
SNIFF_BYTES = 64 << 10
CHUNK_BYTES = 32 << 20
MAX_UTF16_BYTES = 256 << 20

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PICKLE_PROTOCOL_2_PLUS = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"
# safetensors: 8-byte little-endian header length, then a JSON header starting with '{"'.
_SAFETENSORS_HEADER = re.compile(rb"^[\s\S]{4}\x00{4}\{\"", re.DOTALL)

_TORCHRUN_RANK_DIR = re.compile(r"attempt_(\d+)/(\d+)/(?:stdout|stderr)\.log(?:\.gz)?$")
_PYSPY_TEXT = re.compile(rb"\s*Process \d+: .*\n(?:Python v|Thread )")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)(?:\D|$)", re.IGNORECASE)


class DiscoveryError(Exception):
    """The job cannot be analysed at all (missing path, nothing readable)."""


@dataclass
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
    _payload: bytes | None = None  # archive members are held in memory
    _gzip: bool = False

    def skip(self, reason: str, status: str = "skipped") -> None:
        self.status, self.reason = status, reason

    def open_bytes(self) -> io.BufferedIOBase:
        raw: io.BufferedIOBase
        if self._payload is not None:
            raw = io.BytesIO(self._payload)
        else:
            raw = open(self._disk_path, "rb")  # noqa: SIM115 - the caller closes it
        if self._gzip:
            return _CappedReader(gzip.GzipFile(fileobj=raw), self.size)
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
    """Wraps a decompressing stream; stops a gzip bomb at a ratio or absolute cap."""

    def __init__(self, inner: gzip.GzipFile, compressed_size: int):
        self._inner = inner
        self._limit = min(MAX_DECOMPRESSED_BYTES, max(compressed_size, 1 << 20) * MAX_COMPRESSION_RATIO)
        self._seen = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        self._seen += len(data)
        if self._seen > self._limit:
            raise DecompressionLimit(f"decompressed size exceeds {self._limit} bytes (possible gzip bomb)")
        return data

    def close(self) -> None:
        self._inner.close()
        super().close()


class DecompressionLimit(Exception):
    pass


def discover(root: str | os.PathLike[str]) -> list[InputFile]:
    """List and classify every input under `root` (a directory, a single file, or an archive)."""
    root_path = Path(root)
    if not root_path.exists():
        raise DiscoveryError(f"no such file or directory: {root}")
    if not os.access(root_path, os.R_OK):
        raise DiscoveryError(f"permission denied: {root}")
    if root_path.is_file():
        inputs = list(_expand(root_path, root_path.name, root_path.parent.resolve()))
    else:
        inputs = list(_walk(root_path))
    for item in inputs:
        if item.status == "pending":
            _classify(item)
        _apply_layout_hints(item)
    return sorted(inputs, key=lambda f: f.path)


def _walk(root: Path) -> Iterator[InputFile]:
    real_root = root.resolve()
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=None):
        dirnames.sort()
        for name in sorted(filenames):
            count += 1
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if count > MAX_FILES:
                yield InputFile(rel, status="skipped", reason=f"more than {MAX_FILES} files; rest not read")
                return
            yield from _expand(full, rel, real_root)


def _expand(full: Path, rel: str, real_root: Path) -> Iterator[InputFile]:
    item = InputFile(rel, _disk_path=full)
    try:
        if full.is_symlink():
            target = full.resolve()
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
            magic = fh.read(262)
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
    yield item


def _tar_members(archive: InputFile) -> Iterator[InputFile]:
    """Archive members are read into memory, never extracted: `../` names cannot escape anything."""
    try:
        with tarfile.open(archive._disk_path, "r:*") as tar:
            for member in tar:
                rel = f"{archive.path}!{member.name}"
                if member.issym() or member.islnk():
                    yield InputFile(rel, status="skipped", reason="link inside archive; not followed")
                    continue
                if not member.isfile():
                    continue
                if member.size > MAX_ARCHIVE_MEMBER_BYTES:
                    yield InputFile(rel, status="skipped", reason=f"archive member larger than {MAX_ARCHIVE_MEMBER_BYTES} bytes")
                    continue
                fh = tar.extractfile(member)
                payload = fh.read() if fh else b""
                item = InputFile(rel, size=len(payload), _payload=payload)
                if ".." in Path(member.name).parts or member.name.startswith("/"):
                    item.reason = "member name escapes the archive root (read in memory only)"
                if not payload:
                    item.format = "empty"
                    item.skip("empty file")
                elif payload.startswith(GZIP_MAGIC):
                    item._gzip = True
                yield item
    except (tarfile.TarError, OSError, EOFError) as exc:
        archive.format = "tar"
        archive.skip(f"unreadable archive: {exc}", status="error")
        yield archive


def _classify(item: InputFile) -> None:
    try:
        head = item.read_head()
    except (OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        item.format = "gzip" if item._gzip else "unknown"
        item.skip(f"cannot read: {exc}", status="error")
        return
    if not head:
        item.format = "empty"
        item.skip("empty after decompression")
        return
    if head.startswith(ZIP_MAGIC) or _SAFETENSORS_HEADER.match(head):
        item.format = "checkpoint"
        item.skip("checkpoint or zip archive: audited by the checkpoint analysis, not parsed as a log")
        return
    if head.startswith(PICKLE_PROTOCOL_2_PLUS):
        item.format = "pickle"
        return
    stripped = head.lstrip()
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
        item.skip("binary content (not a log, dump or trace this version reads)")
        return
    item.format = "text"


def _json_kind(item: InputFile, head: bytes) -> str:
    try:
        doc = json.loads(item.read_all(64 << 20))
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit):
        return "text"  # JSON Lines or a log that starts with a bracket
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
    if b"\x00" in head and not _looks_utf16(head):
        return True
    sample = head[:8192]
    control = sum(1 for b in sample if b < 9 or 13 < b < 27 or 27 < b < 32)
    return control > len(sample) * 0.10


def _looks_utf16(head: bytes) -> bool:
    sample = head[:4096]
    if len(sample) < 4:
        return False
    odd_zero = sample[1::2].count(0) / (len(sample) / 2)
    even_zero = sample[0::2].count(0) / (len(sample) / 2)
    return odd_zero > 0.4 or even_zero > 0.4


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
    """Decoded text in chunks that end on a line boundary; invalid bytes become U+FFFD."""
    if item.format == "text-utf16":
        # UTF-16 newlines are two bytes wide, so the file is decoded whole (they are never large logs).
        yield item.read_all(MAX_UTF16_BYTES).decode("utf-16", errors="replace")
        return
    with item.open_bytes() as fh:
        carry = b""
        while True:
            block = fh.read(chunk_bytes)
            if not block:
                break
            block = carry + block
            cut = block.rfind(b"\n")
            if cut < 0 and len(block) < chunk_bytes * 4:
                carry = block
                continue
            if cut < 0:
                cut = len(block) - 1  # a giant line with no newline: emit it in pieces
            carry = block[cut + 1 :]
            yield block[: cut + 1].decode("utf-8", errors="replace")
        if carry:
            yield carry.decode("utf-8", errors="replace")
