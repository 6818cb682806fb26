"""Stage 4, detect (cross-rank analysis "degraded_transport"): NCCL chose a slower path than the
hardware offers.

Reads NCCL's INIT/NET lines (`nccl.transport` "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM",
`nccl.net` "NET/IB : No device found.", "Using network Socket", "GPU Direct RDMA Disabled for
HCA ...", `nccl.env` "NCCL_P2P_DISABLE set by environment to 1.") and names four degradations:

* `transport-intra-node-network`: ranks of one machine connected through NET (sockets or the
  NIC) because the environment took P2P and SHM away or split the machine (NCCL_HOSTID). Without
  such a setting, NET between ranks of "one" host means two machines share a host name, which
  the environment analyses report (drift-identical-hostnames).
* `transport-intra-node-shm`: ranks of one machine connected through SHM (staged through host
  memory) because NCCL_P2P_DISABLE / NCCL_P2P_LEVEL took NVLink/PCIe peer access away.
* `transport-multinode-socket`: a job over several hosts whose inter-node traffic goes over TCP
  sockets: no InfiniBand/RoCE device found, IB disabled, or the net plugin missing.
* `transport-gdr-disabled`: inter-node traffic over InfiniBand without GPUDirect RDMA (every
  transfer bounces through host memory); with no channel line at all, NCCL's own `GPU Direct RDMA
  Disabled for HCA` lines say so unless the job is known to fit on one node.
* `transport-gdr-one-side`: one link with GDRDMA on its `[send]` side and none on its `[receive]`
  side: the receiving node lacks GPUDirect RDMA.

Transport lines number ranks inside their communicator; a pair is known to be intra- or
inter-node only when those numbers are global ranks (every communicator numbers ranks as the
world does) with known hosts, or when the whole job ran on one host.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.facts.hostfacts import transport_links
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label

MAX_EVIDENCE = 12
_ENV_VALUE = r"set by environment to (.+?)\.?\s*$"
_P2P_OFF = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")
_NET_FORCING = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_HOSTID", "NCCL_P2P_LEVEL")
_IB_MISSING = r"NET/IB ?: ?No device found|Using network Socket|NET/Plugin ?: ?(?:Could not find|No plugin found)|Failed to open libibverbs"
_GDR_OFF = r"GPU Direct RDMA Disabled|GDR(?:DMA)? (?:is )?disabled"
# `NET/Socket : Using [0]ib0:10.0.0.1<0>` (ib0, ibs3, ibp12s0: IPoIB interface names)
_SOCKET_OVER_IPOIB = r"NET/Socket ?: ?Using .*?\[\d+\](ib[a-z]*\d[\w.]*)"
# The environment asks for InfiniBand/RoCE: HCAs or a GID named, or IB explicitly enabled
# (`NCCL_IB_HCA=mlx5_0`, `NCCL_IB_GID_INDEX=3`, `NCCL_IB_DISABLE set by environment to 0.`).
_IB_ASKED = r"\bNCCL_IB_(?:HCA|GID_INDEX)(?:=| set )\S|\bNCCL_IB_DISABLE(?:=| set by environment to )0\b"
# NCCL's IB transport could not open a device and says so before falling back.
_IB_OPEN_FAILED = r"NET/IB ?: ?Unable to open device|ibv_open_device failed"


def _pairs(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """Distinct (src, dst, family) links with whether both ends are on one host (null: unknown)."""
    pairs = transport_links(events).select("event_id", "host", "rank", "src", "dst", "family", "gdr", "side")
    nccl_hosts = events.filter(pl.col("source") == "nccl").get_column("host").drop_nulls().unique()
    single_host = nccl_hosts.len() == 1 and len(job.hosts) <= 1
    comms = events.filter(pl.col("kind") == "nccl.comm_init")
    world_numbering = comms.height > 0 and comms.filter(pl.col("pg_rank") != pl.col("rank")).height == 0
    if single_host:
        return pairs.with_columns(pl.lit(True).alias("same_host"))
    if not world_numbering or not job.rank_hosts:
        return pairs.with_columns(pl.lit(None, dtype=pl.Boolean).alias("same_host"))
    hosts = pl.DataFrame(
        {"r": list(job.rank_hosts), "h": list(job.rank_hosts.values())}, schema={"r": pl.Int64, "h": pl.String}
    )
    return (
        pairs.join(hosts.rename({"r": "src", "h": "src_host"}), on="src", how="left")
        .join(hosts.rename({"r": "dst", "h": "dst_host"}), on="dst", how="left")
        .with_columns((pl.col("src_host") == pl.col("dst_host")).alias("same_host"))
        .drop("src_host", "dst_host")
    )


def _env(events: pl.DataFrame) -> pl.DataFrame:
    return events.filter(pl.col("kind") == "nccl.env").select(
        "event_id", "host", "rank", pl.col("code").alias("var"), pl.col("message").str.extract(_ENV_VALUE, 1).alias("value")
    )


def _links_text(pairs: pl.DataFrame) -> str:
    links = pairs.select("src", "dst", "family").unique().sort("src", "dst").head(4)
    more = pairs.select("src", "dst").unique().height - links.height
    text = ", ".join(f"{s} -> {d} via {f}" for s, d, f in links.iter_rows())
    return text + (f" and {more} more" if more > 0 else "")


def _ranks_of(pairs: pl.DataFrame) -> list[int]:
    return sorted(set(pairs.get_column("src").to_list()) | set(pairs.get_column("dst").to_list()))


def _settings(env: pl.DataFrame) -> str:
    """`NCCL_P2P_DISABLE=1 is set` / `NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1 are set`."""
    pairs = sorted({f"{v}={val}" for v, val in env.select("var", "value").iter_rows()})
    return ", ".join(pairs) + (" are set" if len(pairs) > 1 else " is set")


@register("degraded_transport")
def degraded_transport(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    if events.height == 0:
        return findings_frame([])
    pairs = _pairs(events, job)
    env = _env(events)
    intra = pairs.filter(pl.col("same_host").fill_null(False))
    inter = pairs.filter(~pl.col("same_host").fill_null(True))
    net_lines = events.filter(pl.col("kind") == "nccl.net")
    rows = [
        _intra_node_network(intra, env),
        _intra_node_shm(intra, env),
        _multinode_socket(events, job, pairs, inter, env, net_lines),
        _gdr_disabled(inter, env, net_lines) or _gdr_off_no_links(events, pairs, net_lines),
        _gdr_one_side(pairs),
    ]
    return findings_frame([row for row in rows if row is not None])


def _intra_node_network(intra: pl.DataFrame, env: pl.DataFrame) -> dict | None:
    over_net = intra.filter(pl.col("family").str.starts_with("NET/") | pl.col("family").str.starts_with("COLLNET/"))
    forcing = env.filter(pl.col("var").is_in(_NET_FORCING) & (pl.col("value") != "0"))
    return _forced_intra_node("transport-intra-node-network", over_net, forcing, 0.8,
                              "the network stack", "NVLink/PCIe peer access or shared memory")


def _intra_node_shm(intra: pl.DataFrame, env: pl.DataFrame) -> dict | None:
    over_shm = intra.filter(pl.col("family").is_in(["SHM", "direct shared memory"]))
    p2p_off = env.filter(
        (pl.col("var") == "NCCL_P2P_DISABLE") & (pl.col("value") != "0")
        | (pl.col("var") == "NCCL_P2P_LEVEL") & pl.col("value").str.to_uppercase().is_in(["LOC", "0"])
    )
    return _forced_intra_node("transport-intra-node-shm", over_shm, p2p_off, 0.75,
                              "host shared memory", "GPU peer-to-peer (NVLink/PCIe)")


def _forced_intra_node(rule_id: str, links: pl.DataFrame, settings: pl.DataFrame, confidence: float, through: str,
                       instead: str) -> dict | None:
    """Ranks of one machine connected through a slower path (`links`) because settings forced it."""
    if not (links.height and settings.height):
        return None
    return _link_finding(
        rule_id,
        links,
        confidence=confidence,
        summary=(
            f"ranks on the same machine exchange data through {through} ({_links_text(links)}) instead of "
            f"{instead}, because {_settings(settings)}"
        ),
        cause_evidence=settings.get_column("event_id").head(4).to_list(),
        link_evidence=8,
    )


def _multinode_socket(
    events: pl.DataFrame, job: JobContext, pairs: pl.DataFrame, inter: pl.DataFrame, env: pl.DataFrame, net_lines: pl.DataFrame
) -> dict | None:
    nccl = events.filter(pl.col("source") == "nccl")
    hosts = sorted(set(nccl.get_column("host").drop_nulls().unique().to_list()) | set(job.hosts))
    socket = inter.filter(pl.col("family") == "NET/Socket")
    multi_node = len(hosts) > 1 or inter.height > 0
    ib_missing = net_lines.filter(pl.col("message").str.contains(_IB_MISSING))
    ib_disabled = env.filter(pl.col("var").is_in(["NCCL_IB_DISABLE", "NCCL_NET"]) & (pl.col("value").str.to_uppercase() != "0") & (pl.col("value").str.to_uppercase() != "IB"))
    uses_ib = pairs.filter(pl.col("family").str.starts_with("NET/IB")).height > 0
    over_ipoib = net_lines.filter(pl.col("message").str.contains(_SOCKET_OVER_IPOIB))
    on_sockets = socket.height or ib_missing.filter(pl.col("message").str.contains("Using network Socket")).height or over_ipoib.height
    # Sockets on an IPoIB interface prove the host has InfiniBand that NCCL is not using; unless
    # the job is known to fit on one node, that alone is worth saying (less surely).
    one_node = events.filter((pl.col("kind") == "nccl.topology") & pl.col("message").str.contains(r"nNodes 1\b")).height > 0
    one_node = one_node or (pairs.height > 0 and inter.height == 0 and not pairs.get_column("family").str.starts_with("NET").any())
    ib_asked = events.filter(pl.col("kind").is_in(["nccl.env", "env.assignment"]) & pl.col("message").str.contains(_IB_ASKED))
    ib_open_failed = events.filter((pl.col("kind") == "nccl.warn") & pl.col("message").str.contains(_IB_OPEN_FAILED))
    no_ib_device = ib_missing.filter(pl.col("message").str.contains("No device found")).height > 0
    # Sockets where the environment names the HCAs (or enables IB) and NCCL found none: the RDMA
    # NICs the job was configured for are invisible to it (a container without /dev/infiniband,
    # RDMA not enabled), which matters as soon as traffic crosses nodes.
    ib_expected = ib_asked.height > 0 and (no_ib_device or ib_open_failed.height > 0)
    maybe_multi_node = not one_node and (
        (over_ipoib.height > 0 and (ib_missing.height or ib_disabled.height)) or ib_expected
    )
    if not ((multi_node or maybe_multi_node) and not uses_ib and on_sockets):
        return None
    why = _socket_reasons(ib_disabled, ib_missing, ib_asked if ib_expected else None, ib_open_failed, over_ipoib)
    spans = f"the job spans {len(hosts)} hosts and its" if multi_node else "if the job spans several nodes, its"
    summary = (
        f"{spans} inter-node traffic goes over TCP sockets (NET/Socket)"
        + (f": {_links_text(socket)}" if socket.height else "")
        + (f"; {'; '.join(why)}" if why else "")
    )
    evidence = ib_disabled.get_column("event_id").head(2).to_list() + ib_open_failed.get_column("event_id").head(2).to_list()
    evidence += ib_missing.get_column("event_id").head(4).to_list() + ib_asked.get_column("event_id").head(2).to_list()
    evidence += over_ipoib.get_column("event_id").head(2).to_list() + socket.get_column("event_id").head(6).to_list()
    return finding(
        "transport-multinode-socket",
        hosts=hosts,
        confidence=(0.6 if why else 0.5) if multi_node else 0.4,
        summary=summary,
        evidence=evidence,
    )


def _socket_reasons(
    ib_disabled: pl.DataFrame, ib_missing: pl.DataFrame, ib_asked: pl.DataFrame | None, ib_open_failed: pl.DataFrame,
    over_ipoib: pl.DataFrame,
) -> list[str]:
    """Why the traffic is on sockets, as far as the lines say (`ib_asked`: None unless IB was
    expected, i.e. asked for and not found)."""
    why = []
    if ib_disabled.height:
        why.append(_settings(ib_disabled))
    if ib_missing.filter(pl.col("message").str.contains("No device found")).height:
        why.append("NCCL found no InfiniBand/RoCE device (NET/IB : No device found)")
    if ib_missing.filter(pl.col("message").str.contains("Plugin|libibverbs")).height:
        why.append("no network plugin or libibverbs was loaded")
    if ib_asked is not None:
        settings = ", ".join(sorted(set(ib_asked.get_column("message").str.extract(r"\b(NCCL_IB_\w+)", 1).drop_nulls().to_list())))
        why.append(f"the environment asks for InfiniBand ({settings}) but NCCL could not use any HCA")
    if ib_open_failed.height:
        why.append("NCCL could not open the InfiniBand device (ibv_open_device failed: no /dev/infiniband or no "
                   "IPC_LOCK in a container, or RDMA not enabled)")
    if over_ipoib.height:
        interface = over_ipoib.get_column("message").str.extract(_SOCKET_OVER_IPOIB, 1).drop_nulls().head(1).to_list()
        why.append(f"the sockets run over the IPoIB interface {interface[0] if interface else ''}: the host has InfiniBand that NCCL does not use")
    return why


def _gdr_disabled(inter: pl.DataFrame, env: pl.DataFrame, net_lines: pl.DataFrame) -> dict | None:
    ib_pairs = inter.filter(pl.col("family").str.starts_with("NET/IB"))
    gdr_off = net_lines.filter(pl.col("message").str.contains(_GDR_OFF))
    gdr_env = env.filter(pl.col("var").is_in(["NCCL_NET_GDR_LEVEL", "NCCL_GDR_LEVEL"]) & pl.col("value").str.to_uppercase().is_in(["0", "LOC"]))
    if not (ib_pairs.height and not ib_pairs.get_column("gdr").any() and (gdr_off.height or gdr_env.height)):
        return None
    return _link_finding(
        "transport-gdr-disabled",
        ib_pairs,
        confidence=0.65,
        summary=(
            f"inter-node traffic uses InfiniBand without GPUDirect RDMA ({_links_text(ib_pairs)}; no GDRDMA link), so every "
            "transfer is staged through host memory"
            + (f"; {_settings(gdr_env)}" if gdr_env.height else "")
        ),
        cause_evidence=gdr_env.get_column("event_id").head(2).to_list() + gdr_off.get_column("event_id").head(4).to_list(),
        link_evidence=6,
    )


def _gdr_off_no_links(events: pl.DataFrame, pairs: pl.DataFrame, net_lines: pl.DataFrame) -> dict | None:
    """NCCL said GPU Direct RDMA is disabled on its HCAs (the peer-memory module is missing or not
    registered) and no channel line is there to show what the job used (with channel lines,
    `_gdr_disabled` reads them): the inter-node traffic over those HCAs is staged through host
    memory, unless the job is known to fit on one node (nNodes 1)."""
    gdr_off = net_lines.filter(pl.col("message").str.contains(_GDR_OFF))
    one_node = events.filter((pl.col("kind") == "nccl.topology") & pl.col("message").str.contains(r"nNodes 1\b")).height > 0
    if not gdr_off.height or one_node or pairs.height:
        return None
    hcas = sorted(set(gdr_off.get_column("message").str.extract(r"HCA \d+ '([^']+)'", 1).drop_nulls().to_list()))
    return finding(
        "transport-gdr-disabled",
        hosts=gdr_off.get_column("host").drop_nulls().unique().sort().to_list(),
        confidence=0.45,
        summary=(
            "NCCL disabled GPUDirect RDMA" + (f" on {', '.join(hcas[:4])}" if hcas else "") + " (GPU Direct RDMA Disabled: "
            "the nvidia-peermem / nv_peer_mem module is not loaded or not registered, or this NCCL does not look for it): "
            "if the job spans nodes, every inter-node transfer is staged through host memory"
        ),
        evidence=gdr_off.get_column("event_id").head(4).to_list(),
    )


def _gdr_one_side(pairs: pl.DataFrame) -> dict | None:
    """One connection, two sides: the sender reads GPU memory over GPUDirect RDMA (`[send] via
    NET/IB/0/GDRDMA`, so the module and topology allow it on its node) while the receiver of the
    same link writes without it (`[receive] via NET/IB/1`). GDR write is allowed wherever GDR read
    is on the same hardware, so the receiving node lacks GPUDirect RDMA."""
    ib = pairs.filter(pl.col("family").str.starts_with("NET/IB") & pl.col("side").is_not_null())
    send_gdr = ib.filter((pl.col("side") == "send") & pl.col("gdr")).select("src", "dst").unique()
    recv_plain = ib.filter((pl.col("side") == "receive") & ~pl.col("gdr")).join(send_gdr, on=["src", "dst"])
    if not recv_plain.height:
        return None
    sent = ib.filter((pl.col("side") == "send") & pl.col("gdr")).join(recv_plain.select("src", "dst").unique(), on=["src", "dst"])
    receivers = sorted(set(recv_plain.get_column("dst").to_list()))
    return finding(
        "transport-gdr-one-side",
        ranks=receivers,
        hosts=recv_plain.get_column("host").drop_nulls().unique().sort().to_list(),
        confidence=0.5,
        summary=(
            f"the same InfiniBand links use GPUDirect RDMA on the sending side and not on the receiving side "
            f"({_links_text(recv_plain)}): the node of receiving {ranks_label(receivers)} "
            "stages every transfer through host memory"
        ),
        evidence=recv_plain.get_column("event_id").head(4).to_list() + sent.get_column("event_id").head(2).to_list(),
    )


def _link_finding(
    rule_id: str, links: pl.DataFrame, *, confidence: float, summary: str, cause_evidence: list[int], link_evidence: int
) -> dict:
    """A finding about transport links: culprits are the links' ranks and hosts; the settings that
    explain them come first in the evidence, then the channel lines themselves."""
    return finding(
        rule_id,
        ranks=_ranks_of(links),
        hosts=links.get_column("host").drop_nulls().unique().to_list(),
        confidence=confidence,
        summary=summary,
        evidence=cause_evidence + links.get_column("event_id").head(link_evidence).to_list(),
    )
