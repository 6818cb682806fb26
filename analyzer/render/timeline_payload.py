"""Stage 7, render (HTML timeline data): the timeline frames as the page's script reads them.

`analyzer.render.timeline` decides what the timeline shows; this module turns its frames into a
compact columnar payload (string tables, indices, integer milliseconds) and the text the page's
data element holds (`embedded`: JSON, or gzip+base64 when large), deterministic byte for byte. The drawing
attributes of each marker class (`STYLE`) are shared by the payload and the legend of
`analyzer.render.html`.
"""

from __future__ import annotations

import base64
import gzip
from dataclasses import dataclass

import polars as pl

from analyzer.ranks import format_ranks
from analyzer.render import page
from analyzer.render.timeline import Timeline
from analyzer.render.timeline_marks import CLASSES, PANELS

MAX_TEXT_CHARS = 2000  # of one log line in the payload
MEMBER_TEXT_BUDGET = 1_000_000  # characters of folded members' line texts, in display order
COMPRESS_ABOVE = 256 * 1024  # payload bytes above which it is gzipped (the page inflates it natively)

PANEL_TITLES = {
    "time": "UTC time (all sources on one clock)",
    "order": "line order in lane (no timestamp)",
    "seq": "collective sequence number",
}

# Drawing attributes per marker class: symbol (and its hollow form, for an inferred clock), colour,
# size, the lane sub-row (offset from the lane's centre, in lanes; positive is lower) and what the
# legend says it means. No two classes share a shape or a colour, so the legend reads without
# colour; classes whose lines often share a timestamp (an error, the watchdog timeout, the
# collective state printed with it, the exception raised) sit on different sub-rows.
@dataclass(frozen=True)
class Style:
    symbol: str
    symbol_open: str
    color: str
    size: int
    offset: float
    meaning: str


STYLE: dict[str, Style] = {
    "init": Style("circle", "circle-open", "#2e7d32", 9, 0.0, "NCCL communicator initialised"),
    "step": Style("pentagon", "pentagon-open", "#9e9e9e", 7, 0.0, "a training step or progress line (sampled)"),
    "warning": Style("triangle-up", "triangle-up-open", "#ef8f00", 10, 0.2, "a warning line"),
    "error": Style("x", "x-open", "#d62728", 10, 0.4, "an error line"),
    "watchdog": Style("hourglass", "hourglass-open", "#6a1b9a", 11, -0.2,
                      "NCCL watchdog: a collective timed out, or the watchdog's heartbeat stopped"),
    "exception": Style("star", "star-open", "#7f0000", 12, 0.2, "a Python exception or a failed child process"),
    "collective": Style("diamond", "diamond-open", "#1f77b4", 9, -0.4, "collective state printed (pg status, desync report)"),
    "last": Style("triangle-right", "triangle-right-open", "#263238", 10, 0.0, "the last line the file logged"),
    "evidence": Style("circle-cross", "circle-cross-open", "#8d6e63", 9, 0.0, "a line a finding cites, of no class above"),
    "coll.completed": Style("square", "square-open", "#0d47a1", 9, -0.4, "the last collective the lane completed"),
    "coll.enqueued": Style("triangle-down", "triangle-down-open", "#17a2b8", 10, 0.4,
                           "the last collective the lane enqueued"),
    "coll.waiting": Style("hexagon", "hexagon-open", "#e91e63", 11, 0.0,
                          "the collective the lane waits in or timed out in"),
}


def present_classes(timeline: Timeline) -> list[str]:
    """Marker classes drawn in this report (lanes or folded members), in legend order."""
    drawn = set(timeline.markers.get_column("cls").unique().to_list()) | set(timeline.members.get_column("cls").unique().to_list())
    return [c for c in CLASSES if c in drawn]


def _table(frame: pl.DataFrame, column: str) -> tuple[list[str], pl.Expr]:
    """A sorted string table for `column` and the expression giving each row's index in it."""
    values = frame.get_column(column).drop_nulls().unique().sort()
    return values.to_list(), pl.col(column).cast(pl.Enum(values.to_list())).to_physical().cast(pl.Int32)


