"""Detect (cross-host analyses): nodes that are not alike, and GPUs shared by several processes.

- `nccl_stack_drift`: the NCCL version or network-plugin presence differs across the hosts of one
  job; the minority hosts are named (on a tie, the hosts without the plugin / on the older version).
- `gpu_process_table`: nvidia-smi's process table shows several processes of one program on one
  GPU, the extra small ones being stray CUDA contexts of other ranks.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

_PLUGIN_LOADED = r"Plugin Path\s*:|Loaded net plugin|P2P plugin|NET/Plugin\s*:\s*Loaded"
_PLUGIN_ABSENT = r"NET/Plugin\s*:?\s*(?:Could not find|No plugin found|Plugin load .* returned)"


@register("nccl_stack_drift")
def nccl_stack_drift(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    nccl = events.filter(pl.col("host").is_not_null() & pl.col("kind").is_in(["nccl.net", "nccl.version"]))
    per_host = nccl.group_by("host").agg(
        pl.col("message").str.contains(_PLUGIN_LOADED).any().alias("plugin"),
        pl.col("message").str.contains(_PLUGIN_ABSENT).any().alias("no_plugin"),
        pl.col("message").str.extract(r"NCCL version (\d+\.\d+\.\d+)").drop_nulls().first().alias("version"),
        pl.col("event_id").min().alias("event_id"),
    )
    rows = []
    plugin_known = per_host.filter(pl.col("plugin") | pl.col("no_plugin"))
    if plugin_known.get_column("plugin").n_unique() > 1:
        with_plugin = plugin_known.filter(pl.col("plugin"))
        without = plugin_known.filter(~pl.col("plugin"))
        odd = without if without.height <= with_plugin.height else with_plugin
        rows.append(finding(
            "nccl-stack-differs-across-hosts",
            hosts=odd.get_column("host").to_list(),
            confidence=0.7,
            summary=(f"network plugin loaded on {', '.join(with_plugin.get_column('host').to_list()[:6])} "
                     f"but not on {', '.join(without.get_column('host').to_list()[:6])}"),
            evidence=plugin_known.get_column("event_id").to_list(),
        ))
    versions = per_host.filter(pl.col("version").is_not_null())
    if versions.get_column("version").n_unique() > 1:
        counts = versions.group_by("version").agg(pl.col("host"), pl.len().alias("n")).sort(["n", "version"])
        odd_hosts = counts.row(0, named=True)["host"]
        rows.append(finding(
            "nccl-stack-differs-across-hosts",
            hosts=odd_hosts,
            confidence=0.8,
            summary="NCCL versions differ across hosts: " + "; ".join(
                f"{v} on {', '.join(h[:4])}" for v, h, _ in counts.iter_rows()
            ),
            evidence=versions.get_column("event_id").to_list(),
        ))
    return findings_frame(rows)


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
