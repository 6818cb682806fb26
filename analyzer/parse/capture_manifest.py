"""Stage 2, parse (capture manifest): `postmortem capture`'s manifest.json -> canonical events.

The dumps beside the manifest carry their rank in their file names; the manifest adds what they
cannot: the host each rank ran on and its pid (so correlate attributes the stacks, and the
findings built on them, to a host), and what could not be captured and why. One `capture.process`
event per process (severity `warning` when its stacks are missing or incomplete) and one
`capture.node` event per node tool that ran but failed or timed out (a `nvidia-smi` that hangs is
itself news). A manifest is a few kilobytes per rank; reading it whole is fine.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from analyzer.bounds import int64
from analyzer.io import DecompressionLimit, InputFile
from analyzer.events import empty_events, events_from_records

MAX_MANIFEST_BYTES = 64 << 20
_CAPTURED = ("captured", "partial")


def parse_capture_manifest(item: InputFile) -> pl.DataFrame:
    try:
        doc = json.loads(item.read_all(MAX_MANIFEST_BYTES))
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        item.skip(f"unreadable capture manifest: {exc}"[:300], status="error")
        return empty_events()
    if not isinstance(doc, Mapping):
        item.skip("capture manifest is not a JSON object", status="error")
        return empty_events()
    records = list(_records(doc, item.path))
    item.lines = len(records)
    if not records:
        item.skip("capture manifest lists no process (each job's own manifest does)", status="partial")
        return empty_events()
    return events_from_records(records)


def _records(doc: Mapping, path: str) -> Iterator[dict[str, Any]]:
    host = _text(doc.get("host"))
    for proc in doc.get("processes") or []:
        if not isinstance(proc, Mapping):
            continue
        status = _text(proc.get("status")) or "unknown"
        rank, pid = int64(proc.get("rank")), int64(proc.get("pid"))
        env = proc.get("env") if isinstance(proc.get("env"), Mapping) else {}
        who = f"rank {rank}" if rank is not None else "rank unknown"
        files = [str(f) for f in proc.get("files") or []]
        if status in _CAPTURED:
            message = f"capture of {who} (pid {pid}): {status}, {len(files)} file(s)"
        else:
            message = f"capture of {who} (pid {pid}): {status}, no stacks"
        yield {
            "file": path,
            "line": 0,  # a whole-file record
            "host": host,
            "pid": pid,
            "rank": rank,
            "local_rank": int64(proc.get("local_rank")),
            "source": "capture",
            "kind": "capture.process",
            "severity": "info" if status == "captured" else "warning",
            "code": status,
            "message": message,
            "nranks": int64(env.get("WORLD_SIZE")),
            # The tools' own error text stays out of message/detail, which signatures match.
            "text": json.dumps({k: proc.get(k) for k in ("pid", "rank", "rank_source", "status", "reason", "files")})[:4000],
        }
    for record in doc.get("node") or []:
        if not isinstance(record, Mapping) or record.get("status") not in ("failed", "timeout"):
            continue
        yield {
            "file": path,
            "line": 0,
            "host": host,
            "source": "capture",
            "kind": "capture.node",
            "severity": "warning",
            "code": _text(record.get("status")),
            "message": f"node tool {record.get('call')}: {record.get('status')}",
            "text": json.dumps({k: record.get(k) for k in ("call", "command", "status", "reason", "seconds")})[:4000],
        }


def _text(value: object) -> str | None:
    return None if value is None else str(value)
