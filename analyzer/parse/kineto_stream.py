"""Stage 2, parse (Kineto): the bounded byte streamer of a Chrome trace's `traceEvents` array.

A Kineto trace (`torch.profiler` `export_chrome_trace`, one file per rank, often `.json.gz`) is one
JSON document whose `traceEvents` array holds every CPU op, kernel, memcpy and annotation of the
profiled steps: millions of entries, gigabytes. It is streamed, never loaded whole: the array is
cut into blocks at event boundaries, one event per line; only the lines of the categories the
timeline needs (kernels, copies, annotations, allocator calls) go through polars' JSON decoder,
with only the fields needed here, so memory holds one block plus the kept GPU-activity columns.
`read_kineto` hands `analyzer.parse.kineto` those kept events, each with its 0-based position in
`traceEvents` (the evidence a summary cites), and the members around the array (`TraceMeta`).

Bounds: one read is `BLOCK_BYTES`; the members before the array are searched for at most
`HEADER_LIMIT` bytes, those after it read from at most `TRAILER_LIMIT`; a stretch of
`MAX_EVENT_BYTES` without an event boundary is refused (`TraceFormatError`), as are a truncated
document and a malformed event.

Known limit: the members after the array (`traceName`, `baseTimeNanoseconds`) are read from the
tail; a writer that put large nested members after `traceEvents` would read as truncated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, BinaryIO

import polars as pl

from analyzer.parse.budget import check_time
from analyzer.parse.trace_summary import FREE_CALLS, MALLOC_CALLS

BLOCK_BYTES = 16 << 20  # one read; a block of events is split and screened at a time
HEADER_LIMIT = 64 << 20  # top-level keys before `traceEvents` (deviceProperties, distributedInfo)
TRAILER_LIMIT = 64 << 20

# `"traceEvents": [` opens the array; `}` `,` `{` between two events. JSON strings cannot hold a raw
# newline, so newlines are whitespace and may be dropped; a separator that is really inside a
# string or a nested value leaves unbalanced lines, which the JSON decoder rejects: that block is
# then decoded event by event (exact, slower), so a wrong cut can never produce wrong data. (A cut
# inside an event of a dropped category only loses events that were to be dropped anyway.)
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_SEPARATOR_TEXT = re.compile(r"\}\s*,\s*\{")
_SEPARATOR_SPAN = 4096  # a separator straddling two reads is found again from this far back
MAX_EVENT_BYTES = 64 << 20  # no real event comes near; a "trace" without a boundary in this much is refused

# Only these categories matter to the timeline; everything else (cpu_op, python_function, flows) is
# dropped inside the block reader.
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset"}
MARK_CATEGORIES = ("user_annotation",)
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
# A kept event names one of these categories (allocator calls only among the API calls); every
# other event is dropped before JSON decoding.
_CATEGORY_LITERALS = [f'"{c}"' for c in (*GPU_CATEGORIES, *MARK_CATEGORIES, *API_CATEGORIES)]
_GPU_OR_MARK = r'"cat"\s*:\s*"(?:' + "|".join([*GPU_CATEGORIES, *MARK_CATEGORIES]) + ')"'
_API_CATEGORY = r'"cat"\s*:\s*"(?:' + "|".join(API_CATEGORIES) + ')"'
_RAW_SCHEMA = pl.Schema(
    {
        "ph": pl.String,
        "cat": pl.String,
        "name": pl.String,
        "ts": pl.Float64,
        "dur": pl.Float64,
        "args": pl.Struct({"device": pl.Float64, "stream": pl.Float64}),
    }
)

# Allocator calls are the only API calls kept: their exact names (the timeline's), and the prefixes
# a kept event's text is screened for before JSON decoding.
_ALLOC_CALLS = f"{MALLOC_CALLS}|{FREE_CALLS}"
_ALLOC_NAME = r'"name"\s*:\s*"(?:cudaMalloc|cudaFree|cuMemAlloc|cuMemFree|cuMemCreate|cuMemRelease)'


class TraceFormatError(ValueError):
    """The document is not a Chrome trace this parser can stream."""


@dataclass
class TraceMeta:
    """What the stream learnt besides the kept events: the members around the array and its counts."""

    header: dict = field(default_factory=dict)
    trailer: dict = field(default_factory=dict)
    slow_blocks: int = 0  # blocks decoded event by event because the fast cut did not parse
    bytes_read: int = 0
    events: int = 0  # entries of traceEvents read so far: the next one's 0-based position

    def get(self, key: str) -> Any:
        return self.header.get(key, self.trailer.get(key))


def iter_trace_blocks(fh: BinaryIO, meta: TraceMeta, block_bytes: int = BLOCK_BYTES) -> Iterator[pl.DataFrame]:
    """Frames of the kept events of `traceEvents`, block by block; fills `meta` header and trailer."""
    buf = b""
    while True:
        match = _ARRAY_START.search(buf)
        if match:
            break
        chunk = fh.read(block_bytes)
        meta.bytes_read += len(chunk)
        if not chunk or len(buf) > HEADER_LIMIT:
            raise TraceFormatError("no \"traceEvents\" array near the start of the document")
        buf += chunk
    meta.header = _loads_members(buf[: match.start()])
    pos = match.end()
    searched = 0  # bytes at the start of the carried-over buffer known to hold no separator
    while True:
        check_time()
        chunk = fh.read(block_bytes)
        meta.bytes_read += len(chunk)
        if not chunk:
            frame, rest = _decode_slow(buf[pos:], meta, final=True)
            yield frame
            meta.trailer = _loads_members(rest[:TRAILER_LIMIT], closing=True)
            return
        buf = buf[pos:] + chunk
        pos = 0
        cut = _last_separator(buf, searched)
        if cut is None:
            if len(buf) > MAX_EVENT_BYTES:
                raise TraceFormatError(f"no event boundary in {len(buf) >> 20} MB: one event longer than the "
                                       f"{MAX_EVENT_BYTES >> 20} MB limit, or not a trace")
            searched = max(0, len(buf) - _SEPARATOR_SPAN)  # one event longer than a block: read on, searching only the new bytes
            continue
        yield _decode_block(buf[:cut], meta)
        pos, searched = cut, 0


def _last_separator(buf: bytes, searched: int = 0) -> int | None:
    """Offset just after the `}` of the last event boundary in `buf[searched:]`, or None. Searched
    backwards from the end in growing windows, so the usual case reads 1 MB and none reads the
    bytes before `searched` again (a trace without any separator costs one pass, not one per block)."""
    window = 1 << 20
    start = max(searched, len(buf) - window)
    while True:
        last = None
        for last in _SEPARATOR.finditer(buf, start):
            pass
        if last is not None:
            return last.start() + 1
        if start == searched:
            return None
        start = max(searched, start - window * 8)


def _decode_block(block: bytes, meta: TraceMeta) -> pl.DataFrame:
    """One string per event, and only those of the kept categories go through polars' JSON reader."""
    flat = block.replace(b"\n", b"")
    if b"\r" in flat:
        flat = flat.replace(b"\r", b"")
    text = flat.decode("utf-8", errors="replace")
    start, end = 0, len(text)
    while start < end and text[start] in " \t,":
        start += 1
    while end > start and text[end - 1] in " \t,":
        end -= 1
    inner = text[start + 1 : end - 1]  # without the first event's "{" and the last one's "}"
    # The separator's spelling (`},  {` in Kineto's layout once newlines are gone) is split on as a
    # literal inside polars; mixed spellings take the regex.
    forms = {m.group(0) for m in islice(_SEPARATOR_TEXT.finditer(inner), 16)}
    if len(forms) <= 1:
        body = pl.Series("event", [inner], dtype=pl.String)
        if forms:
            body = body.str.split(forms.pop()).explode()
    else:
        body = pl.Series("event", _SEPARATOR_TEXT.split(inner), dtype=pl.String)
    if _miscut(body):
        meta.slow_blocks += 1
        frame, _ = _decode_slow(block, meta, final=False)
        return frame
    # Each event keeps its position in traceEvents: the evidence cites it.
    events = body.to_frame().with_row_index("index", offset=meta.events)
    # Cheap literal screen first; the exact test (the value of "cat", allocator call names) on the survivors.
    candidates = events.filter(pl.col("event").str.contains_any(_CATEGORY_LITERALS))
    text = pl.col("event")
    exact = text.str.contains(_GPU_OR_MARK) | (text.str.contains(_API_CATEGORY) & text.str.contains(_ALLOC_NAME))
    kept = candidates.filter(exact)
    try:
        if kept.height == 0:
            raw = pl.DataFrame(schema=_RAW_SCHEMA)
        else:
            lines = ("{" + kept.get_column("event") + "}").str.join("\n").item()
            raw = pl.read_ndjson(lines.encode("utf-8"), schema=_RAW_SCHEMA)
        raw = raw.with_columns(kept.get_column("index").cast(pl.Int64))
    except Exception:  # noqa: BLE001 - a cut inside a string or nested value, or an odd field type
        meta.slow_blocks += 1
        frame, _ = _decode_slow(block, meta, final=False)
        return frame
    meta.events += events.height
    return _keep(raw)


