"""Stage 4, detect (cross-rank analysis "duplicate_global_ranks"): the launcher gave two processes the
same global rank, so the ranks above them never join.

Reads the framework's own announcement of each process's place in the world (`lightning.member`:
`initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8`). Every process writes it once; the same global rank
announced by two processes while ranks of the announced world size are never announced means the
nodes computed the same node rank (the scheduler's node count or tasks per node do not match the
trainer's num_nodes / devices): the rendezvous waits for ranks that no process holds.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label

_MEMBER = r"GLOBAL_RANK: (\d+), MEMBER: \d+/(\d+)"
MAX_EVIDENCE = 8


@register("duplicate_global_ranks")
def duplicate_global_ranks(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    members = events.filter(pl.col("kind") == "lightning.member").select(
        "event_id",
        pl.col("repeat").fill_null(1).alias("n"),
        pl.col("message").str.extract(_MEMBER, 1).cast(pl.Int64, strict=False).alias("global_rank"),
        pl.col("message").str.extract(_MEMBER, 2).cast(pl.Int64, strict=False).alias("world"),
    ).drop_nulls(["global_rank", "world"])
    if members.height == 0 or members.get_column("world").n_unique() != 1:
        return findings_frame([])
    world = members.get_column("world")[0]
    counts = members.group_by("global_rank").agg(pl.col("n").sum(), pl.col("event_id").min()).sort("global_rank")
    twice = counts.filter(pl.col("n") > 1)
    missing = sorted(set(range(world)) - set(counts.get_column("global_rank").to_list()))
    if twice.height == 0 or not missing:
        return findings_frame([])
    dup = twice.get_column("global_rank").to_list()
    return findings_frame([finding(
        "launcher-duplicate-global-ranks",
        ranks=missing,
        confidence=0.6,
        summary=(
            f"global {ranks_label(dup)} of a {world}-process world {'were' if len(dup) > 1 else 'was'} "
            f"announced by more than one process and {ranks_label(missing)} by none: "
            "the nodes took the same node rank, so the ranks above them never join"
        ),
        evidence=members.sort("event_id").get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])
