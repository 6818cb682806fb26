"""Benchmark of the per-host facts table and the drift analyses on a large synthetic event frame.

    python bench/bench_hostfacts.py                     # 512 hosts x 8 ranks, 32 channels
    python bench/bench_hostfacts.py --hosts 2048 --channels 16

The frame is what correlate hands to detect for a job whose every rank logged NCCL INFO init:
version, driver, plugin, network, addresses, a few `set by environment` lines, its comm line and
`channels x 2` transport lines per peer (the part that grows with ranks x channels). One host in
64 runs another NCCL version and lacks the plugin, so the analyses have something to name. It
prints the events, then seconds for each step (one run; the facts are computed once per frame).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzer.analyses import JobContext  # noqa: E402
from analyzer.analyses.environment import (  # noqa: E402
    driver_drift,
    env_drift,
    gpu_heterogeneity,
    identical_hostnames,
    nccl_stack_drift,
    torch_drift,
)
from analyzer.events import EVENT_SCHEMA  # noqa: E402
from analyzer.facts.hostfacts import derive_host_facts, fact_table, host_fact_records  # noqa: E402


def synthetic_events(hosts: int, per_host: int, channels: int) -> pl.DataFrame:
    ranks = pl.DataFrame({"rank": list(range(hosts * per_host))}).with_columns(
        (pl.col("rank") // per_host).alias("h"),
        (pl.lit(10_000) + pl.col("rank")).alias("pid"),
    ).with_columns(
        (pl.lit("node-") + pl.col("h").cast(pl.String).str.zfill(5)).alias("host"),
        (pl.col("h") % 64 == 7).alias("odd"),
    )
    odd = pl.col("odd")
    init = [
        ("nccl.net", pl.lit("Bootstrap : Using ib0:10.") + (pl.col("h") // 250).cast(pl.String) + "." + (pl.col("h") % 250).cast(pl.String) + pl.lit(".1<0>")),
        ("nccl.cuda_driver", pl.lit("cudaDriverVersion 12040")),
        ("nccl.version", pl.when(odd).then(pl.lit("NCCL version 2.18.1+cuda12.1")).otherwise(pl.lit("NCCL version 2.19.3+cuda12.2"))),
        ("nccl.net", pl.when(odd).then(pl.lit("NET/Plugin : No plugin found (libnccl-net.so), using internal implementation"))
         .otherwise(pl.lit("Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"))),
        ("nccl.env", pl.lit("NCCL_SOCKET_IFNAME set by environment to ib0")),
        ("nccl.env", pl.lit("NCCL_IB_HCA set by environment to mlx5")),
        ("nccl.net", pl.lit("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:10.") + (pl.col("h") // 250).cast(pl.String) + "." + (pl.col("h") % 250).cast(pl.String) + pl.lit(".1<0>")),
        ("nccl.net", pl.lit("Using network IBext")),
    ]
    frames = [
        ranks.select("host", "pid", "rank", pl.lit(kind).alias("kind"), message.alias("message"), pl.lit(i, dtype=pl.Int64).alias("line"))
        for i, (kind, message) in enumerate(init)
    ]
    world = hosts * per_host
    frames.append(ranks.select(
        "host", "pid", "rank", pl.lit("nccl.comm_init").alias("kind"),
        (pl.lit("comm 0x1 rank ") + pl.col("rank").cast(pl.String) + pl.lit(f" nranks {world} cudaDev ")
         + (pl.col("rank") % per_host).cast(pl.String) + pl.lit(" busId 1000 - Init COMPLETE")).alias("message"),
        pl.lit(20, dtype=pl.Int64).alias("line"),
    ))
    channel = pl.DataFrame({"channel": list(range(channels))})
    peers = ranks.join(channel, how="cross").with_columns(
        ((pl.col("rank") + 1) % world).alias("next"),
        (pl.col("rank") % per_host == per_host - 1).alias("leaves"),
    )
    frames.append(peers.select(
        "host", "pid", "rank", pl.lit("nccl.transport").alias("kind"),
        (pl.lit("Channel ") + pl.col("channel").cast(pl.String).str.zfill(2) + pl.lit("/0 : ") + pl.col("rank").cast(pl.String)
         + pl.lit("[0] -> ") + pl.col("next").cast(pl.String) + pl.lit("[0] ")
         + pl.when(pl.col("leaves")).then(pl.lit("[send] via NET/IBext/0/GDRDMA")).otherwise(pl.lit("via P2P/IPC/read"))).alias("message"),
        (pl.lit(100) + pl.col("channel")).cast(pl.Int64).alias("line"),
    ))
    frames.append(frames[-1].with_columns(pl.col("message").str.replace("[send]", "[receive]", literal=True), pl.col("line") + 1000))
    events = pl.concat(frames, how="vertical").with_columns(
        (pl.lit("logs/") + pl.col("host") + pl.lit(".log")).alias("file"),
        pl.col("message").alias("text"),
    )
    missing = [name for name in EVENT_SCHEMA if name not in events.columns]
    events = events.with_columns([pl.lit(None, dtype=EVENT_SCHEMA[name]).alias(name) for name in missing])
    events = events.select([pl.col(name).cast(dtype) for name, dtype in EVENT_SCHEMA.items()])
    return events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--channels", type=int, default=32)
    args = parser.parse_args()
    events = synthetic_events(args.hosts, args.per_host, args.channels)
    world = args.hosts * args.per_host
    facts = derive_host_facts(events)
    job = JobContext(world_size=world, ranks=tuple(range(world)),
                     rank_hosts={r: f"node-{r // args.per_host:05d}" for r in range(world)}, host_facts=facts)
    print(f"{events.height:,} events, {args.hosts} hosts, {world} ranks")
    steps = [
        ("facts (observations, units, hosts)", lambda: derive_host_facts(events)),
        ("fact_table", lambda: fact_table(facts)),
        ("host_fact_records", lambda: host_fact_records(facts)),
        *[(fn.__name__, lambda fn=fn: fn(events, job)) for fn in
          (nccl_stack_drift, env_drift, driver_drift, torch_drift, identical_hostnames, gpu_heterogeneity)],
    ]
    for name, step in steps:
        start = time.perf_counter()
        out = step()
        size = getattr(out, "height", None) if not isinstance(out, list) else len(out)
        print(f"{name:38} {time.perf_counter() - start:7.3f} s   ({size} rows)")


if __name__ == "__main__":
    main()
