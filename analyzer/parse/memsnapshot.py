"""Stage 2, parse (memory snapshots): PyTorch CUDA caching-allocator snapshots -> compact events.

`torch.cuda.memory._dump_snapshot(path)` pickles `torch.cuda.memory._snapshot()`: a dict of plain
lists and dicts (`segments`, each with its `blocks`; `device_traces`, one list of allocator actions
per device; `allocator_settings`). It is loaded only through `analyzer.io.safepickle`, which refuses
every global; a snapshot needs none. Flight Recorder dumps are pickles too, so the dispatcher
calls `memory_snapshot_events` first and falls back to the Flight Recorder parser when the
document is not a snapshot.

Per device, one `memory.snapshot` event measures fragmentation from the segments: memory reserved,
allocated, free bytes stranded inside segments that still hold live blocks (the allocator cannot
return them to the driver, nor hand them out for a larger request), the largest free block, and
the allocator actions recorded in the trace (segment allocations and releases: churn). Each `oom`
action of the trace becomes a `memory.oom` event with the request and what the device had free.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Mapping
from typing import Any

import polars as pl

from analyzer.bounds import bounded_str, cap_text, int64
from analyzer.io import DecompressionLimit, InputFile
from analyzer.events import empty_events, events_from_records
from analyzer.io.safepickle import CorruptPickleError, UnsafePickleError, load_untrusted_pickle
from analyzer.units import byte_size

MAX_SNAPSHOT_BYTES = 512 << 20  # and building it must fit the parse budget (analyzer.parse.budget)
MAX_OOM_EVENTS = 10
_LIVE_STATES = ("active_allocated", "active_pending_free")


def is_memory_snapshot(doc: object) -> bool:
    return isinstance(doc, Mapping) and ("segments" in doc or "device_traces" in doc) and "entries" not in doc


def load_pickle(item: InputFile) -> object:
    """The document of a pickle input, through the restricted unpickler, streamed from the file (a
    sparse file of 2 GB of holes is never read into memory: the budget stops the load first)."""
    if item.size > MAX_SNAPSHOT_BYTES:
        raise CorruptPickleError(f"pickle is {item.size} bytes, more than the {MAX_SNAPSHOT_BYTES}-byte limit")
    with item.open_bytes() as fh:
        return load_untrusted_pickle(io.BufferedReader(fh, buffer_size=1 << 20) if not hasattr(fh, "peek") else fh)


def memory_snapshot_events(item: InputFile) -> pl.DataFrame | None:
    """Events of a memory snapshot pickle, or None when the pickle is something else (or unreadable)."""
    try:
        doc = load_pickle(item)
    except (UnsafePickleError, CorruptPickleError, ValueError, OSError, EOFError, zlib.error, DecompressionLimit):
        return None  # the Flight Recorder parser reports why, with its own wording
    if not is_memory_snapshot(doc):
        return None
    item.format = "memory_snapshot"
    return snapshot_events(doc, file=item.path, rank=item.rank_hint)


def _snapshot_int(value: Any) -> int:
    """A byte count or device number of the snapshot: a number within int64 (`bounds.int64`); anything
    else (past int64, NaN, a list, a string: the allocator writes numbers) counts as 0."""
    return (int64(value) or 0) if isinstance(value, int | float) else 0


def _name(value: Any) -> str:
    """An action or state name: a string (bounded), anything else rendered within a budget."""
    return cap_text(value, 256) if isinstance(value, str) else bounded_str(value, 256)


def segments_frame(doc: Mapping) -> pl.DataFrame:
    """One row per segment: device, reserved/allocated bytes, free bytes and largest free block."""
    rows = []
    for seg in doc.get("segments") or []:
        if not isinstance(seg, Mapping):
            continue
        blocks = [b for b in seg.get("blocks") or [] if isinstance(b, Mapping)]
        free = [_snapshot_int(b.get("size")) for b in blocks if b.get("state") not in _LIVE_STATES]
        live = sum(_snapshot_int(b.get("size")) for b in blocks if b.get("state") in _LIVE_STATES)
        total = _snapshot_int(seg.get("total_size"))
        allocated = _snapshot_int(seg.get("allocated_size")) if "allocated_size" in seg else live
        rows.append(
            {
                "device": _snapshot_int(seg.get("device")),
                "total": total,
                "allocated": _snapshot_int(allocated),  # a sum of int64 sizes may pass int64: then it is no figure
                "free": _snapshot_int(max(total - allocated, 0)),
                "largest_free": _snapshot_int(max(free, default=max(total - allocated, 0) if not blocks else 0)),
                "expandable": bool(seg.get("is_expandable")),
            }
        )
    schema = {"device": pl.Int64, "total": pl.Int64, "allocated": pl.Int64, "free": pl.Int64, "largest_free": pl.Int64, "expandable": pl.Boolean}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def actions_frame(doc: Mapping) -> pl.DataFrame:
    """One row per allocator action of the recorded history (`device_traces`)."""
    devices, actions, sizes, free = [], [], [], []
    for device, trace in enumerate(doc.get("device_traces") or []):
        for entry in trace or []:
            if isinstance(entry, Mapping):
                devices.append(device)
                actions.append(_name(entry.get("action")))
                sizes.append(_snapshot_int(entry.get("size")))
                free.append(_snapshot_int(entry.get("device_free")) if "device_free" in entry else None)
    return pl.DataFrame(
        {"device": devices, "action": actions, "size": sizes, "device_free": free},
        schema={"device": pl.Int64, "action": pl.String, "size": pl.Int64, "device_free": pl.Int64},
    )


def snapshot_events(doc: Mapping, *, file: str, rank: int | None) -> pl.DataFrame:
    segments = segments_frame(doc)
    actions = actions_frame(doc)
    per_segment = segments.group_by("device").agg(
        pl.col("total").sum().alias("reserved"),
        pl.col("allocated").sum().alias("allocated"),
        pl.len().alias("segments"),
        # Free bytes in segments that still hold a live block: stranded until every block frees.
        pl.col("free").filter(pl.col("allocated") > 0).sum().alias("stranded"),
        ((pl.col("allocated") > 0) & (pl.col("free") > 0)).sum().alias("partial_segments"),
        pl.col("largest_free").max().alias("largest_free"),
        pl.col("expandable").any().alias("expandable"),
    )
    per_action = actions.group_by("device").agg(
        (pl.col("action") == "segment_alloc").sum().alias("segment_allocs"),
        (pl.col("action") == "segment_free").sum().alias("segment_frees"),
        (pl.col("action") == "alloc").sum().alias("allocs"),
        (pl.col("action") == "oom").sum().alias("ooms"),
        pl.col("size").filter(pl.col("action") == "oom").max().alias("oom_request"),
        # Segments cudaMalloc'ed again after the allocator started returning segments: churn.
        ((pl.col("action") == "segment_alloc") & (pl.col("action") == "segment_free").cum_sum().gt(0)).sum().alias("segment_reallocs"),
    )
    devices = per_segment.join(per_action, on="device", how="full", coalesce=True).sort("device")
    records = []
    for row in devices.iter_rows(named=True):  # one row per GPU of the snapshot
        records.append(_device_record(row, file=file, rank=rank))
    for row in actions.filter(pl.col("action") == "oom").head(MAX_OOM_EVENTS).iter_rows(named=True):
        message = (
            f"GPU {row['device']}: allocation of {byte_size(row['size'])} failed (out of memory)"
            + (f" with {byte_size(row['device_free'])} free on the device" if row["device_free"] is not None else "")
        )
        records.append(
            {
                "file": file, "line": 0, "rank": rank, "device": row["device"], "source": "memory_snapshot",
                "kind": "memory.oom", "severity": "error", "message": message, "text": message, "code": "oom",
                "detail": json.dumps({"size": row["size"], "device_free": row["device_free"]}),
            }
        )
    return events_from_records(records) if records else empty_events()


def _device_record(row: dict, *, file: str, rank: int | None) -> dict:
    figures = {k: (row.get(k) or 0) for k in ("reserved", "allocated", "stranded", "partial_segments", "largest_free", "segments", "segment_allocs", "segment_frees", "segment_reallocs", "allocs", "ooms")}
    figures["oom_request"] = row.get("oom_request")
    figures["expandable"] = bool(row.get("expandable"))
    reserved = figures["reserved"]
    figures["fragmentation"] = round(figures["stranded"] / reserved, 4) if reserved else 0.0
    message = (
        f"GPU {row['device']} memory snapshot: {byte_size(reserved)} reserved in {figures['segments']} segments, "
        f"{byte_size(figures['allocated'])} allocated; {byte_size(figures['stranded'])} free inside "
        f"{figures['partial_segments']} partly used segments ({figures['fragmentation']:.0%} of reserved), largest free "
        f"block {byte_size(figures['largest_free'])}; history: {figures['segment_allocs']} segment allocations, "
        f"{figures['segment_frees']} releases ({figures['segment_reallocs']} re-allocations after a release), {figures['ooms']} OOM"
    )
    return {
        "file": file, "line": 0, "rank": rank, "device": row["device"], "source": "memory_snapshot",
        "kind": "memory.snapshot", "severity": "info", "message": message, "text": message,
        "detail": json.dumps(figures),
    }
