"""Stage 2, parse (text logs): the kind of a line, from its header (NCCL, c10d, glog) and the registry.

`classify` takes a frame of distinct line bodies and adds the header fields (writer, level, time
parts), the message, the vocabulary hit and the `kind` (first registry row that matches wins; a
line with a level but no kind of its own is `c10d.error` / `c10d.warning`). The writer and
timestamp expressions here are shared by aggregation (`repeats.py`) and event building (`fields.py`).
"""

from __future__ import annotations

import polars as pl

from analyzer.parse.line_kinds import LineKind, line_kinds
from analyzer.parse.subsets import captured, spread
from analyzer.parse.vocabulary import BENIGN, with_hits

# --- headers -------------------------------------------------------------------------------------

# `[ts] host:pid:tid [dev] file:line (func) NCCL WARN msg`; old NCCL (2.0-era) omits "NCCL ".
# Pasted logs keep markdown bold (`**NCCL WARN`), so asterisks are tolerated.
_NCCL = (
    r"^\s*(?:\[(?P<nccl_ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] )?"
    # A spliced half-line from another process can precede the host: skip up to a non-host char.
    r"(?:(?:\S*?[^\w.\-<>\s])?(?P<nccl_host>[\w.\-<>]+):(?P<nccl_pid>\d+):(?P<nccl_tid>\d+) (?:\[(?P<nccl_dev>\d+)\] )?"
    r"(?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+ )?(?:\(\w+\) )?\**(?:NCCL )?(?P<nccl_level>INFO|WARN|TRACE|CALL|ERROR)\**\s?(?P<nccl_msg>.*)$"
    # Pasted or redacted lines: `host:XXXXXX [5] ibvwrap.c:262 NCCL WARN`, `include/shm.h:28 NCCL WARN`,
    # `ibvwrap.cc: NCCL WARN`, a bare `NCCL INFO ...`. Without a numeric host:pid:tid the literal
    # `NCCL ` before the level is required.
    r"|(?:(?P<nccl_host_r>[\w.\-<>]+):[Xx*#]{2,}(?::\w+)? )?(?:\[(?P<nccl_dev_r>\d+)\] )?"
    r"(?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d*:? )?\**NCCL (?P<nccl_level_r>INFO|WARN|TRACE|CALL|ERROR)\**\s?(?P<nccl_msg_r>.*)$)"
)
# `[rank0]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] msg`, `[E ProcessGroupNCCL.cpp:458] msg`.
# Searched anywhere in the body: a tqdm bar can precede it on the same line.
_C10D = (
    r"\[(?P<c_level>[IWEF])(?P<c_md>\d{3,4})? ?(?P<c_time>\d\d:\d\d:\d\d(?:\.\d+)?)? ?"
    r"(?P<c_src>[\w.]+\.(?:cpp|hpp|h|cc)):\d+\] (?P<c_msg>.*)$"
)
# glog-style: PyTorch 1.x C++, torchelastic >= 2.4 and XLA (`W1130 14:58:48.527000 2133 torch/.../api.py:1012] msg`),
# and TensorFlow's C++ logging, the same record after a dated clock (`2017-11-15 01:21:03.972724: E
# tensorflow/core/common_runtime/direct_session.cc:138] msg`): its level is `g_sev`, folded into g_level.
_GLOG = (
    r"^(?:(?P<g_level>[IWEF])(?P<g_md>\d{4}) (?P<g_time>\d\d:\d\d:\d\d\.\d+)\s+\d+ "
    r"|(?P<g_year>\d{4})-(?P<g_month>\d\d)-(?P<g_day>\d\d) (?P<g_clock>\d\d:\d\d:\d\d\.\d+): (?P<g_sev>[IWEF]) )"
    r"[\w./\-]+\.(?:cpp|py|cc|h):\d+\] (?P<g_msg>.*)$"
)

# --- line kinds -------------------------------------------------------------------------------------
# The registry (grammars/line_kinds.toml): regex, severity, header family and prefilter literals per
# kind, validated at load. First match wins, so specific kinds precede generic ones.

LINE_KINDS: tuple[LineKind, ...] = line_kinds()
PY_EXCEPTION = next(k.pattern for k in LINE_KINDS if k.kind == "traceback.exception")
KIND_SEVERITY = {k.kind: k.severity for k in LINE_KINDS}
VOCAB_KIND_PREFIX = "vocab."  # a vocabulary hit becomes an event of kind `vocab.<category>`


