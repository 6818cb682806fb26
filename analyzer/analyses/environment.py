"""Detect (cross-host analyses): nodes that are not alike, and GPUs shared by several processes.

All drift analyses read the per-host facts table of `analyzer.facts.hostfacts` (computed once per job)
and name the *minority* hosts: those whose value is not the one most hosts share. When the hosts
split evenly, a fact-specific order decides where one is sound (the older version, the host
without the plugin, the smaller card); where none is (an environment variable set on half the
hosts), no host is named and the summary shows both sides.

- `nccl_stack_drift`: NCCL version, build or network plugin differ across hosts.
- `env_drift`: an NCCL variable that changes transport or protocol choice (IB, socket, P2P, SHM,
  net plugin, protocol/algorithm) differs across hosts or ranks (an even split is only context).
- `driver_drift`: the CUDA driver (NCCL's `cudaDriverVersion`, nvidia-smi) differs across hosts.
- `torch_drift`: the PyTorch version differs across hosts.
- `identical_hostnames`: one host name used by several machines (different addresses on the
  same interface, NET transport between ranks of "one" host, NCCL counting fewer local ranks, CUDA
  IPC / shared-memory setup failing between processes that claim the same GPU).
- `gpu_heterogeneity`: a mixed GPU pool; OOMs on its smallest cards; bf16 on cards without it.
- `gpu_process_table`: nvidia-smi's process table shows several processes of one program on one
  GPU, the extra small ones being stray CUDA contexts of other ranks.
- `single_host_system_error`: NCCL's `unhandled system error` in a job whose every rank runs on
  one host, with no line naming a socket or peer: the system call that failed is the shared-memory
  one (/dev/shm), not the network the generic signature assumes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.facts.hostfacts import ENV_PREFIX, UNSET, HostFacts, address_clashes, memory_gib, transport_pairs

MAX_EVIDENCE = 24
MAX_NAMED = 6
# Variables whose disagreement across ranks changes which transport, protocol or algorithm each
# side picks, so that two ranks stop speaking the same way: IB / socket / P2P / SHM / net plugin.
_TRANSPORT_VARIABLES = (
    r"^NCCL_(?:IB_\w+|NET\w*|SOCKET_(?:IFNAME|FAMILY)|P2P_\w+|SHM_\w+|PROTO|ALGO|BUFFSIZE|CROSS_NIC|"
    r"COLLNET_ENABLE|NVLS_ENABLE|CUMEM_ENABLE|DMABUF_ENABLE|GDR\w*|MNNVL_ENABLE|PXN_DISABLE)$"
)

Order = Callable[[str], tuple]


def _version_key(value: str) -> tuple:
    """`2.28.9` < `2.28.10`; `cuda12.4` -> (12, 4); unparsable values sort first."""
    return tuple(int(n) for n in re.findall(r"\d+", value)) or (-1,)


def _plugin_key(value: str) -> tuple:
    """On a tie, the hosts without the plugin are the odd ones (the plugin is installed on purpose)."""
    return (0 if value == "internal" else 1, value)


def _memory_key(value: str) -> tuple:
    sizes = [memory_gib(part) for part in value.split(", ")]
    return (min((s for s in sizes if s is not None), default=-1.0),)


# --- generic minority split ------------------------------------------------------------------------


def _split(per_host: pl.DataFrame, order: Order | None) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Hosts whose value is not the majority's, and every (value, hosts) group for the summary.

    On a tie between the largest groups, `order` picks the group that is right (the greatest);
    without an order nobody is named."""
    groups = (
        per_host.group_by("value")
        .agg(pl.col("host").unique().sort().alias("hosts"))
        .with_columns(pl.col("hosts").list.len().alias("n"))
        .sort(["n", "value"], descending=[True, False])
    )
    rows = [(value, hosts) for value, hosts, _ in groups.iter_rows()]  # one row per distinct value
    if len(rows) < 2:
        return [], rows
    largest = len(rows[0][1])
    leaders = [row for row in rows if len(row[1]) == largest]
    if len(leaders) > 1:
        if order is None:
            return [], rows
        leaders.sort(key=lambda row: order(row[0]), reverse=True)
        if order(leaders[0][0]) == order(leaders[1][0]):
            return [], rows
    majority = leaders[0][0]
    odd = sorted(host for value, hosts in rows if value != majority for host in hosts)
    return odd, rows


