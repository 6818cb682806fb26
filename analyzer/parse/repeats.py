"""Stage 2, parse (text logs): alike kept lines of one writer become one event (issues 18, 19).

NCCL prints one connection line per channel and peer, and a looping writer can repeat a line
millions of times; the lines of one writer, communicator and connection (or one verbatim line past
its first REPEATS_KEPT) are aggregated on narrow keys before any costly field is extracted, so
events grow with communicators, not with channels or repeats.
"""

from __future__ import annotations

import polars as pl

from analyzer.parse.classify import LINE_KINDS, timestamp_columns, writer_columns

# Kinds whose lines differ only in a part that says nothing (the channel number): that part's regex.
COLLAPSE = {k.kind: k.collapse for k in LINE_KINDS if k.collapse}
# A communicator's set-up starts and ends with these lines: connection lines between two of them in
# one writer's stream belong to one communicator (the connection lines themselves do not name it).
_COMM_BOUNDARY_KINDS = ("nccl.comm_init", "nccl.topology", "nccl.comm_teardown")
# A line of any other kind repeated verbatim keeps its first few as events of their own (a summary
# counting matching lines reads the same); the rest of the run becomes one event that counts them.
REPEATS_KEPT = 8


# NCCL's per-channel connection line under its usual header, nothing spliced into it: the same
# connection on every channel is aggregated as it is read (`collapse_connection_lines`), before
# any prefix is peeled or any body classified. Only lines that `nccl.transport` reads and collapses
# match, and only its collapse part (the channel) is ignored, so what collapse_repeats would
# merge later is merged earlier, on one regex and a group-by.
_CONNECTION_LINE = (
    r"^[\w.\-<>]+:\d+:\d+ \[\d+\] NCCL INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-fA-F]+\] -> \d+\[[0-9a-fA-F]+\] "
    r"(?:\[(?:send|receive)\] )?via (?:P2P|SHM|NET|COLLNET)[^\[\]]*$"
)
_CONNECTION_SCREEN = " NCCL INFO Channel "
_CHANNEL_PART = r" Channel \d+(?:/\d+)? : "
PRE_COLLAPSED = ("_pre_n", "_pre_last")  # lines a row stands for, and the last of them (null: itself)


def collapse_connection_lines(lines: pl.DataFrame) -> pl.DataFrame:
    """`lines` (one batch, in file order, with `_fid`, `line` and `text`) with each run of one
    writer's connection lines that differ only in the channel reduced to its first line, which
    gains PRE_COLLAPSED; every other line keeps `_pre_n` 1. A run is cut by any other line, so no
    run crosses a communicator's boundary lines; the writer's header is part of the key."""
    text = pl.col("text")
    flagged = lines.with_row_index("_pre_at").with_columns(
        (text.str.contains(_CONNECTION_SCREEN, literal=True) & text.str.contains(_CONNECTION_LINE)).alias("_conn")
    )
    connections = flagged.select(
        "_pre_at", "_fid", "line", (~pl.col("_conn")).cum_sum().alias("_run"), text.str.replace(_CHANNEL_PART, " ").alias("_key"),
        "_conn",
    ).filter("_conn")
    if connections.height == 0:
        return lines.with_columns(pl.lit(1, dtype=pl.Int64).alias("_pre_n"), pl.lit(None, dtype=pl.Int64).alias("_pre_last"))
    runs = connections.group_by("_fid", "_run", "_key").agg(
        pl.col("_pre_at").first(), pl.len().cast(pl.Int64).alias("_pre_n"), pl.col("line").last().cast(pl.Int64).alias("_pre_last"),
    )
    kept = flagged.join(runs.select("_pre_at", "_pre_n", "_pre_last"), on="_pre_at", how="left", maintain_order="left")
    return kept.filter(~pl.col("_conn") | pl.col("_pre_n").is_not_null()).select(
        pl.exclude("_pre_at", "_conn", *PRE_COLLAPSED),
        pl.col("_pre_n").fill_null(1),
        pl.when(pl.col("_pre_n") > 1).then(pl.col("_pre_last")).alias("_pre_last"),
    )


def same_message() -> pl.Expr:
    """A 64-bit hash of the message without its kind's collapse part: lines that say one thing."""
    kind = pl.col("kind")
    same = pl.col("message")
    for name, pattern in COLLAPSE.items():  # one branch per registry row, not per line
        same = pl.when(kind == name).then(pl.col("message").str.replace(pattern, "")).otherwise(same)
    return same.hash()


def repeat_keys(year_hint: int) -> list[pl.Expr]:
    """Narrow keys of a classified line for `collapse_repeats`: a 64-bit hash of its writer (file,
    host, pid, tid, rank), whether it opens a communicator, how many of a run stay events of their
    own, and its time (with `_same`, from `same_message`)."""
    kind = pl.col("kind")
    return [
        pl.struct("file", *writer_columns()).hash().alias("_stream"),
        kind.is_in(_COMM_BOUNDARY_KINDS).alias("_boundary"),
        pl.when(kind.is_in(list(COLLAPSE))).then(0).otherwise(REPEATS_KEPT).alias("_kept_alone"),
        timestamp_columns(year_hint)[0].alias("ts"),
        "_same",
    ]


