"""Stage 1, io (archives): an input expanded into itself, its decompressed content or its members.

tar (on disk: members read in place on demand; compressed or nested: read as a stream) and zip
archives are read in memory, never extracted, under member-size, member-count, nesting and memory
caps; members that can be read only once (and standard input) are held zstd-compressed. Every cap
that leaves something unread says so with a row (status skipped, `capped` set).
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import zstandard

from analyzer.io.inputs import SNIFF_BYTES, STDIN_NAME, DiscoveryError, InputFile, display_name
from analyzer.io.sniff import format_of_head
from analyzer.io.streams import (BOMB_CHECK_AFTER, BOMB_RATIO, MAX_COMPRESSION_RATIO, MAX_DECOMPRESSED_BYTES,
                                 READ_ERRORS, DecodingReader, Prefixed, codec_of, is_tar, is_zip, read_up_to)

# Caps that keep one hostile archive from exhausting the machine.
MAX_FILES = 200_000  # inputs read from one directory (or one archive)
MAX_NESTING = 1  # archives opened inside an archive's member (a .tar.gz inside a .zip), not deeper
MAX_ARCHIVE_MEMBER_BYTES = 512 << 20
# Archive members and standard input are held in memory zstd-compressed (level 1: ~400 MB/s, text
# 5-20:1); past this many held bytes, what is left is not read.
MAX_HELD_BYTES = 768 << 20
HOLD_LEVEL = 1
# torch.save's zip layout: `<archive>/data.pkl` beside `<archive>/version` (or byteorder, .format_version).
_TORCH_ZIP_MARKERS = ("version", "byteorder", ".format_version")


@dataclass
class HeldBudget:
    """What one discovery has held in memory, against MAX_HELD_BYTES."""

    held: int = 0


def stdin_inputs(budget: HeldBudget) -> Iterator[InputFile]:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise DiscoveryError("standard input is closed: nothing to read for `-`")
    return _from_stream(STDIN_NAME, stream, None, 0, budget, limit=MAX_DECOMPRESSED_BYTES)


def unpack(item: InputFile, head: bytes, depth: int, budget: HeldBudget) -> Iterator[InputFile]:
    """An input that can be reopened (a file, a member of a tar on disk): itself, its decompressed
    content, or an archive's members. `depth` counts the archives around it."""
    codec = codec_of(head)
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
    if is_tar(head):
        if item._codec is None and item._span is None and item._disk_path is not None:
            yield from _tar_on_disk(item, depth, budget)
        else:
            with item.open_bytes() as stream:
                yield from _tar_stream(item, stream, depth, budget)
        return
    if is_zip(head):
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
        rel = f"{archive.path}!{display_name(member.name)}"
        if count > MAX_FILES:
            yield rel, member, InputFile(rel, status="skipped", capped=True,
                                         reason=f"archive member cap {MAX_FILES} reached: the rest of the archive not read")
            return
        yield rel, member, _tar_member_row(member, rel)
        tar.members.clear()


def _tar_on_disk(archive: InputFile, depth: int, budget: HeldBudget) -> Iterator[InputFile]:
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
                yield from unpack(item, head, depth + 1, budget)
    except (tarfile.TarError, OSError, EOFError) as exc:
        archive.format = "tar"
        archive.skip(f"unreadable archive: {exc}", status="error")
        yield archive


def _tar_stream(archive: InputFile, stream: io.IOBase, depth: int, budget: HeldBudget) -> Iterator[InputFile]:
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


def _zip_from_stream(archive: InputFile, stream: io.IOBase, depth: int, budget: HeldBudget) -> Iterator[InputFile]:
    """A zip needs its central directory at the end: its bytes are held while its members are read."""
    if _too_deep(archive, "zip", depth):
        yield archive
        return
    try:
        data = read_up_to(stream, MAX_ARCHIVE_MEMBER_BYTES + 1)
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


def _zip_members(archive: InputFile, source: Path | io.BytesIO, depth: int, budget: HeldBudget) -> Iterator[InputFile]:
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
                 budget: HeldBudget) -> Iterator[InputFile]:
    # The declared sizes are what zipfile decompresses at most: they are checked before anything is
    # inflated, together against the archive's own size, and entries sharing bytes (a zip bomb's
    # overlapping entries) are not read at all.
    total_limit = min(MAX_DECOMPRESSED_BYTES, max(archive.size, 1 << 20) * MAX_COMPRESSION_RATIO)
    overlapping = _overlapping_entries(infos)
    total = 0
    for count, info in enumerate(infos, start=1):
        rel = f"{archive.path}!{display_name(info.filename)}"
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


def _from_stream(rel: str, stream: io.IOBase, declared: int | None, depth: int, budget: HeldBudget,
                 limit: int = MAX_ARCHIVE_MEMBER_BYTES, note: str = "") -> Iterator[InputFile]:
    """An input that can be read only once (an archive member, standard input): decompressed if it
    is compressed, expanded if it is an archive, otherwise held in memory for the parsers."""
    item = InputFile(rel, size=declared or 0, reason=note)
    codec = None
    try:
        head = read_up_to(stream, SNIFF_BYTES)
        codec = codec_of(head)
        if codec:
            stream = DecodingReader(Prefixed(head, stream), codec, declared)
            head = read_up_to(stream, SNIFF_BYTES)
            if _compressed_twice(item, codec, head):
                yield item
                return
        if is_tar(head):
            yield from _tar_stream(item, Prefixed(head, stream), depth, budget)
            return
        if is_zip(head):
            yield from _zip_from_stream(item, Prefixed(head, stream), depth, budget)
            return
        if not head:
            item.format = "empty"
            item.skip("empty file" if not codec else "empty after decompression")
        elif format_of_head(head, lambda: "json")[1]:
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
    if is_zip(head):
        item.skip(f"zip archive inside {codec}-compressed data: not read")
    elif codec_of(head):
        item.skip(f"{codec_of(head)}-compressed data inside {codec}-compressed data: not decompressed twice")
    else:
        return False
    item.format = codec
    return True


def _hold(item: InputFile, head: bytes, stream: io.IOBase, limit: int, budget: HeldBudget) -> None:
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