def _groups_text(rows: list[tuple[str, list[str]]]) -> str:
    parts = []
    for value, hosts in rows[:MAX_NAMED]:
        named = ", ".join(hosts[:MAX_NAMED]) + (f" and {len(hosts) - MAX_NAMED} more" if len(hosts) > MAX_NAMED else "")
        parts.append(f"{value} on {named}")
    if len(rows) > MAX_NAMED:
        parts.append(f"{len(rows) - MAX_NAMED} more values")
    return "; ".join(parts)


def _fact_rows(facts: HostFacts, fact: str) -> pl.DataFrame:
    return facts.hosts.filter(pl.col("fact") == fact)


def _evidence(facts: HostFacts, fact: str, odd: list[str]) -> list[int]:
    """The odd hosts' lines first, then one line of each other host, for contrast."""
    rows = _fact_rows(facts, fact).with_columns(pl.col("host").is_in(odd).alias("odd")).sort(["odd", "host"], descending=[True, False])
    ids: list[int] = []
    for is_odd, event_ids in rows.select("odd", "event_ids").iter_rows():  # one row per host
        ids.extend(event_ids[:4] if is_odd else event_ids[:1])
    return ids[:MAX_EVIDENCE]


def _odd_ranks(facts: HostFacts, fact: str, odd_hosts: list[str], majority: str | None) -> list[int]:
    """The ranks that hold the odd value; for a host-wide fact (nvidia-smi), every rank of the odd hosts."""
    units = facts.units.filter(pl.col("rank").is_not_null() & pl.col("host").is_in(odd_hosts))
    stated = units.filter(pl.col("fact") == fact)
    if stated.height == 0:
        return units.get_column("rank").unique().sort().to_list()
    if majority is not None:
        stated = stated.filter(pl.col("value") != majority)
    return stated.get_column("rank").unique().sort().to_list()


def _drift(facts: HostFacts, fact: str, order: Order | None) -> tuple[list[str], list[tuple[str, list[str]]]] | None:
    per_host = _fact_rows(facts, fact)
    if per_host.select(pl.col("value").n_unique()).item() < 2:
        return None
    return _split(per_host.select("host", "value"), order)


def _drift_finding(facts: HostFacts, rule_id: str, fact: str, label: str, order: Order | None, confidence: float, advice: str) -> dict | None:
    split = _drift(facts, fact, order)
    if split is None:
        return None
    odd, rows = split
    majority = next((value for value, hosts in rows if not set(hosts) & set(odd)), None) if odd else None
    who = (f"odd host(s): {', '.join(odd[:MAX_NAMED])}" if odd else
           "the hosts split evenly and nothing says which side is right")
    return finding(
        rule_id,
        hosts=odd,
        ranks=_odd_ranks(facts, fact, odd, majority) if odd else [],
        confidence=confidence if odd else confidence * 0.8,
        summary=f"{label} differs across hosts: {_groups_text(rows)} ({who}); {advice}",
        evidence=_evidence(facts, fact, odd),
    )


# --- analyses ------------------------------------------------------------------------------------------