def collapse_repeats(keys: pl.DataFrame) -> pl.DataFrame:
    """Which kept lines stay events: alike lines of one writer and communicator become one, the
    first line's, with `repeat` (how many lines it stands for), `last_line` and `last_ts`; evidence
    still cites a real line. Takes `repeat_keys` rows (with `_row`, `_class`, `line`, `part`, `kind`
    and PRE_COLLAPSED: a row that already stands for several lines counts them all),
    returns the survivors' `_row`, `_class` and `kind` in input order with the three columns (null:
    one line).

    A communicator is the stretch of one writer's stream between two boundary lines (`Init START`,
    the `nRanks nNodes` line, teardown): connection lines do not name theirs. Collapsible kinds
    are compared without their collapse part (one event per connection and transport, whatever the
    channel count); any other kind only verbatim, and only past its first REPEATS_KEPT lines.
    A hash collision would merge two rows' counts, at odds of about n^2 / 2^64.
    """
    keys = keys.with_row_index("_pos")
    # Within one stream, file order is line order (the vocabulary's rows come after the lines).
    keys = keys.sort("_stream", "line", "part").with_columns(pl.col("_boundary").cum_sum().over("_stream").alias("_comm"))
    group = ["_stream", "_comm", "kind", "_same"]
    keys = keys.with_columns((pl.int_range(pl.len()).over(group) < pl.col("_kept_alone")).alias("_alone"))
    several_lines = pl.col("_pre_n") > 1
    alone = keys.filter(pl.col("_alone")).select(
        "_pos", "_row", "_class", "kind",
        pl.when(several_lines).then(pl.col("_pre_n")).alias("repeat"),
        pl.when(several_lines).then(pl.col("_pre_last")).alias("last_line"),
    )
    merged = keys.filter(~pl.col("_alone")).group_by(group).agg(
        pl.col("_pos", "_row", "_class").first(),
        pl.col("_pre_n").sum().alias("_n"),
        pl.coalesce("_pre_last", "line").max().alias("last_line"),
        pl.col("ts").drop_nulls().last().alias("last_ts"),
    )
    several = pl.col("_n") > 1
    merged = merged.select(
        "_pos", "_row", "_class", "kind",
        pl.when(several).then(pl.col("_n")).alias("repeat"),
        pl.when(several).then(pl.col("last_line")).alias("last_line"),
        pl.when(several).then(pl.col("last_ts")).alias("last_ts"),
    )
    return pl.concat([alone, merged], how="diagonal").sort("_pos").drop("_pos")


def merge_split_groups(events: pl.DataFrame) -> pl.DataFrame:
    """Events of files read in several batches, with the collapsed groups that a batch boundary cut
    merged again: one event per writer, communicator and connection, as if the file had been one
    batch (`collapse_repeats` sees one batch at a time). The first event stays, counting the lines
    of all parts; events of other kinds pass through. Takes and returns events in (file, line) order.
    """
    events = events.sort("file", "line", maintain_order=True).with_row_index("_pos")
    stream = ["file", "host", "pid", "tid", "rank"]
    kind = pl.col("kind")
    keyed = events.select(
        "_pos", *stream, "kind", "line", "ts", "repeat", "last_line", "last_ts",
        kind.is_in(_COMM_BOUNDARY_KINDS).cum_sum().over(stream).alias("_comm"),
        same_message().alias("_same"),
    ).filter(kind.is_in(list(COLLAPSE)))
    group = [*stream, "_comm", "kind", "_same"]
    merged = keyed.group_by(group).agg(
        pl.col("_pos").first(),
        pl.col("repeat").fill_null(1).sum().alias("_n"),
        pl.coalesce("last_line", "line").max().alias("_last_line"),
        pl.coalesce("last_ts", "ts").drop_nulls().last().alias("_last_ts"),
        pl.len().alias("_parts"),
    ).filter(pl.col("_parts") > 1)
    if merged.height == 0:
        return events.drop("_pos")
    dropped = keyed.join(merged.select(group), on=group, how="semi", nulls_equal=True).filter(
        ~pl.col("_pos").is_in(merged.get_column("_pos").implode())
    )
    fixed = events.filter(~pl.col("_pos").is_in(dropped.get_column("_pos").implode())).join(
        merged.select("_pos", "_n", "_last_line", "_last_ts"), on="_pos", how="left"
    )
    return fixed.with_columns(
        pl.coalesce(pl.col("_n").cast(pl.Int64), "repeat").alias("repeat"),
        pl.coalesce(pl.col("_last_line").cast(pl.Int64), "last_line").alias("last_line"),
        pl.coalesce("_last_ts", "last_ts").alias("last_ts"),
    ).sort("_pos").drop("_pos", "_n", "_last_line", "_last_ts")
