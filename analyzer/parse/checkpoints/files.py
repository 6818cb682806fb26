"""Stage 2, parse (checkpoints: one file): torch.save (zip and legacy), plain pickle, safetensors.

`audit_file` sniffs a file's format from its first bytes and checks it is complete and readable:
the zip central directory, CRCs and storage records against the pickle's references, the legacy
format's storages, a safetensors header's offsets. When torch is installed, a file whose pickle
names only what torch's weights-only loader admits is also loaded with
`torch.load(weights_only=True, mmap=True)`; without torch the checks are structural and the
record says so. Results are cached by (path, size, mtime, ctime, inode): a file is read once.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from analyzer.exits import INPUT_ERRORS
from analyzer.io.budget import BudgetExceeded, address_space
from analyzer.parse.checkpoints.contents import summarize
from analyzer.parse.checkpoints.symbolic import MAX_PICKLE_BYTES, Pickled, read_pickle_symbolically

CRC_BYTES_PER_FILE = 4 << 30  # CRCs of larger files are not verified (sizes still are)
TORCH_LEGACY_LOAD_BYTES = 1 << 30  # legacy files cannot be mmapped: torch.load reads them whole
TRUNCATION_SCAN_BYTES = 1 << 30

ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_HEAD = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pickled _LEGACY_MAGIC
_SAFETENSORS_HEAD = re.compile(rb"^[\s\S]{4}\x00\x00\x00\x00\{\"", re.DOTALL)
_PICKLE_PROTO = re.compile(rb"^\x80[\x02-\x05]")

_STORAGE_ELEMENT_BYTES = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "QInt8": 1, "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1,
    "QUInt2x4": 1, "Untyped": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}


def _element_bytes(storage_type: Any) -> int | None:
    qualname = getattr(storage_type, "qualname", "")
    match = re.search(r"\.(\w+?)Storage$", qualname)
    return _STORAGE_ELEMENT_BYTES.get(match.group(1)) if match else None


@dataclass(frozen=True)
class FileAudit:
    """The audit of one file; `format == ""` means it is not a checkpoint after all."""

    format: str
    size: int
    mtime: float
    readable: bool
    reason: str = ""
    notes: tuple[str, ...] = ()
    checked_with: str = "structure"
    components: frozenset[str] = frozenset()
    step: int | None = None
    epoch: float | None = None
    scalars: tuple[tuple[str, int], ...] = ()
    tensor_names: frozenset[str] = frozenset()  # safetensors header entries, for index consistency
    cuda: bool = False
    unsafe: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    problem: str | None = None  # corrupt, unsafe


def torch_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError, AttributeError):  # sys.modules["torch"] = None reads as absent
        return False


def _content_audit(fmt: str, size: int, mtime: float, pickled: Pickled, name: str, *, notes: list[str],
                   checked_with: str) -> FileAudit:
    """Shared tail of the pickle-based formats: refuse unsafe globals, summarise the content."""
    unsafe, unknown = pickled.unsafe, pickled.unknown
    if unsafe:
        return FileAudit(fmt, size, mtime, False,
                         f"refused: the pickle names {', '.join(unsafe[:4])}, code no checkpoint needs (possibly "
                         "malicious); nothing was loaded or executed",
                         tuple(notes), "symbolic unpickler (refused)", unsafe=tuple(unsafe), unknown=tuple(unknown),
                         problem="unsafe")
    if pickled.error:
        return FileAudit(fmt, size, mtime, False, pickled.error, tuple(notes), checked_with, unknown=tuple(unknown),
                         problem="corrupt")
    contents = summarize(pickled.obj, name, pickled.refs)
    if unknown:
        notes.append(f"holds objects of {len(unknown)} class(es) outside torch's weights-only allowlist "
                     f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}): read without building them; "
                     "torch.load(weights_only=True) will refuse this file unless they are allowlisted")
    return FileAudit(fmt, size, mtime, True, "", tuple(notes), checked_with, frozenset(contents.components),
                     contents.step, contents.epoch, tuple(sorted(contents.scalars.items())), cuda=contents.cuda,
                     unknown=tuple(unknown))


def _torch_load_check(path: Path, *, mmap: bool) -> tuple[str | None, str | None]:
    """torch.load(weights_only=True) the file (numpy RNG objects allowlisted); (failure, refusal)."""
    import warnings

    import torch

    safe: list[Any] = []
    try:
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        safe = [core.multiarray._reconstruct, np.ndarray, np.dtype]
        safe += [getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", object)) if n.endswith("DType")]
    except (ImportError, AttributeError):
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(safe):
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        del loaded
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Weights only load failed" in text or "Unsupported global" in text:
            detail = re.search(r"Unsupported (?:global|operand)[^.\n]*", text)
            return None, detail.group(0) if detail else "weights-only loader refused a global"
        return f"torch.load failed: {text.splitlines()[0][:240]}", None
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, the file did not load
        first = (str(exc).splitlines() or [""])[0]
        return f"torch.load failed: {type(exc).__name__}: {first[:240]}", None
    return None, None


def _audit_torch_zip(path: Path, size: int, mtime: float, *, use_torch: bool, verify_crc: bool) -> FileAudit:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        return _truncated_zip_audit(path, size, mtime, exc)
    with archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
        if not pkl:
            return FileAudit("", size, mtime, False)  # a zip that is not a torch.save file (logs, TorchScript)
        prefix = pkl[0][: -len("data.pkl")]
        notes: list[str] = []
        overlapping = _overlapping_members(archive.infolist())
        if overlapping:
            # torch.save writes each member once; entries sharing bytes are a zip bomb (20,000 names
            # for one deflated member inflate terabytes), never a checkpoint.
            return FileAudit("torch_zip", size, mtime, False,
                             f"{overlapping} central-directory entries overlap other members' bytes: a crafted zip, "
                             "not a torch.save file; not inflated", problem="corrupt")
        inflated = sum(i.file_size for i in archive.infolist())
        if verify_crc and inflated > CRC_BYTES_PER_FILE:  # the CRC budget counts inflated bytes, not the file's
            verify_crc = False
        if verify_crc:
            try:
                bad = archive.testzip()
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error, ValueError) as exc:
                return FileAudit("torch_zip", size, mtime, False, f"unreadable member: {exc}", problem="corrupt")
            if bad:
                return FileAudit("torch_zip", size, mtime, False,
                                 f"bad CRC in member {bad}: its bytes changed after the save (disk or copy error)",
                                 problem="corrupt")
        else:
            notes.append("CRCs not verified (over the read budget); sizes checked")
        info = archive.getinfo(pkl[0])
        if info.file_size > MAX_PICKLE_BYTES:
            return FileAudit("torch_zip", size, mtime, False, f"data.pkl is {info.file_size} bytes, over the limit",
                             problem="corrupt")
        pickled = read_pickle_symbolically(archive.read(pkl[0]))
        audit = _content_audit("torch_zip", size, mtime, pickled, path.stem, notes=notes,
                               checked_with=_structural(use_torch))
        if not audit.readable:
            return audit
        if prefix + "version" not in names:
            return replace(audit, readable=False, reason="no version record: the archive is incomplete",
                           problem="corrupt")
        missing = _missing_storages(pickled.refs, lambda key: _zip_size(archive, f"{prefix}data/{key}"))
        if missing:
            return replace(audit, readable=False, reason=missing, problem="corrupt")
    return _maybe_torch_load(path, audit, use_torch=use_torch, mmap=True)


def _overlapping_members(infos: list[zipfile.ZipInfo]) -> int:
    """How many members start inside another member's bytes (local header + compressed data)."""
    spans = sorted((i.header_offset, i.header_offset + 30 + len(i.orig_filename.encode("utf-8", "replace")) + i.compress_size)
                   for i in infos)
    overlapping, end = 0, -1
    for start, stop in spans:
        if start < end:
            overlapping += 1
        end = max(end, stop)
    return overlapping


