"""Stage 2, parse (structured files): torchelastic `error.json` records.

Flight Recorder dumps and py-spy output have their own modules; this one holds the small JSON
records that carry one failure each.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import polars as pl

from analyzer.bounds import int64
from analyzer.io import InputFile
from analyzer.events import events_from_records

MAX_ERROR_JSON_BYTES = 16 << 20


class ErrorJsonError(ValueError):
    """The input is not a torchelastic error record this parser can read."""


def parse_error_json(item: InputFile) -> pl.DataFrame:
    """`{"message": {"message": "...", "extraInfo": {"py_callstack": ..., "timestamp": "..."}, "errorCode": N}}`.

    Any JSON shape is tolerated field by field (a file written by a dying process can hold anything);
    only a file that is not a JSON object raises, and then ErrorJsonError.
    """
    try:
        doc = json.loads(item.read_all(MAX_ERROR_JSON_BYTES))
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise ErrorJsonError(f"not a readable error.json: {type(exc).__name__}: {exc}"[:300]) from exc
    if not isinstance(doc, dict):
        raise ErrorJsonError(f"not a torchelastic error record: the top level is a JSON {type(doc).__name__}")
    message = doc.get("message")
    timestamp = doc.get("timestamp")
    callstack = None
    exitcode = None
    if isinstance(message, dict):
        extra = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
        callstack = extra.get("py_callstack")
        timestamp = extra.get("timestamp", timestamp)
        code = message.get("errorCode")
        exitcode = int64(code) if isinstance(code, int) else None  # a JSON integer, not a numeric string
        text = str(message.get("message", ""))
    else:
        text = str(message)
    item.lines = 1
    exc_type, _, exc_msg = text.partition(": ")
    ts = _epoch_seconds(timestamp)
    return events_from_records(
        [
            {
                "file": item.path,
                "line": 1,
                "ts": ts,
                "ts_source": "error.json" if ts else None,
                "rank": item.rank_hint,
                "local_rank": item.local_rank_hint,
                "source": "torchrun",
                "kind": "traceback.exception",
                "severity": "error",
                "message": text.splitlines()[0][:2000] if text else "",
                "text": text[:2000],
                "code": exc_type.strip() or None if exc_msg else None,
                "exitcode": exitcode,
                "detail": " | ".join(line.strip() for line in str(callstack or "").splitlines()[-40:] if line.strip()) or None,
            }
        ]
    )


def _epoch_seconds(value: object) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