@register("nccl_stack_drift")
def nccl_stack_drift(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    rows = [
        _drift_finding(facts, "nccl-stack-differs-across-hosts", "net_plugin", "NCCL network plugin", _plugin_key, 0.7,
                       "install the same plugin on every node or none"),
    ]
    version = _drift_finding(facts, "nccl-stack-differs-across-hosts", "nccl_version", "NCCL version", _version_key, 0.8,
                             "run one NCCL build everywhere")
    # The CUDA build suffix is compared only when the versions agree: one finding per mismatch.
    rows.append(version or _drift_finding(facts, "nccl-stack-differs-across-hosts", "nccl_build", "NCCL build", _version_key, 0.7,
                                          "run one NCCL build everywhere"))
    return findings_frame(row for row in rows if row)


@register("env_drift")
def env_drift(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    variables = (
        facts.hosts.filter(pl.col("fact").str.starts_with(ENV_PREFIX))
        .with_columns(pl.col("fact").str.strip_prefix(ENV_PREFIX).alias("name"))
        .filter(pl.col("name").str.contains(_TRANSPORT_VARIABLES) & pl.col("differs"))
        .get_column("fact").unique().sort().to_list()
    )
    varying = set(facts.hosts.filter(pl.col("varies")).get_column("fact").to_list())
    rows = []
    for fact in variables:
        name = fact[len(ENV_PREFIX):]
        if fact in varying:
            row = _rank_level_env(facts, fact, name)
        else:
            row = _drift_finding(facts, "drift-nccl-env-differs", fact, name, None, 0.65,
                                 f"set {name} identically on every node (or nowhere)")
        if row is None:
            continue
        if not row["hosts"] and not row["ranks"]:
            # An even split names nobody: it is context for whatever else failed, not the verdict.
            row = {**row, "rule_id": "drift-nccl-env-split"}
        elif _odd_side_is_unset(facts, fact, row["hosts"]):
            # "Not set there" is inferred from a missing line, weaker than a line that says so.
            row = {**row, "confidence": 0.5}
        rows.append(row)
    return findings_frame(rows)


def _odd_side_is_unset(facts: HostFacts, fact: str, odd_hosts: list[str]) -> bool:
    values = facts.units.filter((pl.col("fact") == fact) & pl.col("host").is_in(odd_hosts)).get_column("value")
    return values.len() > 0 and bool((values == UNSET).all())


def _rank_level_env(facts: HostFacts, fact: str, name: str) -> dict | None:
    """The ranks of some host disagree among themselves (a per-process launcher environment):
    the ranks vote, and the minority ranks are named with their hosts."""
    units = facts.units.filter((pl.col("fact") == fact) & (pl.col("unit") != "host"))
    if units.select(pl.col("value").n_unique()).item() < 2:
        return None
    odd_units, groups = _split(units.select(pl.col("unit").alias("host"), "value"), None)  # units vote as hosts do
    odd = units.filter(pl.col("unit").is_in(odd_units))
    return finding(
        "drift-nccl-env-differs",
        ranks=odd.get_column("rank").drop_nulls().to_list(),
        hosts=odd.get_column("host").to_list(),
        confidence=0.65 if odd_units else 0.5,
        summary=f"{name} differs across ranks: {_groups_text(groups)}; set it identically for every process",
        evidence=units.sort(pl.col("unit").is_in(odd_units), descending=True)
        .get_column("event_ids").list.first().drop_nulls().head(MAX_EVIDENCE).to_list(),
    )


@register("driver_drift")
def driver_drift(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    row = _drift_finding(facts, "drift-cuda-driver-older", "driver_version", "NVIDIA driver", _version_key, 0.7,
                         "install the same driver on every node") or _drift_finding(
        facts, "drift-cuda-driver-older", "cuda_driver", "CUDA driver version", _version_key, 0.65,
        "install the same driver on every node")
    return findings_frame([row] if row else [])


@register("torch_drift")
def torch_drift(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    row = _drift_finding(facts, "drift-torch-version-differs", "torch_version", "PyTorch version", _version_key, 0.7,
                         "run the same image or environment on every node")
    return findings_frame([row] if row else [])


@register("identical_hostnames")
def identical_hostnames(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    signals: dict[str, list[tuple[str, list[int], list[int]]]] = {}  # host -> (text, ranks, evidence)
    for host, text, ranks, evidence in [*_address_signals(facts), *_transport_signals(events, facts, job), *_local_rank_signals(facts, job),
                                        *_intra_node_failure_signals(events), *_shared_device_signals(events)]:
        signals.setdefault(host, []).append((text, ranks, evidence))
    rows = []
    for host, found in sorted(signals.items()):
        rows.append(finding(
            "drift-identical-hostnames",
            hosts=[host],
            ranks=[r for _, ranks, _ in found for r in ranks],
            confidence=min(0.9, 0.6 + 0.15 * len(found)),
            summary=f"host name {host} is used by more than one machine: " + "; ".join(text for text, _, _ in found),
            evidence=[e for _, _, evidence in found for e in evidence][:MAX_EVIDENCE],
        ))
    return findings_frame(rows)


def _address_signals(facts: HostFacts) -> list[tuple[str, str, list[int], list[int]]]:
    """One interface name with two addresses under one host name: two machines."""
    out = []
    clashes = address_clashes(facts.observations)
    for (host, iface), group in clashes.group_by(["host", "iface"], maintain_order=True):  # one group per clash
        parts = [
            f"{ip} ({'ranks ' + ','.join(map(str, ranks)) if ranks else 'pids ' + ','.join(map(str, pids))})"
            for ip, ranks, pids in group.select("ip", "ranks", "pids").iter_rows()
        ]
        out.append((
            host,
            f"processes report different addresses on {iface}: " + ", ".join(parts),
            sorted({r for ranks in group.get_column("ranks").to_list() for r in ranks}),
            group.get_column("event_id").to_list(),
        ))
    return out


def _transport_signals(events: pl.DataFrame, facts: HostFacts, job: JobContext) -> list[tuple[str, str, list[int], list[int]]]:
    """NCCL connected two ranks of "one" host over the network: it saw two machines."""
    if not job.rank_hosts:
        return []
    comms = events.filter(pl.col("kind") == "nccl.comm_init")
    # Transport lines number ranks inside their communicator; only when every communicator
    # numbers them as the world does can those numbers be looked up as global ranks.
    if comms.height == 0 or comms.filter(pl.col("pg_rank") != pl.col("rank")).height:
        return []
    hosts = pl.DataFrame({"rank": list(job.rank_hosts), "rank_host": list(job.rank_hosts.values())},
                         schema={"rank": pl.Int64, "rank_host": pl.String})
    pairs = (
        transport_pairs(events, via="via NET/")
        .join(hosts.rename({"rank": "src", "rank_host": "src_host"}), on="src", how="inner")
        .join(hosts.rename({"rank": "dst", "rank_host": "dst_host"}), on="dst", how="inner")
        .filter((pl.col("src_host") == pl.col("dst_host")) & (pl.col("host") == pl.col("src_host")))
    )
    if pairs.height == 0:
        return []
    deliberate_hosts = _deliberately_split_hosts(facts)
    out = []
    for host, group in pairs.filter(~pl.col("host").is_in(sorted(deliberate_hosts))).group_by("host", maintain_order=True):
        links = group.select("src", "dst", "family").unique().sort("src", "dst").head(4)
        text = ", ".join(f"{s} -> {d} via {f}" for s, d, f in links.iter_rows())
        ranks = sorted(set(group.get_column("src").to_list()) | set(group.get_column("dst").to_list()))
        out.append((host[0] if isinstance(host, tuple) else host,
                    f"NCCL connected ranks of this host over the network ({text})", ranks,
                    group.get_column("event_id").head(4).to_list()))
    return out


# NCCL's intra-node transports failing on a peer's handle or buffer (transport/p2p.cc's CUDA IPC open,
# include/shm.h's host-buffer registration): what a peer on another machine taken for a neighbour gives.
_INTRA_NODE_FAILURE = r"failed to open CUDA IPC handle|failed to register host buffer"


def _intra_node_failure_signals(events: pl.DataFrame) -> list[tuple[str, str, list[int], list[int]]]:
    """NCCL's CUDA IPC / shared-memory setup failed under a host name whose NCCL lines claim one CUDA
    device from several processes: two machines' processes, each on its own GPU 0, taken for one node."""
    nccl = events.filter(pl.col("kind").str.starts_with("nccl.") & pl.col("host").is_not_null()
                         & pl.col("pid").is_not_null() & pl.col("device").is_not_null())
    failed = nccl.filter(pl.col("message").fill_null("").str.contains(_INTRA_NODE_FAILURE))
    if failed.height == 0:
        return []
    shared = (
        nccl.filter(pl.col("host").is_in(failed.get_column("host").unique().implode()))
        .group_by("host", "device").agg(pl.col("pid").unique().sort().alias("pids"))
        .filter(pl.col("pids").list.len() > 1)
        .sort("host", "device")
    )
    out = []
    for (host,), group in shared.group_by("host", maintain_order=True):
        claims = "; ".join(f"GPU {d}: pids {','.join(map(str, pids[:4]))}" for d, pids in group.select("device", "pids").head(3).iter_rows())
        evidence = failed.filter(pl.col("host") == host).get_column("event_id").head(4).to_list()
        out.append((host, f"several processes claim the same GPU ({claims}) and NCCL's CUDA IPC / shared-memory "
                          "setup between them failed", [], evidence))
    return out


def _shared_device_signals(events: pl.DataFrame) -> list[tuple[str, str, list[int], list[int]]]:
    """NCCL linked ranks inside one host (P2P, SHM) and, doing so, put two ranks on one of its GPUs:
    its processes said which GPU each drives (their own end of a link), and a peer it reaches as a
    neighbour names another's GPU. Two machines' ranks taken for one node (NCCL 2.4 compared host names
    up to the first dot). Read only when each process of the host wrote one communicator's links and the
    processes' own GPUs are distinct (not every process on its GPU 0 behind CUDA_VISIBLE_DEVICES)."""
    comms = events.filter(pl.col("kind") == "nccl.comm_init").group_by("host", "pid").len()
    if comms.height and comms.get_column("len").max() > 1:
        return []
    # Only intra-node transports (P2P, SHM) say the two ends share a machine.
    intra = pl.col("family").str.starts_with("P2P/") | pl.col("family").is_in(["SHM", "direct shared memory"])
    links = transport_pairs(events).filter(
        intra & pl.col("host").is_not_null() & pl.col("pid").is_not_null() & pl.col("src_gpu").is_not_null() & pl.col("dst_gpu").is_not_null()
    )
    if links.height == 0:
        return []
    own = links.group_by("host", "pid").agg(pl.col("src").unique().alias("ranks"), pl.col("src_gpu").unique().alias("gpus"))
    own = own.filter((pl.col("ranks").list.len() == 1) & (pl.col("gpus").list.len() == 1)).select(
        "host", pl.col("ranks").list.first().alias("rank"), pl.col("gpus").list.first().alias("gpu"))
    distinct = own.group_by("host").agg((pl.col("gpu").n_unique() == pl.len()).alias("ok")).filter("ok").select("host")
    own = own.join(distinct, on="host", how="semi")
    clashes = (
        links.join(own.rename({"rank": "holder", "gpu": "dst_gpu"}), on=["host", "dst_gpu"], how="inner")
        .filter(pl.col("holder") != pl.col("dst"))
        .sort("event_id")
    )
    out = []
    for (host,), group in clashes.group_by("host", maintain_order=True):
        first = group.row(0, named=True)
        holder_line = links.filter((pl.col("host") == host) & (pl.col("src") == first["holder"])).get_column("event_id").min()
        out.append((host, f"NCCL links rank {first['src']} to rank {first['dst']} inside this host on GPU "
                          f"[{first['dst_gpu']}], which rank {first['holder']} of this host drives: the two ranks "
                          "are on different machines that NCCL took for one", sorted({first["src"], first["dst"], first["holder"]}),
                    [first["event_id"], holder_line]))
    return out


def _deliberately_split_hosts(facts: HostFacts) -> set[str]:
    """Hosts that told NCCL they are several (NCCL_HOSTID) or took P2P and SHM away: NET on purpose."""
    deliberate = facts.hosts.filter(
        ((pl.col("fact") == f"{ENV_PREFIX}NCCL_HOSTID") & (pl.col("value") != UNSET))
        | (pl.col("fact").is_in([f"{ENV_PREFIX}NCCL_P2P_DISABLE", f"{ENV_PREFIX}NCCL_SHM_DISABLE"]) & (pl.col("value") == "1"))
    ).group_by("host").agg(pl.col("fact"))
    return {
        host for host, names in deliberate.iter_rows()
        if f"{ENV_PREFIX}NCCL_HOSTID" in names or len(names) == 2
    }


def _local_rank_signals(facts: HostFacts, job: JobContext) -> list[tuple[str, str, list[int], list[int]]]:
    """NCCL counts fewer ranks on the node (`localRanks`) than the job put under this host name."""
    nodes = facts.observations.filter(pl.col("fact") == "nccl_nodes").with_columns(
        pl.col("value").str.split("/").list.get(0).cast(pl.Int64).alias("nranks"),
        pl.col("value").str.split("/").list.get(1).cast(pl.Int64).alias("nnodes"),
        pl.col("value").str.split("/").list.get(2).cast(pl.Int64).alias("local"),
    )
    world = job.world_size or nodes.get_column("nranks").max()
    if nodes.height == 0 or world is None:
        return []
    world_nodes = nodes.filter(pl.col("nranks") == world)
    ranks_per_host = facts.units.filter(pl.col("rank").is_not_null()).group_by("host").agg(pl.col("rank").unique().sort().alias("ranks"))
    checked = (
        world_nodes.group_by("host")
        .agg(pl.col("local").max(), pl.col("nnodes").max(), pl.col("event_id").min())
        .join(ranks_per_host, on="host", how="inner")
        .filter((pl.col("ranks").list.len() > pl.col("local")) & ~pl.col("host").is_in(sorted(_deliberately_split_hosts(facts))))
    )
    return [
        (host, f"{len(ranks)} ranks carry this name but NCCL counted {local} rank(s) per node ({nnodes} nodes)", ranks, [event_id])
        for host, local, nnodes, event_id, ranks in checked.iter_rows()
    ]


@register("gpu_heterogeneity")
def gpu_heterogeneity(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    facts = job.host_facts
    rows = [row for row in (_oom_on_smallest(facts), _bf16_unsupported(facts)) if row]
    models = _drift_finding(facts, "drift-gpu-models-differ", "gpu_model", "GPU model", None, 0.6,
                            "schedule the job on one GPU type (node features / constraints) or size it for the smallest card")
    memory = _drift_finding(facts, "drift-gpu-models-differ", "gpu_memory", "GPU memory", _memory_key, 0.6,
                            "schedule the job on one GPU type (node features / constraints) or size it for the smallest card")
    if models and memory and not models["hosts"]:
        # The models split evenly, but memory says which cards are the small ones.
        models = {**memory, "summary": models["summary"] + " / " + memory["summary"]}
    mixed = models or memory
    if mixed:
        rows.append(mixed)
    return findings_frame(rows)


def _unit_memory(facts: HostFacts) -> tuple[pl.DataFrame, pl.DataFrame]:
    """GPU memory per (host, unit): the unit's own figure (its OOM message) else its host's."""
    memory = facts.units.filter(pl.col("fact") == "gpu_memory").select(
        "host", "unit", pl.col("values").list.eval(pl.element().str.extract(r"^(\d+)").cast(pl.Float64)).list.min().alias("gib"),
        "event_ids",
    )
    per_host = memory.group_by("host").agg(pl.col("gib").min().alias("host_gib"), pl.col("event_ids").first().alias("host_ids"))
    return memory, per_host


def _oom_on_smallest(facts: HostFacts) -> dict | None:
    ooms = facts.units.filter(pl.col("fact") == "oom").select("host", "unit", "rank", pl.col("event_ids").alias("oom_ids"))
    memory, per_host = _unit_memory(facts)
    if ooms.height == 0 or memory.select(pl.col("gib").n_unique()).item() < 2:
        return None
    smallest = memory.get_column("gib").min()
    largest = memory.get_column("gib").max()
    placed = (
        ooms.join(memory.select("host", "unit", "gib"), on=["host", "unit"], how="left")
        .join(per_host, on="host", how="left")
        .with_columns(pl.coalesce("gib", "host_gib").alias("gib"))
    )
    if placed.filter(pl.col("gib").is_null() | (pl.col("gib") > smallest)).height:
        return None  # an OOM on a large card (or on one of unknown size): not explained by the pool
    small_hosts = per_host.filter(pl.col("host_gib") == smallest).get_column("host").to_list()
    large_hosts = per_host.filter(pl.col("host_gib") == largest).get_column("host").to_list()
    ranks = placed.get_column("rank").drop_nulls().unique().sort().to_list()
    hosts = sorted(set(placed.get_column("host").to_list()))
    others = sorted(set(small_hosts) - set(hosts))
    evidence = [*placed.get_column("oom_ids").list.explode().drop_nulls().to_list()[:MAX_EVIDENCE // 2],
                *per_host.filter(pl.col("host").is_in(large_hosts)).get_column("host_ids").list.first().drop_nulls().to_list()[:4]]
    return finding(
        "drift-oom-on-smallest-gpus",
        ranks=ranks,
        hosts=hosts,
        confidence=0.8,
        summary=(
            f"CUDA out of memory on {'rank(s) ' + ','.join(map(str, ranks)) if ranks else 'host(s) ' + ', '.join(hosts)} "
            f"({', '.join(hosts[:MAX_NAMED])}), all on the smallest GPUs of a mixed pool: {smallest:.0f} GiB against "
            f"{largest:.0f} GiB on {', '.join(large_hosts[:MAX_NAMED]) or 'other ranks'}"
            + (f"; other hosts with {smallest:.0f} GiB cards, the next suspects: {', '.join(others[:MAX_NAMED])}" if others else "")
        ),
        evidence=evidence,
    )


def _bf16_unsupported(facts: HostFacts) -> dict | None:
    refused = facts.units.filter(pl.col("fact") == "bf16_unsupported")
    if refused.height == 0:
        return None
    hosts = sorted(set(refused.get_column("host").to_list()))
    models = _fact_rows(facts, "gpu_model").select("host", "value")
    theirs = sorted(set(models.filter(pl.col("host").is_in(hosts)).get_column("value").to_list()))
    elsewhere = sorted(set(models.filter(~pl.col("host").is_in(hosts)).get_column("value").to_list()) - set(theirs))
    detail = f" ({', '.join(theirs)})" if theirs else ""
    if elsewhere:
        detail += f", while other hosts run {', '.join(elsewhere)}"
    return finding(
        "drift-bf16-unsupported-gpu",
        ranks=refused.get_column("rank").drop_nulls().unique().to_list(),
        hosts=hosts,
        confidence=0.85,
        summary=f"bfloat16 is not supported on the GPUs of {', '.join(hosts[:MAX_NAMED])}{detail}",
        evidence=refused.get_column("event_ids").list.explode().drop_nulls().head(MAX_EVIDENCE).to_list(),
    )


@register("gpu_process_table")
def gpu_process_table(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = events.filter(pl.col("kind") == "gpu.process").with_columns(
        pl.col("message").str.extract(r"^\W*(\d+)\s+N/A").cast(pl.Int64, strict=False).alias("gpu"),
        pl.col("message").str.extract(r"N/A\s+N/A\s+(\d+)").cast(pl.Int64, strict=False).alias("proc"),
        pl.col("message").str.extract(r"(\d+)MiB").cast(pl.Int64, strict=False).alias("mib"),
        pl.col("message").str.extract(r"\s(?:C|G|C\+G)\s+(.+?)\s+\d+MiB").alias("program"),
    ).filter(pl.col("gpu").is_not_null() & pl.col("proc").is_not_null()).unique(["gpu", "proc"])
    crowded = table.group_by("gpu", "program").agg(pl.len().alias("n"), pl.col("mib").max().alias("top")).filter(pl.col("n") > 1)
    rows = []
    for gpu, program, count, top in crowded.iter_rows():
        procs = table.filter((pl.col("gpu") == gpu) & (pl.col("program") == program)).sort("proc")
        # Launch order gives rank order when no pid->rank map exists; the owner holds the most memory.
        ordered = procs.with_row_index("launch_index")
        strays = ordered.filter(pl.col("mib") < top)
        rows.append(finding(
            "gpu-shared-by-several-processes",
            ranks=strays.get_column("launch_index").cast(pl.Int64).to_list(),
            confidence=0.55,
            summary=(f"GPU {gpu} hosts {count} processes of {program}: {strays.height} small ones "
                     f"({', '.join(str(m) for m in strays.get_column('mib').unique().to_list()[:3])} MiB) are stray CUDA contexts "
                     "(ranks inferred from pid order)"),
            evidence=procs.get_column("event_id").to_list(),
        ))
    return findings_frame(rows)


_SYSTEM_ERROR = r"unhan\w*led system error|\bncclSystemError\b|NCCL Error 2\b"
# Lines that tie a system error to the network (a socket, a peer, an address): then it is not the
# single host's shared memory. Any NCCL WARN says for itself what failed (its vocabulary row decides).
_NETWORK_WORDING = r"(?i)socket|connect|remote process|no route to host|\bNET/|bootstrap|\d+\.\d+\.\d+\.\d+"


@register("single_host_system_error")
def single_host_system_error(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """ncclSystemError where every line of the job comes from one host and none points at the network."""
    if events.height == 0:
        return findings_frame([])
    errors = events.filter(pl.col("kind").is_in(["nccl.error_raised", "traceback.exception"])
                           & pl.col("message").str.contains(_SYSTEM_ERROR))
    hosts = set(events.get_column("host").drop_nulls().unique().to_list()) | set(job.hosts)
    multi_node = events.filter((pl.col("kind") == "nccl.topology") & pl.col("message").str.contains(r"nNodes [2-9]|nNodes \d{2,}"))
    if errors.height == 0 or len(hosts) != 1 or multi_node.height:
        return findings_frame([])
    explained = events.filter((pl.col("kind") == "nccl.warn") | pl.col("message").str.contains(_NETWORK_WORDING))
    if explained.height:
        return findings_frame([])
    host = next(iter(hosts))
    return findings_frame([finding(
        "nccl-system-error-single-host",
        hosts=[host],
        ranks=errors.get_column("rank").drop_nulls().to_list(),
        confidence=0.5,
        summary=(f"NCCL reports `unhandled system error` and every rank of the job runs on {host}, with no line naming a "
                 "socket or a peer: on one host the system calls NCCL makes are its shared-memory segments in /dev/shm "
                 "(posix_fallocate, mmap), which a container's 64 MB default cannot hold"),
        evidence=errors.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])
