"""Detect-stage analysis (part of stage 4, detect): NCCL's bootstrap failing over an IPoIB interface.

`bootstrap_over_ipoib`: NCCL's bootstrap failed in its sockets while its bootstrap (out-of-band)
interface is an IPoIB one. Unless NCCL_SOCKET_IFNAME says otherwise NCCL prefers `ib*` interfaces for
its TCP bootstrap (NCCL's socket interface selection); IPoIB addresses are often not routed between
containers or hosts, so the choice of interface, which the failing socket call cannot name, is the
cause (NVIDIA/nccl's troubleshooting: "only NCCL_SOCKET_IFNAME matters" for the bootstrap).
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

MAX_EVIDENCE = 12

# The interface NCCL's bootstrap uses, as `Bootstrap : Using [0]ib0:10.1.0.3<0>` or the `OOB
# ibp75s0:192.168.0.103<0>` tail of the `NET/IB : Using` line (2.1x), when it is an IPoIB interface
# (`ib0`, `ib0.8001`, `ibp75s0`, `ibs1`).
_IPOIB_BOOTSTRAP = r"(?:Bootstrap ?: ?Using (?:\[\d+\])?|\bOOB )(ib(?:\d|p\d|s\d)[\w.]*):"
# NCCL's bootstrap failing: its error chain through bootstrap.cc (`bootstrap.cc:270 -> 2`) or a
# WARN naming the bootstrap.
_BOOTSTRAP_FAILED = r"^bootstrap\.cc:\d+ -> [1-9]|[Bb]ootstrap"


@register("bootstrap_over_ipoib")
def bootstrap_over_ipoib(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    kind, message = pl.col("kind"), pl.col("message").fill_null("")
    chosen = events.filter((kind == "nccl.net") & message.str.contains(_IPOIB_BOOTSTRAP))
    failed = events.filter(kind.is_in(["nccl.error_chain", "nccl.warn"]) & message.str.contains(_BOOTSTRAP_FAILED))
    if chosen.height == 0 or failed.height == 0:
        return findings_frame([])
    interface = chosen.get_column("message").str.extract(_IPOIB_BOOTSTRAP, 1)[0]
    hosts = failed.get_column("host").drop_nulls().unique().sort().to_list()
    return findings_frame([finding(
        "nccl-bootstrap-over-ipoib",
        hosts=hosts,
        ranks=failed.get_column("rank").drop_nulls().unique().to_list(),
        confidence=0.6,
        summary=f"NCCL's bootstrap uses the IPoIB interface {interface} and failed in its sockets "
                f"({failed.get_column('message')[0][:120]}): that interface does not connect the ranks",
        evidence=[*failed.get_column("event_id").head(MAX_EVIDENCE).to_list(), chosen.get_column("event_id")[0]],
    )])