def _structural(use_torch: bool) -> str:
    """What a pickle-based file was checked with before (or instead of) torch.load."""
    if use_torch:
        return "structure"
    return "structure (torch not used)" if torch_available() else "structure (torch not installed)"


def _zip_size(archive: zipfile.ZipFile, name: str) -> int | None:
    try:
        return archive.getinfo(name).file_size
    except KeyError:
        return None


def _missing_storages(refs: list[Any], size_of: Any) -> str:
    """Check every storage the pickle references against its record; '' when all are whole."""
    absent, short = [], []
    for pid in refs:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            continue
        key, numel = str(pid[2]), pid[4]
        have = size_of(key)
        if have is None:
            absent.append(key)
            continue
        per = _element_bytes(pid[1])
        if per and isinstance(numel, int) and have < numel * per:
            short.append(f"{key} ({have} of {numel * per} bytes)")
    if absent:
        return f"{len(absent)} tensor storage record(s) referenced by data.pkl are missing: data/{', data/'.join(absent[:5])}"
    if short:
        return f"tensor storage record(s) shorter than their tensors: {', '.join(short[:5])}"
    return ""


def _maybe_torch_load(path: Path, audit: FileAudit, *, use_torch: bool, mmap: bool) -> FileAudit:
    if not use_torch:
        return audit
    if audit.unknown:
        return replace(audit, checked_with="structure (torch.load skipped: classes outside the allowlist)")
    if not mmap and audit.size > TORCH_LEGACY_LOAD_BYTES:
        return replace(audit, checked_with="structure (torch.load skipped: legacy file too large to read whole)")
    failure, refusal = _torch_load_check(path, mmap=mmap)
    if failure:
        return replace(audit, readable=False, reason=failure, checked_with="torch.load(weights_only=True)",
                       problem="corrupt")
    if refusal:
        return replace(audit, notes=audit.notes + (f"torch.load(weights_only=True) refused it ({refusal}); not "
                                                    "corruption, structure checked instead",),
                       checked_with="structure (torch weights-only refused)")
    return replace(audit, checked_with="torch.load(weights_only=True)")


