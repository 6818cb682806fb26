"""The canonical event model, declared once.

Every parser emits frames with exactly these columns and dtypes; every later stage (correlate,
detect, decide, render) reads only these names. Specialised tables (collectives, stacks) are
frames derived from this one.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

UTC_TS = pl.Datetime("us", "UTC")

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String,  # input path relative to the job root (archive members as archive!member)
    "line": pl.Int64,  # 1-based line number in that file; 0 for whole-file records
    "ts": UTC_TS,  # wall-clock time when the source said (nullable)
    "ts_source": pl.String,  # how ts was known: nccl, c10d, torchelastic, collector, record, inferred
    "host": pl.String,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "rank": pl.Int64,  # global rank
    "local_rank": pl.Int64,
    "device": pl.Int64,  # local CUDA ordinal as the source printed it
    "source": pl.String,  # format: nccl, c10d, python, torchrun, system, pyspy, flight_recorder, text
    "kind": pl.String,  # e.g. nccl.warn, watchdog.timeout, traceback.exception
    "severity": pl.String,  # info, warning, error, fatal
    "message": pl.String,  # payload after every wrapper prefix
    "text": pl.String,  # the raw line as read (capped)
    "seq": pl.Int64,  # collective sequence number
    "op": pl.String,  # collective op type
    "numel_in": pl.Int64,
    "numel_out": pl.Int64,
    "timeout_ms": pl.Int64,
    "pg": pl.String,  # process group id/description
    "pg_rank": pl.Int64,  # rank inside that process group
    "nranks": pl.Int64,
    "last_enqueued": pl.Int64,
    "last_completed": pl.Int64,
    "exitcode": pl.Int64,
    "peer": pl.String,  # remote address or host named by the message
    "code": pl.String,  # error name: ncclSystemError, OSError, IBV status, signal name
    "detail": pl.String,  # context: the traceback stack, the NCCL 'Last error', a transport
    "ranks_ref": pl.List(pl.Int64),  # ranks named inside the message
    # One event may stand for many alike lines of one writer (NCCL's per-channel connection lines, a
    # line repeated verbatim): how many, and the last of them. Null: the event is one line.
    "repeat": pl.Int64,
    "last_line": pl.Int64,
    "last_ts": UTC_TS,
}

EVENT_COLUMNS: list[str] = list(EVENT_SCHEMA)

def empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def conform(frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Add missing canonical columns as nulls, cast, and order them; extra columns are dropped."""
    lazy = frame.lazy() if isinstance(frame, pl.DataFrame) else frame
    present = set(lazy.collect_schema().names())
    exprs = [
        (pl.col(name) if name in present else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in EVENT_SCHEMA.items()
    ]
    return lazy.select(exprs).collect()


def events_from_records(records: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """Build an event frame from a small number of dict records (structured files, not log lines)."""
    rows = [{name: record.get(name) for name in EVENT_COLUMNS} for record in records]
    if not rows:
        return empty_events()
    return pl.DataFrame(rows, schema=EVENT_SCHEMA)


def concat_events(frames: Iterable[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    if not frames:
        return empty_events()
    return pl.concat(frames, how="vertical").rechunk()


def detached(frame: pl.DataFrame) -> pl.DataFrame:
    """A copy of `frame` that shares no buffer with the frame it was cut from.

    String columns of a filtered frame can be views into the whole source batch; a round trip
    through polars' own IPC writer in the oldest layout (offsets, not views) copies only the bytes
    the rows use, so the batch can be freed. Polars-native: no pyarrow.
    """
    buffer = io.BytesIO()
    frame.write_ipc(buffer, compat_level=pl.CompatLevel.oldest())
    buffer.seek(0)
    return pl.read_ipc(buffer)
