"""Stage 2, parse: turn every discovered input into canonical events.

`parse_inputs` dispatches each input to the parser of its format and isolates failures: a file
that cannot be parsed is marked in the input table with the reason, and the job goes on.
"""

from __future__ import annotations

import polars as pl

from analyzer.discover import InputFile
from analyzer.events import concat_events, empty_events


def _parse_text(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.logtext import parse_text_file, year_hint_for

    return parse_text_file(item, year_hint_for(item))


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


PARSERS = {
    "text": _parse_text,
    "text-utf16": _parse_text,
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


def parse_inputs(items: list[InputFile]) -> pl.DataFrame:
    return concat_events(parse_input(item) for item in items)