def vocabulary_kind() -> pl.Expr:
    """A line a vocabulary row knows is also an event of kind `vocab.<category>`.

    The line keeps its own kind too, so signatures written against it still see it. A benign line
    (`vocab.none`, severity info) is a known line that no signature matches.
    """
    return pl.lit(VOCAB_KIND_PREFIX) + pl.col("vocab_category")


def classify(lines: pl.DataFrame) -> pl.DataFrame:
    """`lines` (distinct bodies) plus header fields, message, vocabulary hit and kind.

    What a line is depends on its message and level, not on which process wrote it: NCCL's usual
    header (`host:pid:tid [dev] NCCL INFO`) is split off and each distinct rest is classified once
    (the same `Channel 02/0 : 3[3] -> 4[4] via P2P/IPC` from every rank is one line to classify),
    then each line gets its own writer back."""
    body = lines.get_column("body")
    plain_rows = body.str.contains(_NCCL_PLAIN).arg_true()
    head = body.gather(plain_rows).str.splitn(" ", 3).struct.unnest()
    writer = head.get_column("field_0").str.split_exact(":", 2).struct.unnest()
    writers = pl.DataFrame({
        "nccl_host": writer.get_column("field_0"), "nccl_pid": writer.get_column("field_1"),
        "nccl_tid": writer.get_column("field_2"), "nccl_dev": head.get_column("field_1").str.strip_chars("[]"),
    })
    key = body.scatter(plain_rows, _ANY_WRITER + head.get_column("field_2")) if plain_rows.len() else body
    keyed = pl.DataFrame({"_key": key})
    classified = _classify_bodies(key.unique().to_frame("body")).rename({"body": "_key"})
    frame = pl.concat([lines, keyed.join(classified, on="_key", how="left", maintain_order="left").drop("_key")], how="horizontal")
    own = spread([(plain_rows, writers)], body.len())
    return frame.with_columns(pl.coalesce(own.get_column(c), pl.col(c)).alias(c) for c in own.columns)


_ANY_WRITER = "w:0:0 [0] "  # the header classified in place of each line's own (host:pid:tid [dev])


def _classify_bodies(lines: pl.DataFrame) -> pl.DataFrame:
    body = lines.get_column("body")
    nccl = _nccl_header(body)
    is_nccl = nccl.get_column("nccl_level").is_not_null()
    # Both record headers end in `file:line] `: no other line is worth a capture.
    header_rows = (body.str.contains("] ", literal=True) & ~is_nccl).arg_true()
    frame = pl.concat(
        [
            lines,
            nccl,
            spread([(header_rows, captured(body, header_rows, _C10D))], body.len()),
            spread([(header_rows, _glog_fields(captured(body, header_rows, _GLOG)))], body.len()),
        ],
        how="horizontal",
    )
    message = pl.coalesce("nccl_msg", "c_msg", "g_msg", "body")
    frame = with_hits(frame.with_columns(message.alias("message")), "body")
    return frame.with_columns(pl.coalesce(_first_kind(frame), _level_kind(frame)).alias("kind"))


def _glog_fields(glog: pl.DataFrame) -> pl.DataFrame:
    """One set of glog columns whichever of the two headers a record had (TensorFlow's has the date)."""
    return glog.select(
        pl.coalesce("g_level", "g_sev").alias("g_level"),
        pl.coalesce("g_md", pl.col("g_month") + pl.col("g_day")).alias("g_md"),
        pl.coalesce("g_time", "g_clock").alias("g_time"),
        "g_year",
        "g_msg",
    )