def _miscut(body: pl.Series) -> bool:
    """Whether a cut fell inside a string or a nested value: a piece with an odd number of quotes or
    unbalanced braces. The JSON decoder catches that in the pieces it reads; this catches it in the
    dropped ones too, whose count places every later event in traceEvents."""
    quotes = body.str.count_matches('"', literal=True) - body.str.count_matches('\\"', literal=True)
    braces = body.str.count_matches("{", literal=True) - body.str.count_matches("}", literal=True)
    return bool(((quotes % 2 != 0) | (braces != 0)).any())


def _decode_slow(data: bytes, meta: TraceMeta, *, final: bool) -> tuple[pl.DataFrame, str]:
    """Event-by-event decoding of `data`; with `final`, stops at the array's `]` and returns what follows.
    Every entry read advances `meta.events`, the position the next entry's row carries."""
    decoder = json.JSONDecoder()
    text = data.decode("utf-8", errors="replace")
    i, n = 0, len(text)
    rows: list[dict] = []
    closed = False
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        if text[i] == "]":
            closed = True
            i += 1
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError as exc:
            if final:  # the tail of the file: an event cut short
                raise TraceFormatError("truncated trace: the document ends inside an event") from exc
            raise TraceFormatError(f"malformed trace event: {exc.msg}") from exc
        meta.events += 1
        if isinstance(obj, dict):
            args = obj.get("args") if isinstance(obj.get("args"), dict) else {}
            rows.append(
                {
                    "index": meta.events - 1,
                    "ph": _str(obj.get("ph")),
                    "cat": _str(obj.get("cat")),
                    "name": _str(obj.get("name")),
                    "ts": _num(obj.get("ts")),
                    "dur": _num(obj.get("dur")),
                    "args": {"device": _num(args.get("device")), "stream": _num(args.get("stream"))},
                }
            )
    if final and not closed:
        raise TraceFormatError("truncated trace: the traceEvents array never closes")
    schema = {"index": pl.Int64, **_RAW_SCHEMA}
    raw = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return _keep(raw), text[i:]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _keep(raw: pl.DataFrame) -> pl.DataFrame:
    """The events the timeline needs, as (kind, name, start_ns, end_ns, device, stream, index):
    index is the event's 0-based position in traceEvents."""
    kind = (
        pl.when(pl.col("cat").is_in(list(GPU_CATEGORIES)))
        .then(pl.col("cat").replace_strict(GPU_CATEGORIES, default=None))
        .when(pl.col("cat").is_in(MARK_CATEGORIES))
        .then(pl.lit("mark"))
        .when(pl.col("cat").is_in(API_CATEGORIES) & pl.col("name").str.contains(_ALLOC_CALLS))
        .then(pl.lit("api"))
    )
    # strict=False: a timestamp of 1e400 (inf) or past int64 is an invalid value on its event, never an error.
    start = (pl.col("ts") * 1000.0).round(0).cast(pl.Int64, strict=False)
    return (
        raw.filter(pl.col("ph") == "X")
        .select(
            kind.alias("kind"),
            pl.col("name"),
            start.alias("start"),
            (start + (pl.col("dur").fill_null(0.0) * 1000.0).round(0).cast(pl.Int64, strict=False)).alias("end"),
            pl.col("args").struct.field("device").cast(pl.Int64, strict=False).alias("device"),
            pl.col("args").struct.field("stream").cast(pl.Int64, strict=False).alias("stream"),
            (pl.col("index") if "index" in raw.columns else pl.lit(None)).cast(pl.Int64).alias("index"),
        )
        .filter(pl.col("kind").is_not_null() & pl.col("start").is_not_null())
        .with_columns(pl.col("kind").cast(pl.Categorical), pl.col("name").cast(pl.Categorical))
    )


def _loads_members(data: bytes | str, closing: bool = False) -> dict:
    """The top-level members around the array (`{"a": 1, ... ,` before it, `, "b": 2 }` after it)."""
    text = (data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data).strip()
    if closing:
        text = "{" + text.lstrip(",").strip()
    else:
        text = text.rstrip(",").strip() + "}"
    try:
        doc = json.loads(text if text.startswith("{") else "{" + text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def read_kineto(fh: BinaryIO, block_bytes: int = BLOCK_BYTES) -> tuple[pl.DataFrame, TraceMeta]:
    """All kept events of one trace (GPU activity, annotations, allocator calls) and its metadata."""
    meta = TraceMeta()
    frames = list(iter_trace_blocks(fh, meta, block_bytes))
    frames = [f for f in frames if f.height]
    kept = pl.concat(frames, how="vertical", rechunk=True) if frames else _keep(pl.DataFrame(schema={"index": pl.Int64, **_RAW_SCHEMA}))
    return kept, meta

