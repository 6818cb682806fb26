"""Stage 4, detect (cross-rank analysis "store_wait"): a rendezvous store that answered and waited for a
participant that never came.

c10d's TCPStore raises `wait timeout after <ms>ms, keys: <key>[, <key>...]` when a key it waits for is
never set, and its server `Timed out after <s> seconds waiting for clients. <n>/<m> clients joined.`
when fewer clients than the world connected. A key never set means the store answered and a rank never
joined; too few clients means a node's agent or a rank never connected, which its own log tells apart
(a connection failure is another text, `client socket has timed out ... while trying to connect`,
`connect() timed out`, `Connection refused`, whose signatures name this one in `cause_of`, so beside it
the network is the verdict). The key names who: each process group's
keys live under `<...>/default_pg/<group>/` and its backend's `<device type>/` prefix
(torch/distributed/distributed_c10d.py's PrefixStores), and

* Gloo's full-mesh rendezvous (gloo/rendezvous/context.cc, under ProcessGroupGloo's per-device prefix
  `<device index>/`) has every rank set the key of its own rank (`.../cpu//0/1`: device 0, rank 1)
  and wait for everyone else's: the writer is the rank that never arrived.
* ProcessGroupNCCL's unique-id broadcast (`broadcastUniqueNCCLID`) keys each communicator by its
  counter (`.../cuda//0`), set by the group's rank 0; a point-to-point pair's key is
  `<low rank>:<high rank>`, set by the low rank.

Only the default group's ranks are global ranks (`default_pg/0/`; older releases leave the group name
empty), so a subgroup's key names its rank in the summary only. Store-based-barrier timeouts carry a
count, not a key of a rank, and are read by their vocabulary row.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

RULE = "store-wait-rank-absent"
MAX_EVIDENCE = 8
_WAIT = r"[Ww]ait timeout after (\d+) ?ms, keys: (.+?)\s*$"
_CLIENTS = r"waiting for clients\. (\d+)/(\d+) clients joined"
_BARRIER = "store_based_barrier_key"
# Group name between `default_pg/` and the backend's device prefix; `0` (or empty before 2.0) is the default group.
_GROUP = r"default_pg/+([^/]*)/+(?:cpu|cuda)/"
# The rank a key's writer has in its group: Gloo (`<dev>/<writer>`), NCCL p2p, NCCL unique id.
_GLOO_WRITER = r"/(?:cpu|cuda)//\d+/(\d+)$"
_P2P_WRITER = r"/cuda//(\d+):\d+$"
_NCCL_ID = r"/cuda//\d+$"
_DEFAULT_GROUPS = ["0", ""]


@register("store_wait")
def store_wait(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    stores = events.filter(pl.col("kind") == "c10d.store_error").select("event_id", "rank", "message")
    waits = stores.filter(pl.col("message").str.contains(_WAIT) & ~pl.col("message").str.contains(_BARRIER))
    clients = stores.filter(pl.col("message").str.contains(_CLIENTS))
    if waits.height == 0 and clients.height == 0:
        return findings_frame([])
    keys = _keys(waits)
    named = keys.filter(pl.col("default_group")).get_column("writer").drop_nulls().unique().sort().to_list()
    summary = "; ".join(part for part in (_wait_summary(keys, waits), _clients_summary(clients)) if part)
    evidence = pl.concat([waits.get_column("event_id"), clients.get_column("event_id")]).sort()
    return findings_frame([finding(RULE, ranks=named, confidence=0.6, summary=summary,
                                   evidence=evidence.head(MAX_EVIDENCE).to_list())])


def _keys(waits: pl.DataFrame) -> pl.DataFrame:
    """One row per distinct waited-for key: its group (default or not) and the group rank that writes it."""
    key = pl.col("key")
    return (
        waits.select("rank", pl.col("message").str.extract(_WAIT, 2).str.split(", ").alias("key"))
        .explode("key")
        .with_columns(key.str.strip_chars())
        .unique("key", maintain_order=True)
        .with_columns(
            key.str.extract(_GROUP, 1).is_in(_DEFAULT_GROUPS).fill_null(False).alias("default_group"),
            pl.coalesce(
                key.str.extract(_GLOO_WRITER, 1).cast(pl.Int64, strict=False),
                key.str.extract(_P2P_WRITER, 1).cast(pl.Int64, strict=False),
                pl.when(key.str.contains(_NCCL_ID)).then(pl.lit(0, dtype=pl.Int64)),
            ).alias("writer"),
        )
    )


def _wait_summary(keys: pl.DataFrame, waits: pl.DataFrame) -> str:
    if keys.height == 0:
        return ""
    timeout = waits.get_column("message").str.extract(_WAIT, 1).drop_nulls().head(1).to_list()
    waiters = sorted(waits.get_column("rank").drop_nulls().unique().to_list())
    who = f"rank {', '.join(map(str, waiters))}" if waiters else "a rank"
    shown = ", ".join(keys.get_column("key").head(4).to_list())
    text = f"{who} waited {timeout[0] if timeout else '?'} ms in the rendezvous store for key {shown}, which was never set"
    writers = keys.filter(pl.col("writer").is_not_null())
    if writers.height:
        scope = "" if writers.get_column("default_group").all() else " (of its process group)"
        ranks = ", ".join(map(str, writers.get_column("writer").unique().sort().to_list()))
        text += f": the key is written by rank {ranks}{scope} when it joins, so it never joined"
    return text


def _clients_summary(clients: pl.DataFrame) -> str:
    counts = clients.select(pl.col("message").str.extract(_CLIENTS, 1).cast(pl.Int64, strict=False).alias("joined"),
                            pl.col("message").str.extract(_CLIENTS, 2).cast(pl.Int64, strict=False).alias("expected"))
    row = counts.drop_nulls().head(1).rows()
    if not row:
        return ""
    joined, expected = row[0]
    return (f"the rendezvous store waited for {expected} clients and {joined} connected: "
            f"{expected - joined} participant(s) (a node's agent or a rank) never joined")