def _truncated_zip_audit(path: Path, size: int, mtime: float, exc: Exception) -> FileAudit:
    """No central directory: say where the file ends, from the local headers torch wrote in order."""
    with open(path, "rb") as fh:
        head = fh.read(min(size, MAX_PICKLE_BYTES + 4096))
    if len(head) < 30 or not head.startswith(ZIP_MAGIC):
        return FileAudit("torch_zip", size, mtime, False, f"not a readable zip: {exc}", problem="corrupt")
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    first = head[30 : 30 + name_len].decode("utf-8", "replace")
    if not first.endswith("data.pkl"):
        if path.suffix.lower() not in (".pt", ".pth", ".ckpt", ".bin", ".tmp"):
            return FileAudit("", size, mtime, False)  # a broken zip of something else
        return FileAudit("torch_zip", size, mtime, False,
                         f"truncated or corrupt zip (no central directory; {exc}); file is {size} bytes",
                         problem="corrupt")
    prefix = first[: -len("data.pkl")]
    pickled = read_pickle_symbolically(head[30 + name_len + extra_len :])
    if pickled.unsafe:
        return _content_audit("torch_zip", size, mtime, pickled, path.stem, notes=[], checked_with="structure")
    if pickled.error:
        return FileAudit("torch_zip", size, mtime, False,
                         f"truncated: the file ends at {size} bytes inside data.pkl ({pickled.error}); no central "
                         "directory: the save was cut off", problem="corrupt")
    storages = [p for p in pickled.refs if isinstance(p, tuple) and len(p) >= 3 and p[0] == "storage"]
    started = _members_started(path, prefix.encode(), size)
    written = sum(1 for n in started if n.startswith(prefix + "data/"))
    last = started[-1] if started else first
    return FileAudit(
        "torch_zip", size, mtime, False,
        f"truncated: no zip central directory; the file ends at {size} bytes inside member '{last}' "
        f"({written} of {len(storages)} tensor storages started): the save was cut off",
        problem="corrupt",
    )


def _members_started(path: Path, prefix: bytes, size: int) -> list[str]:
    """Names of the zip members whose local header made it to disk (scan capped)."""
    names: list[str] = []
    pattern = re.compile(re.escape(ZIP_MAGIC) + rb"[\s\S]{22}([\s\S]{2})[\s\S]{2}(" + re.escape(prefix) + rb"[\x20-\x7e]{1,200})")
    carry, offset = b"", 0
    with open(path, "rb") as fh:
        while offset < min(size, TRUNCATION_SCAN_BYTES):
            block = fh.read(16 << 20)
            if not block:
                break
            data = carry + block
            for match in pattern.finditer(data):
                (length,) = struct.unpack("<H", match.group(1))
                name = match.group(2)[:length].decode("ascii", "replace")
                if len(match.group(2)) >= length and (not names or names[-1] != name):
                    names.append(name)
            carry = data[-300:]
            offset += len(block)
    return names


