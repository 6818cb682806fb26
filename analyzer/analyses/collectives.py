"""Stage 4, detect (a view, not a signature): each rank's collectives aligned by sequence number.

What fr_trace users read when they debug a hang: per process group, one row per sequence number,
one cell per rank (op, element count, dtype, state), and the first sequence number where the ranks
part ways marked. Built on the observations the progress matrix already derives (Flight Recorder
entries and watchdog timeouts), so both read a collective the same way. Returns frames; the
renderer draws them.
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from analyzer.analyses.mismatch import SIZED_FAMILIES
from analyzer.analyses.progress import collective_observations, collective_progress

# A divergence is named by what differs: the call itself, or a rank that never made it.
MISMATCH = "mismatch"
MISSING = "missing"


def collective_table(events: pl.DataFrame, ranks: Iterable[int] = (), pgs: Iterable[str] = ()) -> pl.DataFrame:
    """One row per (pg, seq, rank) sighting: op, numel_in, numel_out, dtype, state, src.

    At one (pg, seq, rank) a dump entry (sizes, dtype, state) is preferred over a watchdog line.
    `ranks` / `pgs` keep only those (empty: all).
    """
    observations = collective_observations(events)
    ranks, pgs = list(ranks), [str(p) for p in pgs]
    if ranks:
        observations = observations.filter(pl.col("rank").is_in(ranks))
    if pgs:
        observations = observations.filter(pl.col("pg").is_in(pgs))
    return (
        observations.sort("pg", "seq", "rank", pl.col("src") != "fr", "event_id")
        .unique(["pg", "seq", "rank"], keep="first", maintain_order=True)
        .select("pg", "seq", "rank", "op", "family", "numel_in", "numel_out", "dtype", "state", "src")
    )


def divergences(table: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Per (pg, seq) where ranks part ways: kind (mismatch / missing), the ranks concerned, whether
    no majority call exists (`tied`: the ranks listed are all those seen), and a first flag.

    `mismatch`: ranks seen at the seq disagree on op, or on dtype, or (for ops whose sizes must
    agree) on element count. `missing`: a member of the group whose last enqueued collective is below
    the seq never called it. A rank whose ring buffer no longer holds the seq is not missing.
    """
    if not table.height:
        return pl.DataFrame(schema={"pg": pl.String, "seq": pl.Int64, "kind": pl.String, "ranks": pl.List(pl.Int64),
                                    "tied": pl.Boolean, "first": pl.Boolean})
    progress = collective_progress(events).select("pg", "rank", "enq")
    span = table.group_by("pg", "rank").agg(pl.col("seq").min().alias("lo"), pl.col("seq").max().alias("hi"))
    members = span.join(progress, on=["pg", "rank"], how="left").with_columns(
        pl.max_horizontal("hi", "enq").alias("enq"))
    seqs = table.select("pg", "seq").unique()
    absent = (
        seqs.join(members, on="pg", how="inner")
        .join(table.select("pg", "seq", "rank"), on=["pg", "seq", "rank"], how="anti")
        .filter(pl.col("enq") < pl.col("seq"))
        .group_by("pg", "seq").agg(pl.col("rank").sort().alias("ranks"))
        .with_columns(pl.lit(MISSING).alias("kind"))
    )
    signature = pl.concat_str(
        pl.col("family").fill_null("?"), pl.col("dtype").fill_null("?"),
        pl.when(pl.col("family").is_in(SIZED_FAMILIES)).then(pl.col("numel_in").cast(pl.String)).fill_null("-"),
        separator="|",
    )
    disagree = (
        table.with_columns(signature.alias("signature"))
        .group_by("pg", "seq")
        .agg(
            pl.col("signature").n_unique().alias("variants"),
            (pl.col("signature").mode().len() > 1).alias("tied"),
            # The ranks outside the most common call at this seq are the ones that diverged; with no
            # majority (two ranks, two calls) every rank seen is listed: nothing says who is wrong.
            pl.col("rank").filter(pl.col("signature") != pl.col("signature").mode().sort().first()).sort().alias("outliers"),
            pl.col("rank").sort().alias("seen"),
        )
        .filter(pl.col("variants") > 1)
        .with_columns(pl.when(pl.col("tied")).then(pl.col("seen")).otherwise(pl.col("outliers")).alias("ranks"))
        .with_columns(pl.lit(MISMATCH).alias("kind"))
    )
    found = pl.concat([disagree.select("pg", "seq", "kind", "ranks", "tied"),
                       absent.select("pg", "seq", "kind", "ranks", pl.lit(False).alias("tied"))])
    return found.sort("pg", "seq", "kind").with_columns(
        (pl.col("seq") == pl.col("seq").min().over("pg")).alias("first"))


def shown_ranks(table: pl.DataFrame, found: pl.DataFrame, limit: int) -> list[int]:
    """The rank columns worth showing when there are more than `limit`: the diverging ranks first,
    then the lowest others (one of the majority is enough to compare against)."""
    every = sorted(set(table["rank"].to_list()))
    if len(every) <= limit:
        return every
    diverging = sorted(set(found.explode("ranks")["ranks"].drop_nulls().to_list())) if found.height else []
    chosen = diverging[:limit]
    chosen += [r for r in every if r not in chosen][: max(0, limit - len(chosen))]
    return sorted(chosen)
