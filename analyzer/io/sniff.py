"""Stage 1, io (sniffing): an input's format from its first bytes, and its path's layout hints.

`classify` sets `InputFile.format` (or skips the input with the reason: binary, source code, a
checkpoint the audit reads) from the head read while walking; only a JSON document is read whole
to tell its kind. `apply_layout_hints` records what the path says of the rank (torchrun's
`attempt_N/<local_rank>/`, `rank<N>` in a name) for correlate. `rank_from_name` is the one reading
of a rank from a path, which the dump parsers (Flight Recorder, py-spy, gdb) use too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from pathlib import PurePosixPath

from analyzer.bounds import rank_number
from analyzer.io.inputs import InputFile
from analyzer.io.streams import READ_ERRORS, is_zip

PICKLE_PROTOCOL_2_PLUS = b"\x80"
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

_TORCHRUN_RANK_DIR = re.compile(r"attempt_\d+/(\d+)/(?:stdout|stderr)\.log(?:\.gz)?$")
_PYSPY_TEXT = re.compile(rb"\s*Process \d+: .*\n(?:Python v|Thread )")
# gdb's `bt` / `thread apply all bt`: the prompt, bracketed notices and thread headers, then frame #0.
_GDB_BACKTRACE = re.compile(rb"(?:[ \t]*(?:\(gdb\)[^\n]*|\[[^\n]*\]|Thread \d+ \([^\n]*|)\r?\n)*[ \t]*#0 +\S")
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


# Every match of _COLLECT_ENV holds one of these: a head without them is not searched.
_COLLECT_ENV_LITERALS = (b"Collecting environment information", b"Is debug build")


def _stack_listing(head: bytes) -> str:
    if any(lit in head for lit in _COLLECT_ENV_LITERALS) and _COLLECT_ENV.search(head):
        return "collect_env"
    lines = [line for line in head.splitlines()[:-1] if line.strip()]  # the last may be cut by the sniff
    if len(lines) >= 2 and all(_PIP_LINE.match(line) for line in lines) and _PIP_STACK.search(head):
        return "pip_freeze"
    return ""
# nccl-tests / rccl-tests output (its header, column header or summary line), read as text too.
_NCCL_TESTS = re.compile(
    rb"(?m)^[^\n]{0,48}?(?:#\s*)?nThread \d+ nGpus \d+ |^[^\n]{0,48}?#?\s*Avg bus bandwidth\s*:|^[^\n]{0,48}?#\s+size\s+count\s+type\s"
    rb"|^[^\n]{0,48}?#\s+\(B\)\s+\(elements\)"  # a pasted table: its unit line, or a row of a type nccl-tests names
    rb"|^[^\n]{0,48}?#?\s+bytes\s+N\s+type\s+op\s"  # NCCL 1's test programs (and the first nccl-tests): their columns
    rb"|^(?:\[\d+\])?\s*\d+\s+\d+\s+(?:float|double|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|f8e\w+)\s+(?:sum|prod|min|max|avg|none|mulsum|-?\d+)\s"
)
# Every match of _NCCL_TESTS holds one of these (tests/test_sniff_prefilter.py checks that they
# cover it): only the lines holding one are matched. Searching the whole head with a multi-line
# `^` costs milliseconds a file (Python's re tries every position), which at thousands of rank
# logs was most of discovery.
_NCCL_TESTS_LITERALS = (b"(elements)", b"Avg bus bandwidth", b"bytes", b"count", b"f8e", b"float", b"double", b"half",
                        b"int8", b"int32", b"int64", b"nThread ")


def _holds_nccl_tests_line(head: bytes) -> bool:
    tried: set[int] = set()
    for literal in _NCCL_TESTS_LITERALS:
        at = head.find(literal)
        while at != -1:
            start = head.rfind(b"\n", 0, at) + 1
            end = head.find(b"\n", at)
            end = len(head) if end == -1 else end
            if start not in tried:
                tried.add(start)
                if _NCCL_TESTS.match(head, start, end):
                    return True
            at = head.find(literal, end)
    return False
# The CUDA samples' peer-to-peer tests (p2pBandwidthLatencyTest, simpleP2P): their name line, read by
# analyzer/parse/p2ptest.py and as text too.
_P2P_TEST = re.compile(rb"(?m)^\[(?:P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test|[^\]\n]*simpleP2P)\]")
_RANK_WORD = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
_TRAILING_DIGITS = re.compile(r"(\d+)$")
_NAME_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")  # `.pkl`, `.gz`, `.txt`: not `.3`
# A run of NULs inside text is crash padding (blocks allocated but never written before the host
# died); scattered NULs are binary structure.
_NUL_RUN = re.compile(rb"\x00{16,}")
# Control bytes that text does not hold (tab, newlines, form feed and ESC are text).
_CONTROL_BYTES = bytes(b for b in range(32) if b < 9 or 13 < b < 27 or 27 < b < 32)


def classify(item: InputFile) -> None:
    try:
        head = item._head if item._head is not None else item.read_head()
    except READ_ERRORS as exc:
        item.format = item._codec or "unknown"
        item.skip(f"cannot read: {exc}", status="error")
        return
    item.format, reason = format_of_head(head, lambda: _json_kind(item))
    if reason:
        item.skip(reason)


def format_of_head(head: bytes, json_kind: Callable[[], str]) -> tuple[str, str]:
    """(format, reason to skip it or "") from an input's first bytes; `json_kind` says what a JSON
    document is (that needs the whole document)."""
    if not head:
        return "empty", "empty after decompression"
    if is_zip(head) or _SAFETENSORS_HEADER.match(head) or _TORCH_PICKLE_CHECKPOINT.match(head):
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
    if stripped[:1] in (b"{", b"[") and _may_be_json(stripped):
        kind = json_kind()
        if kind != "text":
            return kind, ""
    if _PYSPY_TEXT.match(head):
        return "pyspy_text", ""
    if _GDB_BACKTRACE.match(head):
        return "gdb_backtrace", ""
    stack_format = _stack_listing(head)  # torch's collect_env report, a pip freeze / pip list
    if stack_format:
        return stack_format, ""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _looks_utf16(head):
        return "text-utf16", ""
    if _looks_binary(head):
        if not head.strip(b"\x00"):
            return "binary", "nothing but NUL bytes (blocks never written before a crash?)"
        return "binary", "binary content (not a log, dump or trace this version reads)"
    if (b"GPU Bandwidth Latency Test]" in head or b"simpleP2P]" in head) and _P2P_TEST.search(head):
        return "p2p_test", ""
    if _holds_nccl_tests_line(head):
        return "nccl_tests", ""
    if _looks_like_source(head):
        return "source", "source code or markup (CSS, HTML, JavaScript, Python), not a log"
    return "text", ""


# After a JSON document's opening bracket comes a value, a key or the closing bracket. A log line
# that opens with a bracket (`[rank0]: ...`, `[INFO] ...`) is told apart from its head, without
# reading the whole file to fail `json.loads`.
_NOT_JSON_AFTER_BRACKET = re.compile(rb"[\[{][ \t\r\n]*[A-Za-eg-mo-suv-z_(<|:]")


def _may_be_json(stripped: bytes) -> bool:
    return not _NOT_JSON_AFTER_BRACKET.match(stripped)


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
    text = _NUL_RUN.sub(b"", head) if b"\x00" in head else head
    if not text.strip(b"\x00"):
        return True  # nothing but NULs
    if b"\x00" in text and not _looks_utf16(head):
        return True
    sample = text[:8192]
    control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))  # counted in C, not byte by byte
    return control > len(sample) * 0.10


def _looks_utf16(head: bytes) -> bool:
    sample = head[:4096]
    if len(sample) < 4:
        return False
    odd_zero = sample[1::2].count(0) / (len(sample) / 2)
    even_zero = sample[0::2].count(0) / (len(sample) / 2)
    # UTF-16 puts its zero bytes on one side only; NUL padding fills both.
    return (odd_zero > 0.4 or even_zero > 0.4) and min(odd_zero, even_zero) < 0.2


def apply_layout_hints(item: InputFile) -> None:
    member_path = item.path.split("!")[-1]
    match = _TORCHRUN_RANK_DIR.search(member_path)
    if match:
        # A huge rank directory is no hint (bounds.rank_number: None).
        item.local_rank_hint = rank_number(match.group(1))
        return
    item.rank_hint = rank_from_name(member_path)


def rank_from_name(path: str, *, directories: bool = False, digits: bool = False, pids: Collection[int] = ()) -> int | None:
    """The rank a path names: the last `rank<N>` word of its file name (host prefixes come first:
    `node12_nccl_trace_rank_3`); with `directories`, else that of the nearest directory with one
    (`rank5/py-spy.txt`); with `digits`, else the trailing digits of the name without its suffixes
    (`trace_7.pkl.gz`), unless the name says they are a pid or they are one of `pids` (`py-spy dump
    --pid 2179 > 2179.txt`). An archive member's path counts from the member (`job.tar!rank3.log`)."""
    parts = PurePosixPath(path.split("!")[-1]).parts
    for part in reversed(parts if directories else parts[-1:]):
        words = _RANK_WORD.findall(part)
        if words:
            return rank_number(words[-1])
    if not digits or not parts:
        return None
    stem = parts[-1]
    for _ in range(3):  # `x_rank0.pkl.gz`
        stem = _NAME_SUFFIX.sub("", stem)
    match = _TRAILING_DIGITS.search(stem)
    if match is None or "pid" in stem.lower():
        return None
    rank = rank_number(match.group(1))
    return None if rank in pids else rank