def _audit_legacy(path: Path, size: int, mtime: float, *, use_torch: bool) -> FileAudit:
    """torch.save(..., _use_new_zipfile_serialization=False): magic, protocol, sys info, object, keys, storages."""
    checked = _structural(use_torch)
    with open(path, "rb") as fh:
        parts = []
        for what in ("magic number", "protocol version", "system info"):
            part = read_pickle_symbolically(fh)
            if part.error:
                return FileAudit("torch_legacy", size, mtime, False, f"unexpected EOF in the {what} header: {part.error}",
                                 problem="corrupt")
            parts.append(part.obj)
        if parts[0] != _LEGACY_MAGIC:
            return FileAudit("", size, mtime, False)
        body = read_pickle_symbolically(fh)
        audit = _content_audit("torch_legacy", size, mtime, body, path.stem, notes=[], checked_with=checked)
        if audit.problem == "corrupt":
            return replace(audit, reason=f"truncated: the file ends at {size} bytes inside the pickled object "
                                         f"({body.error}): the save was cut off")
        if not audit.readable:
            return audit
        keys_part = read_pickle_symbolically(fh)
        if keys_part.error or not isinstance(keys_part.obj, list):
            return replace(audit, readable=False, problem="corrupt",
                           reason=f"truncated: the file ends before the storage list ({keys_part.error or 'not a list'})")
        types = {str(p[2]): p[1] for p in body.refs if isinstance(p, tuple) and len(p) >= 5 and p[0] == "storage"}
        position = fh.tell()
        for index, key in enumerate(keys_part.obj):
            if position + 8 > size:
                return replace(audit, readable=False, problem="corrupt",
                               reason=f"unexpected EOF: the file ends at {size} bytes before storage {index + 1} of "
                                      f"{len(keys_part.obj)}: the save was cut off")
            fh.seek(position)
            (numel,) = struct.unpack("<q", fh.read(8))
            per = _element_bytes(types.get(str(key))) or 1
            position += 8 + numel * per
            if position > size:
                return replace(audit, readable=False, problem="corrupt",
                               reason=f"unexpected EOF: storage {index + 1} of {len(keys_part.obj)} needs bytes up to "
                                      f"{position}, the file ends at {size}: the save was cut off")
    return _maybe_torch_load(path, audit, use_torch=use_torch, mmap=False)


def _audit_plain_pickle(path: Path, size: int, mtime: float) -> FileAudit:
    with open(path, "rb") as fh:
        pickled = read_pickle_symbolically(fh)
    return _content_audit("pickle", size, mtime, pickled, path.stem, notes=[], checked_with="symbolic unpickler")


_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8, "C64": 8, "C128": 16,
}