# --- headers, fast path -------------------------------------------------------------------------------
# Rust's regex is slow at capturing: most of all at a long trailing `.*` (measured for issue 19), and a group
# extraction costs ten times a test. So capturing patterns run only on the rows that match them
# (`subsets.py`), and NCCL's usual header (`host:pid:tid [dev] NCCL INFO msg`: no timestamp, source
# file or function) is read by a short pattern. On such a line _NCCL's first branch captures just
# these fields (its optional junk group cannot end inside a `host:pid:tid` token whose host has no
# colon) and the rest of the line after `\**\s?` as the message, which is cut off by a search.
_NCCL_PLAIN = r"^(?P<nccl_host>[\w.\-<>]+):(?P<nccl_pid>\d+):(?P<nccl_tid>\d+) \[(?P<nccl_dev>\d+)\] NCCL (?P<nccl_level>INFO|WARN|TRACE|CALL|ERROR)"
_NCCL_PLAIN_HEAD = _NCCL_PLAIN + r"\**\s?"
_NCCL_GROUPS = ("nccl_ts", "nccl_host", "nccl_pid", "nccl_tid", "nccl_dev", "nccl_level", "nccl_msg")
_NCCL_ALT = ("nccl_host", "nccl_dev", "nccl_level", "nccl_msg")  # `_r`: the second branch's names


def _nccl_header(body: pl.Series) -> pl.DataFrame:
    """_NCCL's fields of every body (null where it has no NCCL header): `_NCCL_GROUPS` columns."""
    is_plain = body.str.contains(_NCCL_PLAIN)
    plain_rows = is_plain.arg_true()
    plain = body.gather(plain_rows).to_frame("_t").select(
        pl.lit(None, dtype=pl.String).alias("nccl_ts"),
        pl.col("_t").str.extract_groups(_NCCL_PLAIN).alias("_h"),
        pl.col("_t").str.replace(_NCCL_PLAIN_HEAD, "").alias("nccl_msg"),
    ).unnest("_h")
    other_rows = (body.str.contains(_NCCL) & ~is_plain).arg_true()
    other = captured(body, other_rows, _NCCL).select(
        *[pl.coalesce(name, f"{name}_r").alias(name) if name in _NCCL_ALT else pl.col(name) for name in _NCCL_GROUPS]
    )
    return spread([(plain_rows, plain.select(_NCCL_GROUPS)), (other_rows, other)], body.len())


# --- line kinds, gated by their literals ---------------------------------------------------------------
# A kind's regex runs only on the messages that hold one of its prefilter literals (the registry
# guarantees they cover it): one Aho-Corasick pass finds which literals each message holds, and
# each kind's regex runs on its own rows. The first kind in registry order that matches wins, as
# if every regex had been tried in turn. An NCCL WARN is known by its header's level, a
# neighbour-only kind (no literals) is tried on every row.
_GATED = [(i, k) for i, k in enumerate(LINE_KINDS) if k.family != "nccl_warn" and k.literals]
_GATE_LITERALS = sorted({lit for _, k in _GATED for lit in k.literals})
_LITERAL_ID = {lit: n for n, lit in enumerate(_GATE_LITERALS)}
_LITERAL_KINDS = pl.DataFrame(
    sorted({(_LITERAL_ID[lit], i) for i, k in _GATED for lit in k.literals}),
    schema={"_lit": pl.UInt32, "_k": pl.UInt32}, orient="row",
)
_UNGATED = [(i, k) for i, k in enumerate(LINE_KINDS) if k.family != "nccl_warn" and not k.literals]
_WARN_KINDS = [i for i, k in enumerate(LINE_KINDS) if k.family == "nccl_warn"]
_KIND_NAMES = pl.Series([k.kind for k in LINE_KINDS], dtype=pl.String)
_NEEDS_NCCL = pl.Series([k.family == "nccl" for k in LINE_KINDS])
_IS_GENERIC = pl.Series([k.generic for k in LINE_KINDS])


