"""Stage 4, detect (analysis "nccltests_rank_on_several_hosts"): one nccl-tests output whose device
table lists the same rank on several hosts.

An nccl-tests binary prints, before its results, one `#  Rank  R Group G Pid P on HOST device D ...`
line for every rank of the test it runs. Built with `MPI=1` and started by mpirun, every process
joins one test, and rank 0 is listed once. Built without MPI, each process mpirun starts runs a test
of its own: each prints its own header and its own table, in which it is rank 0 (or ranks 0..g-1 of
its `-g` GPUs). The same rank listed on two hosts in one file is that: independent single-host tests,
so no byte crossed the network and the figures (a 1-rank all-reduce's bus bandwidth is 0) measure
nothing between the hosts.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

MAX_EVIDENCE = 8


@register("nccltests_rank_on_several_hosts")
def nccltests_rank_on_several_hosts(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = events.filter((pl.col("kind") == "nccltests.device") & pl.col("rank").is_not_null() & pl.col("host").is_not_null())
    doubled = (
        table.group_by("file", "rank").agg(pl.col("host").unique().alias("hosts"), pl.col("event_id"))
        .filter(pl.col("hosts").list.len() > 1)
        .sort("file", "rank")
    )
    if doubled.height == 0:
        return findings_frame([])
    first = doubled.row(0, named=True)
    return findings_frame([finding(
        "nccltests-rank-on-several-hosts",
        confidence=0.6,
        summary=(
            f"{first['file']}: the nccl-tests device table lists rank {first['rank']} on {len(first['hosts'])} hosts "
            f"({', '.join(sorted(first['hosts'])[:4])}): each process ran a test of its own (a binary built without MPI=1 "
            "started by mpirun), not one test across the hosts"
        ),
        evidence=doubled.get_column("event_id").explode().head(MAX_EVIDENCE).to_list(),
    )])
