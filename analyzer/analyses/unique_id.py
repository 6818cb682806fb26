"""Stage 4, detect (analysis "unique_id_store_timeout"): a rank's store read of the NCCL unique id
that ended in a timeout, naming the rank that had not published it.

ProcessGroupNCCL creates a communicator at a group's first collective: the root writes the NCCL unique
id into the c10d store and every other rank blocks in `store->get`. PyTorch 2.0+ wraps a failed read
as `[R] is setting up NCCL communicator and retrieving ncclUniqueId from [S] via c10d key-value store
by key 'K', but store->get('K') got error: E` (ProcessGroupNCCL.cpp). When E is a timeout, the store
answered and the key was never written: rank S had not reached that collective in time. The line is
written by the waiting rank R; the culprit is S, read from the same line.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label

_TIMED_OUT = (r"\bretrieving ncclUniqueId from \[(\d+)\] via c10d key-value store by key '[^']*', "
              r"but store->get\('[^']*'\) got error: (?:Socket Timeout|[Tt]imeout|[Ww]ait timeout|timed out)")
MAX_EVIDENCE = 8


@register("unique_id_store_timeout")
def unique_id_store_timeout(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    message = pl.col("message").fill_null("")
    hits = (
        events.filter(message.str.contains(_TIMED_OUT))
        .with_columns(message.str.extract(_TIMED_OUT, 1).cast(pl.Int64, strict=False).alias("root"))
        .unique(subset=["file", "line"], keep="first", maintain_order=True)  # one line read by several kinds
    )
    if hits.height == 0:
        return findings_frame([])
    roots = sorted(set(hits.get_column("root").drop_nulls().to_list()))
    waiting = sorted(set(hits.get_column("rank").drop_nulls().to_list()))
    hosts = [job.rank_hosts[r] for r in roots if r in job.rank_hosts]
    who = f" ({ranks_label(waiting)} waiting)" if waiting else ""
    return findings_frame([finding(
        "nccl-unique-id-store-get-timeout",
        ranks=roots,
        hosts=hosts,
        confidence=0.6,
        summary=(f"{hits.height} store read{'s' if hits.height != 1 else ''} of the NCCL unique id timed out{who}: rank "
                 f"{', '.join(map(str, roots))} had not published it (not at its first collective in time): "
                 f"{hits.get_column('message')[0][:300]}"),
        evidence=hits.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])