def _index_in(column: str, values: list[str]) -> pl.Expr:
    """Each row's index of `column` in the sorted string table `values`."""
    return pl.col(column).cast(pl.Enum(values)).to_physical().cast(pl.Int32)


def columns(frame: pl.DataFrame) -> dict[str, list]:
    return {name: frame.get_column(name).to_list() for name in frame.columns}


def _line_text() -> pl.Expr:
    return pl.col("text").fill_null(pl.col("message")).fill_null("").str.slice(0, MAX_TEXT_CHARS)


def _hovered_events(markers: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """One row per event a lane marker points at (`_e` its index), with its line text."""
    return (
        markers.select("event_id").unique().join(events, on="event_id", how="left")
        .with_columns(_line_text().alias("text"))
        .sort("event_id")
        .with_row_index("_e")
    )


def _member_rows(members: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Folded units' own markers with file, line, kind and text inline."""
    return (
        members.join(events.select("event_id", "file", "line", "kind", "text", "message"), on="event_id", how="left",
                     maintain_order="left")
        .with_columns(_line_text().alias("text"))
        # Members' line texts in display order while the budget lasts; the rest say where to look.
        .with_columns(pl.when(pl.col("text").str.len_chars().cum_sum() <= MEMBER_TEXT_BUDGET).then(pl.col("text")).alias("text"))
    )


def _marker_columns(markers: pl.DataFrame, hovered: pl.DataFrame, common: list[pl.Expr]) -> pl.DataFrame:
    single = pl.col("count") == 1
    return markers.join(hovered.select("event_id", "_e"), on="event_id", how="left", maintain_order="left").select(
        "lane", "x",
        pl.when(single).then(None).otherwise(pl.col("lo")).alias("lo"),
        pl.when(single).then(None).otherwise(pl.col("hi")).alias("hi"),
        "count", pl.col("_e").alias("e"), *common,
    )


def _time_origin(markers: pl.DataFrame, members: pl.DataFrame) -> float:
    """The earliest time on the time panel: members' times are integer ms after it."""
    t0 = pl.concat([markers.filter(pl.col("panel") == "time").get_column("lo"),
                    members.filter(pl.col("panel") == "time").get_column("x")]).min()
    return float(t0) if t0 is not None else 0.0


def timeline_payload(timeline: Timeline, events: pl.DataFrame) -> dict:
    """The timeline frames as the page's script reads them: columns of numbers plus string tables.

    Lane markers point into `events` (one row per hovered event, with its text). Folded units'
    own markers (`members`, the data behind "expand") carry file, line, kind and text index
    inline, and times as integer ms after `t0`: at 16k ranks they are most of the payload.
    """
    lanes, markers, members = timeline.lanes, timeline.markers, timeline.members
    panels = [p for p in PANELS if markers.filter(pl.col("panel") == p).height]
    panel_ids = {p: i for i, p in enumerate(panels)}
    classes = present_classes(timeline)
    class_ids = {c: i for i, c in enumerate(classes)}
    hovered = _hovered_events(markers, events)
    member_rows = _member_rows(members, events)
    both = pl.concat([hovered.select("file", "kind", "text"), member_rows.select("file", "kind", "text")])
    files, file_idx = _table(both, "file")
    kinds, kind_idx = _table(both, "kind")
    texts, text_idx = _table(both, "text")
    sources, src_idx = _table(hovered, "ts_source")
    hosts = (
        pl.concat([hovered.get_column("host"), timeline.units.get_column("host"), lanes.get_column("host")])
        .drop_nulls().unique().sort().to_list()
    )
    ops = pl.concat([markers.get_column("op"), members.get_column("op")]).drop_nulls().unique().sort().to_list()
    all_groups = pl.concat([markers.get_column("group"), members.get_column("group")]).drop_nulls().unique().sort()
    groups = all_groups.filter(all_groups != "").to_list()
    common = [
        pl.col("panel").replace_strict(panel_ids, return_dtype=pl.Int32).alias("panel"),
        pl.col("cls").replace_strict(class_ids, return_dtype=pl.Int32).alias("cls"),
        pl.col("evidence").alias("ev"),
        pl.col("inferred").cast(pl.Int8).alias("inf"),
        _index_in("op", ops).alias("op"),
        pl.when(pl.col("group") != "").then(pl.col("group")).cast(pl.Enum(groups)).to_physical().cast(pl.Int32).alias("group"),
    ]
    t0 = _time_origin(markers, members)
    unit_index = members.select("unit", "unit_order", "lane").unique().sort("unit_order").with_row_index("_u")
    units = unit_index.join(timeline.units.select("unit", "unit_label", "host"), on="unit", how="left").sort("_u")
    member_cols = member_rows.join(unit_index.select("unit", "_u"), on="unit", how="left", maintain_order="left").select(
        pl.col("_u").alias("unit"),
        pl.when(pl.col("panel") == "time").then((pl.col("x") - t0).round(0)).otherwise(pl.col("x")).cast(pl.Int64).alias("x"),
        file_idx.alias("file"), "line", kind_idx.alias("kind"), text_idx.alias("text"), *common,
    )
    event_cols = hovered.select(
        file_idx.alias("file"), "line", "rank", _index_in("host", hosts).alias("host"), kind_idx.alias("kind"),
        (pl.col("ts").dt.epoch("us") / 1000.0).alias("ts"), src_idx.alias("src"), text_idx.alias("text"),
    )
    lane_cols = lanes.select(
        "label", "state", _index_in("host", hosts).alias("host"), pl.col("hosts").list.len().alias("hosts"),
        "units", "unit_type", "culprit", "folded",
    )
    return {
        "panels": [{"id": p, "title": PANEL_TITLES[p], "axis": "x" if i == 0 else f"x{i + 1}"} for i, p in enumerate(panels)],
        "classes": [
            {"id": c, "name": CLASSES[c], "symbol": STYLE[c].symbol, "symbol_open": STYLE[c].symbol_open,
             "color": STYLE[c].color, "size": STYLE[c].size, "dy": STYLE[c].offset}
            for c in classes
        ],
        "lanes": columns(lane_cols),
        "markers": columns(_marker_columns(markers, hovered, common)),
        "events": columns(event_cols),
        "t0": t0,
        "members": columns(member_cols),
        "units": columns(units.select(pl.col("unit_label").alias("label"), _index_in("host", hosts).alias("host"), "lane")),
        "files": files,
        "hosts": hosts,
        "kinds": kinds,
        "sources": sources,
        "inferred": ["inferred" in source for source in sources],  # as timeline.classify decides
        "texts": texts,
        "ops": ops,
        "groups": groups,
        "stats": timeline.stats,
    }


def inputs_payload(inputs: list[dict]) -> dict:
    return {
        "file": [i["file"] for i in inputs],
        "format": [i["format"] for i in inputs],
        "ranks": [format_ranks(i["ranks"]) for i in inputs],
        "lines": [i["lines"] for i in inputs],
        "unparsed": [i["unparsed_lines"] for i in inputs],
        "status": [i["status"] for i in inputs],
        "reason": [i["reason"] for i in inputs],
    }


def embedded(payload: dict) -> dict:
    """The payload as the page's data element holds it: `{"encoding": None, "text": JSON}` (safe
    inside a script element), or gzip+base64 above COMPRESS_ABOVE bytes (the page inflates it natively)."""
    raw = page.json_text(payload)
    if len(raw) > COMPRESS_ABOVE:
        packed = base64.b64encode(gzip.compress(raw.encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii")
        return {"encoding": "gzip-base64", "text": packed}
    return {"encoding": None, "text": page.script_safe(raw)}
