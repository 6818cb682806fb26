"""Stage 2, parse: turn every discovered input into canonical events.

`parse_inputs` dispatches each input to the parser of its format and isolates failures: a file
that cannot be parsed is marked in the input table with the reason, and the job goes on.
"""

from __future__ import annotations

import polars as pl

from analyzer.discover import InputFile
from analyzer.events import concat_events, empty_events


def _parse_error_json(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.structured import parse_error_json

    return parse_error_json(item)


def _parse_flight_recorder(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.flight_recorder import parse_flight_recorder

    events, info = parse_flight_recorder(item)
    if info.get("status"):
        item.status = info["status"]
        item.reason = info.get("reason", "")
    return events


def _parse_pyspy_text(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.pyspy import parse_pyspy_text

    return parse_pyspy_text(item)


def _parse_pyspy_json(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.pyspy import parse_pyspy_json

    return parse_pyspy_json(item)


TEXT_FORMATS = ("text", "text-utf16")

PARSERS = {
    "error_json": _parse_error_json,
    "pickle": _parse_flight_recorder,
    "flight_recorder_json": _parse_flight_recorder,
    "pyspy_text": _parse_pyspy_text,
    "pyspy_json": _parse_pyspy_json,
}

UNREAD_FORMATS = {
    "json": "JSON document of a kind this version does not read",
    "kineto_trace": "profiler trace: slow-job trace analysis is not part of this version",
}


def parse_input(item: InputFile) -> pl.DataFrame:
    """Events of one input; never raises for bad content (the reason lands on `item`)."""
    if item.status != "pending":
        return empty_events()
    if item.format in TEXT_FORMATS:
        return concat_events(_parse_text_batches([item]))
    parser = PARSERS.get(item.format)
    if parser is None:
        item.skip(UNREAD_FORMATS.get(item.format, f"format {item.format!r} is not read"))
        return empty_events()
    try:
        events = parser(item)
    except Exception as exc:  # noqa: BLE001 - a bad file must never abort the job
        item.skip(f"could not parse: {type(exc).__name__}: {exc}"[:500], status="error")
        return empty_events()
    if item.status == "pending":
        item.status = "partial" if item.unparsed_lines and not events.height else "parsed"
        if item.status == "partial":
            item.reason = "no line of a known format"
    ranks = events.get_column("rank").drop_nulls().unique().sort().to_list() if events.height else []
    item.ranks = ranks
    return events


BATCH_BYTES = 32 << 20  # small files are parsed together: per-call overhead dominates at 16k ranks


def parse_inputs(items: list[InputFile]) -> pl.DataFrame:
    text_items = [i for i in items if i.status == "pending" and i.format in TEXT_FORMATS]
    others = [i for i in items if i not in text_items]
    return concat_events([*_parse_text_batches(text_items), *(parse_input(item) for item in others)])


def _parse_text_batches(items: list[InputFile]) -> list[pl.DataFrame]:
    """Read text inputs chunk by chunk into batches of about BATCH_BYTES and parse each batch at once."""
    from analyzer.parse.logtext import iter_pieces, parse_text_pieces, year_hint_for

    frames: list[pl.DataFrame] = []
    batch: list = []
    size = 0

    def flush() -> None:
        nonlocal batch, size
        if batch:
            frames.append(_parse_batch(batch, parse_text_pieces, year_hint_for(batch[0].item)))
        batch, size = [], 0

    for item in items:
        try:
            for piece in iter_pieces(item):
                batch.append(piece)
                size += len(piece.text)
                if size >= BATCH_BYTES:
                    flush()
        except Exception as exc:  # noqa: BLE001 - unreadable bytes (truncated gzip, bomb) fail this file only
            batch = [p for p in batch if p.item is not item]
            item.skip(f"could not read: {type(exc).__name__}: {exc}"[:500], status="error")
    flush()
    for item in items:
        _finish(item)
    return frames


def _parse_batch(batch: list, parse, year_hint: int) -> pl.DataFrame:
    try:
        return parse(batch, year_hint)
    except Exception as exc:  # noqa: BLE001 - a parser bug fails the batch's files, never the job
        for piece in batch:
            piece.item.skip(f"could not parse: {type(exc).__name__}: {exc}"[:500], status="error")
        return empty_events()


def _finish(item: InputFile) -> None:
    if item.status == "pending":
        item.status = "parsed" if item.lines == 0 or item.unparsed_lines < item.lines else "partial"
        if item.status == "partial":
            item.reason = "no line of a known format"
