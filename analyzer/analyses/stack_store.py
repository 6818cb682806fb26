"""Stage 4, detect (analysis "stack_store_wait"): a process's main thread blocked reading the c10d store.

A rank whose stack (py-spy or gdb, `stack.thread`) has, among its innermost frames, a read of the
rendezvous store (`c10d::TCPStore::doGet` / `doWait`, `tcputil::recvBytes`, the store-based barrier)
is waiting for a key another process should write: the store's server (rank 0 / MASTER_ADDR) never
came up or failed (an occupied MASTER_PORT), or a peer never reached the rendezvous. The stack says
where the rank waits, not why the key never came, so the finding is the fallback `other`.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label

# Native symbols (gdb, py-spy --native) and Python functions of the store's blocking reads.
_STORE_READ = (
    r"c10d::TCPStore::(?:doGet|doWait|get|wait|check)\b|c10d::tcputil::recv|c10d::PrefixStore::(?:get|wait)\b"
    r"|^_store_based_barrier$|^_wait_for_workers$"
)
# Innermost frames searched: below them the store read is a caller far up, not where the thread blocks.
_INNERMOST = 6
MAX_EVIDENCE = 8


@register("stack_store_wait")
def stack_store_wait(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    waiting = store_waits(events)
    if waiting.height == 0:
        return findings_frame([])
    first = waiting.row(0, named=True)
    ranks = waiting.get_column("rank").drop_nulls().unique().sort().to_list()
    who = ranks_label(ranks) if ranks else first["file"]
    return findings_frame([finding(
        "stack-waits-on-rendezvous-store",
        ranks=ranks,
        hosts=waiting.get_column("host").drop_nulls().unique().to_list(),
        confidence=0.3,
        summary=(
            f"{who}: the main thread is blocked reading the c10d store (`{first['store_frame']}`), waiting for a key "
            "another process should write: the store's server (rank 0 at MASTER_ADDR:MASTER_PORT) did not come up, or "
            "a peer never reached the rendezvous"
        ),
        evidence=waiting.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])


def store_waits(events: pl.DataFrame) -> pl.DataFrame:
    """Main-thread stacks with a store read among their innermost frames (event_id, file, rank, host,
    store_frame), in event order."""
    threads = events.filter((pl.col("kind") == "stack.thread") & pl.col("message").str.starts_with('thread "MainThread"'))
    if threads.height == 0:
        return threads.select("event_id", "file", "rank", "host", pl.lit(None, dtype=pl.String).alias("store_frame"))
    frames = (
        threads.select("event_id", "file", "rank", "host", pl.col("detail").fill_null("").str.split(" <- ").list.head(_INNERMOST).alias("frame"))
        .explode("frame")
        .with_columns(pl.col("frame").str.extract(r"^(.*?) \(", 1).alias("func"))
        .filter(pl.col("func").str.contains(_STORE_READ).fill_null(False))
    )
    return frames.group_by("event_id", maintain_order=True).agg(
        pl.col("file", "rank", "host").first(), pl.col("func").last().alias("store_frame")
    ).sort("event_id")