def _first_kind(frame: pl.DataFrame) -> pl.Series:
    """The first registry kind that matches each row's message (null: none)."""
    message = frame.get_column("message")
    found = pl.DataFrame(
        {"_r": pl.int_range(frame.height, eager=True, dtype=pl.UInt32), "_lit": message.str.extract_many(_GATE_LITERALS, overlapping=True)}
    ).explode("_lit").drop_nulls()
    pairs = found.with_columns(pl.col("_lit").replace_strict(_LITERAL_ID, return_dtype=pl.UInt32)).join(_LITERAL_KINDS, on="_lit")
    by_kind = pairs.partition_by("_k", as_dict=True)
    hits: list[pl.Series] = []
    for index, kind in _GATED:
        part = by_kind.get((index,))
        if part is not None:
            rows = part.get_column("_r").unique()
            hits.append(_tagged(rows.filter(message.gather(rows).str.contains(kind.pattern)), index))
    for index, kind in _UNGATED:
        hits.append(_tagged(message.str.contains(kind.pattern).arg_true(), index))
    level = frame.get_column("nccl_level")
    for index in _WARN_KINDS:
        hits.append(_tagged((level == "WARN").fill_null(False).arg_true(), index))
    # A line whose writer gave it a level (NCCL, c10d, glog headers) is judged by that level, and a line
    # the benign vocabulary knows is no failure report: neither gets a catch-all (generic) kind.
    not_generic = frame.select(
        pl.coalesce("nccl_level", "c_level", "g_level").is_not_null() | (pl.col("vocab_category") == BENIGN).fill_null(False)
    ).to_series()
    matched = pl.concat(hits)
    row, kind = matched.get_column("_r"), matched.get_column("_k")
    allowed = ~(_NEEDS_NCCL.gather(kind) & level.gather(row).is_null()) & ~(_IS_GENERIC.gather(kind) & not_generic.gather(row))
    first = matched.filter(allowed).group_by("_r").agg(pl.col("_k").min())
    names = _KIND_NAMES.gather(first.get_column("_k")).to_frame("_kind")
    return spread([(first.get_column("_r"), names)], frame.height).to_series()


def _tagged(rows: pl.Series, index: int) -> pl.DataFrame:
    return pl.DataFrame({"_r": rows.cast(pl.UInt32)}).with_columns(pl.lit(index, dtype=pl.UInt32).alias("_k"))


def _level_kind(frame: pl.DataFrame) -> pl.Expr:
    """A c10d or glog record that no kind matched, by its header's level."""
    return (
        pl.when(pl.col("c_level").is_in(["E", "F"]) | pl.col("g_level").is_in(["E", "F"]))
        .then(pl.lit("c10d.error"))
        .when(pl.col("c_level") == "W")
        .then(pl.lit("c10d.warning"))
    )


def writer_columns() -> list[pl.Expr]:
    """The columns naming who wrote a line: host, pid, tid, rank."""
    return [
        pl.coalesce(pl.col("nccl_host"), pl.col("pfx_host")).alias("host"),
        pl.coalesce(pl.col("nccl_pid").cast(pl.Int64, strict=False), pl.col("pfx_pid")).alias("pid"),
        pl.col("nccl_tid").cast(pl.Int64, strict=False).alias("tid"),
        pl.col("pfx_rank").alias("rank"),
    ]


def with_timestamps(frame: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    return frame.with_columns(*timestamp_columns(year_hint))


TIME_COLUMNS = ("nccl_ts", "c_md", "g_md", "c_time", "g_time", "g_year")  # with collector_ts: what `timestamp_columns` reads


def timestamp_columns(year_hint: int) -> tuple[pl.Expr, pl.Expr]:
    """Wall-clock time from whichever header had one, and which header. c10d/glog omit the year:
    `year_hint` fills it (TensorFlow's dated glog header has its own)."""
    nccl_ts = pl.col("nccl_ts").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    md = pl.coalesce("c_md", "g_md").str.zfill(4)
    clock = pl.coalesce("c_time", "g_time")
    year = pl.coalesce("g_year", pl.lit(str(year_hint)))
    c10d_ts = (year + md + pl.lit(" ") + clock.str.slice(0, 15)).str.to_datetime(
        "%Y%m%d %H:%M:%S%.f", strict=False, time_unit="us"
    )
    collector = pl.col("collector_ts").str.replace(",", ".").str.replace("T", " ").str.replace("Z", "")
    collector_ts = collector.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    collector_ts = pl.coalesce(collector_ts, collector.str.to_datetime("%Y-%m-%d %H:%M", strict=False, time_unit="us"))
    return (
        pl.coalesce(nccl_ts, c10d_ts, collector_ts).dt.replace_time_zone("UTC").alias("ts"),
        pl.when(nccl_ts.is_not_null())
        .then(pl.lit("nccl"))
        .when(c10d_ts.is_not_null() & pl.col("g_year").is_not_null())
        .then(pl.lit("glog-dated"))
        .when(c10d_ts.is_not_null())
        .then(pl.lit("c10d-year-inferred"))
        .when(collector_ts.is_not_null())
        .then(pl.lit("collector"))
        .alias("ts_source"),
    )
