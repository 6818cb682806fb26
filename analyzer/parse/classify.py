"""Stage 2, parse (text logs): the kind of a line, from its header (NCCL, c10d, glog) and the registry.

`classify` takes a frame of distinct line bodies and adds the header fields (writer, level, time
parts), the message, the vocabulary hit and the `kind` (first registry row that matches wins; a
line with a level but no kind of its own is `c10d.error` / `c10d.warning`). The writer and
timestamp expressions here are shared by aggregation (`repeats.py`) and event building (`fields.py`).
"""

from __future__ import annotations

import polars as pl

from analyzer.parse.line_kinds import LineKind, line_kinds
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
# glog-style: PyTorch 1.x C++ and torchelastic >= 2.4 (`W1130 14:58:48.527000 2133 torch/.../api.py:1012] msg`).
_GLOG = (
    r"^(?P<g_level>[IWEF])(?P<g_md>\d{4}) (?P<g_time>\d\d:\d\d:\d\d\.\d+)\s+\d+ "
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
    frame = lines.with_columns(pl.col("body").str.extract_groups(_NCCL).alias("_n")).unnest("_n")
    frame = frame.with_columns(
        *[pl.coalesce(name, f"{name}_r").alias(name) for name in ("nccl_host", "nccl_dev", "nccl_level", "nccl_msg")]
    ).drop("nccl_host_r", "nccl_dev_r", "nccl_level_r", "nccl_msg_r")
    is_nccl = pl.col("nccl_level").is_not_null()
    has_c10d_hint = pl.col("body").str.contains("] ", literal=True) & ~is_nccl
    frame = frame.with_columns(
        pl.when(has_c10d_hint).then(pl.col("body").str.extract_groups(_C10D)).alias("_c"),
        pl.when(~is_nccl).then(pl.col("body").str.extract_groups(_GLOG)).alias("_g"),
    ).unnest("_c", "_g")
    message = pl.coalesce("nccl_msg", "c_msg", "g_msg", "body")
    frame = with_hits(frame.with_columns(message.alias("message")), "body")
    # A line whose writer gave it a level (NCCL, c10d, glog headers) is judged by that level, and a line
    # the benign vocabulary knows is no failure report: neither gets a catch-all (generic) kind.
    leveled = pl.coalesce("nccl_level", "c_level", "g_level").is_not_null()
    benign = (pl.col("vocab_category") == BENIGN).fill_null(False)
    not_generic = leveled | benign
    kind_expr = pl.lit(None, dtype=pl.String)
    for line_kind in reversed(LINE_KINDS):
        if line_kind.family == "nccl_warn":
            condition = pl.col("nccl_level") == "WARN"
        elif line_kind.family == "nccl":
            condition = is_nccl & pl.col("message").str.contains(line_kind.pattern)
        else:
            condition = pl.col("message").str.contains(line_kind.pattern)
        if line_kind.generic:
            condition = condition & ~not_generic
        kind_expr = pl.when(condition).then(pl.lit(line_kind.kind)).otherwise(kind_expr)
    level_kind = (
        pl.when(pl.col("c_level").is_in(["E", "F"]) | pl.col("g_level").is_in(["E", "F"]))
        .then(pl.lit("c10d.error"))
        .when(pl.col("c_level") == "W")
        .then(pl.lit("c10d.warning"))
    )
    return frame.with_columns(pl.coalesce(kind_expr, level_kind).alias("kind"))


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


TIME_COLUMNS = ("nccl_ts", "c_md", "g_md", "c_time", "g_time")  # with collector_ts: what `timestamp_columns` reads


def timestamp_columns(year_hint: int) -> tuple[pl.Expr, pl.Expr]:
    """Wall-clock time from whichever header had one, and which header. c10d/glog omit the year:
    `year_hint` fills it."""
    nccl_ts = pl.col("nccl_ts").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    md = pl.coalesce("c_md", "g_md").str.zfill(4)
    clock = pl.coalesce("c_time", "g_time")
    c10d_ts = (pl.lit(str(year_hint)) + md + pl.lit(" ") + clock.str.slice(0, 15)).str.to_datetime(
        "%Y%m%d %H:%M:%S%.f", strict=False, time_unit="us"
    )
    collector = pl.col("collector_ts").str.replace(",", ".").str.replace("T", " ").str.replace("Z", "")
    collector_ts = collector.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    collector_ts = pl.coalesce(collector_ts, collector.str.to_datetime("%Y-%m-%d %H:%M", strict=False, time_unit="us"))
    return (
        pl.coalesce(nccl_ts, c10d_ts, collector_ts).dt.replace_time_zone("UTC").alias("ts"),
        pl.when(nccl_ts.is_not_null())
        .then(pl.lit("nccl"))
        .when(c10d_ts.is_not_null())
        .then(pl.lit("c10d-year-inferred"))
        .when(collector_ts.is_not_null())
        .then(pl.lit("collector"))
        .alias("ts_source"),
    )