def _audit_safetensors(path: Path, size: int, mtime: float) -> FileAudit:
    """8-byte header length, JSON header, then the tensor bytes the header's offsets describe."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return FileAudit("safetensors", size, mtime, False, f"truncated: {size} bytes, no header", problem="corrupt")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(size, 100 << 20):
            return FileAudit("safetensors", size, mtime, False,
                             f"truncated or corrupt: header length {header_len} exceeds the file ({size} bytes)",
                             problem="corrupt")
        try:
            with address_space():  # a 100 MB header of `[[],[],...]` would build GBs of lists
                header = json.loads(fh.read(header_len))
        except (ValueError, UnicodeDecodeError, BudgetExceeded) as exc:
            return FileAudit("safetensors", size, mtime, False, f"corrupt header: {exc}", problem="corrupt")
    if not isinstance(header, dict):
        return FileAudit("safetensors", size, mtime, False, "corrupt header: not a JSON object", problem="corrupt")
    end, bad = 0, []
    names = set()
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = spec["data_offsets"]
            numel = _numel(spec["shape"])
            per = _SAFETENSORS_DTYPE_BYTES.get(spec["dtype"])
        except (KeyError, TypeError, ValueError):
            bad.append(name)
            continue
        if per is not None and stop - begin != numel * per:
            bad.append(name)
        end = max(end, stop)
        names.add(name)
    if bad:
        return FileAudit("safetensors", size, mtime, False, f"corrupt header: bad entries for {', '.join(sorted(bad)[:3])}",
                         problem="corrupt")
    expected = 8 + header_len + end
    if size < expected:
        return FileAudit("safetensors", size, mtime, False,
                         f"truncated: the header describes {expected} bytes, the file has {size}: the save was cut off",
                         problem="corrupt", tensor_names=frozenset(names))
    notes = ("safetensors carry no checksums; sizes and offsets checked",)
    components = frozenset({"model"}) if names else frozenset()
    hinted = summarize({}, path.stem).components  # optimizer.safetensors and the like
    if names and hinted & {"optimizer"}:
        components = frozenset({"optimizer"})
    return FileAudit("safetensors", size, mtime, True, "", notes, "structure (safetensors header)", components,
                     tensor_names=frozenset(names))


def _numel(shape: Any) -> int:
    """Elements of a safetensors shape: a list of at most 16 int64 dims (`math.prod` of 64 dims of
    4,000 digits each never ends); anything else raises ValueError, a bad entry."""
    if not isinstance(shape, list) or len(shape) > 16 or not all(type(d) is int and 0 <= d < 1 << 63 for d in shape):
        raise ValueError("not a shape")
    return math.prod(shape)


def sniff(path: Path) -> str:
    """The checkpoint format a file's first bytes show: torch_zip, torch_legacy, pickle, safetensors or ''."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return ""
    if head.startswith(ZIP_MAGIC):
        return "torch_zip"
    if head.startswith(_LEGACY_HEAD) or (len(head) < len(_LEGACY_HEAD) and _LEGACY_HEAD.startswith(head)):
        return "torch_legacy"
    if _SAFETENSORS_HEAD.match(head):
        return "safetensors"
    if _PICKLE_PROTO.match(head):
        return "pickle"
    return ""


@lru_cache(maxsize=4096)
def _audit_file_cached(real: str, size: int, mtime_ns: int, ctime_ns: int, inode: int, use_torch: bool,
                       verify_crc: bool) -> FileAudit:
    del ctime_ns, inode  # part of the cache key only: a rewritten file is audited again
    path = Path(real)
    mtime = mtime_ns / 1e9
    if size == 0:
        return FileAudit("empty", 0, mtime, False, "empty file (0 bytes): the save wrote nothing", problem="corrupt")
    try:
        kind = sniff(path)
        if kind == "torch_zip":
            return _audit_torch_zip(path, size, mtime, use_torch=use_torch, verify_crc=verify_crc)
        if kind == "torch_legacy":
            return _audit_legacy(path, size, mtime, use_torch=use_torch)
        if kind == "safetensors":
            return _audit_safetensors(path, size, mtime)
        if kind == "pickle":
            return _audit_plain_pickle(path, size, mtime)
    except OSError as exc:
        return FileAudit("unknown", size, mtime, False, f"cannot read: {exc.strerror or exc}", problem="corrupt")
    except INPUT_ERRORS as exc:  # one malformed file must not stop the audit of the others
        return FileAudit("unknown", size, mtime, False, f"could not be read: {type(exc).__name__}: {exc}"[:300],
                         problem="corrupt")
    return FileAudit("unknown", size, mtime, False,
                     "not a checkpoint format this version reads (neither zip, pickle nor safetensors): "
                     "overwritten or corrupt", problem="corrupt")


def audit_file(path: Path, *, use_torch: bool | None = None, verify_crc: bool = True) -> FileAudit:
    """Audit one file (cached by path and stat)."""
    try:
        st = path.stat()
    except OSError as exc:
        return FileAudit("missing", 0, 0.0, False, f"cannot stat: {exc.strerror or exc}", problem="corrupt")
    torch_ok = torch_available() if use_torch is None else use_torch
    return _audit_file_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, torch_ok,
                              verify_crc)
