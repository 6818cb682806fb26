"""Stage 4, detect (analysis "communicators_confined_to_hosts"): a multi-host job whose NCCL communicators
each live on one host, so the hosts never talked to each other.

NCCL prints every communicator member once at init and at teardown (`comm 0x.. rank R nranks N ...
Init COMPLETE` / `Destroy COMPLETE`). When the job's logs come from several hosts and, on every host,
each communicator size N seen there has all of its ranks 0..N-1 on that same host, while no host
shows a rank of a larger communicator, each host ran a world of its own: mpirun started an nccl-tests
binary built without MPI=1 on each host, or each host's launcher started its own job. A training job's
intra-host sub-groups (tensor parallel inside a node) look the same only without their world
communicator, whose ranks lie on several hosts: one such rank anywhere disqualifies the job.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

_MEMBER = r"\bcomm (0x[0-9a-fA-F]+) rank (\d+) nr?anks (\d+)"
MAX_EVIDENCE = 8


@register("communicators_confined_to_hosts")
def communicators_confined_to_hosts(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    members = communicator_members(events)
    hosts = members.get_column("host").unique().sort().to_list()
    if len(hosts) < 2:
        return findings_frame([])
    per_host = members.group_by("host", "nranks").agg(pl.col("member").unique().len().alias("seen"), pl.col("member").max().alias("top"))
    # Complete on its host: ranks 0..N-1 all seen there (the highest rank is N-1 and N distinct ranks).
    if not per_host.select(((pl.col("seen") == pl.col("nranks")) & (pl.col("top") == pl.col("nranks") - 1)).all()).item():
        return findings_frame([])
    sizes = sorted(set(per_host.get_column("nranks").to_list()))
    first = members.sort("event_id").group_by("host", maintain_order=True).first()
    return findings_frame([finding(
        "nccl-communicators-confined-to-hosts",
        hosts=hosts,
        confidence=0.45,
        summary=(
            f"every NCCL communicator of the {len(hosts)} hosts ({', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''}) has all its "
            f"ranks on one host (size{'s' if len(sizes) > 1 else ''} {', '.join(map(str, sizes))}) and none spans two: independent "
            "single-node runs (nccl-tests built without MPI=1, or each host launched its own job), not one job across the hosts"
        ),
        evidence=first.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])


def communicator_members(events: pl.DataFrame) -> pl.DataFrame:
    """One row per communicator member line with a host (event_id, host, comm, member, nranks)."""
    lines = events.filter(pl.col("kind").is_in(["nccl.comm_init", "nccl.comm_teardown"]) & pl.col("host").is_not_null())
    return lines.select(
        "event_id", "host",
        pl.col("message").str.extract(_MEMBER, 1).alias("comm"),
        pl.col("message").str.extract(_MEMBER, 2).cast(pl.Int64, strict=False).alias("member"),
        pl.col("message").str.extract(_MEMBER, 3).cast(pl.Int64, strict=False).alias("nranks"),
    ).drop_nulls(["member", "nranks"]).filter(pl.col("nranks") > 1)
