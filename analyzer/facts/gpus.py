"""Correlate (physical GPU identity): which GPU of which host each rank ran on, as the logs print it.

Part of stage 3. A device index on a line (`cudaDev 0`, `[0]`, a trace's device) is *logical*: it
counts the GPUs the process sees, so under `CUDA_VISIBLE_DEVICES=1` logical 0 is physical GPU 1.
Cordoning needs the physical GPU, so this module joins what the logs say about it, strongest first:

- NCCL's communicator init line: `cudaDev C nvmlDev N busId B` (NVML index and PCI bus id);
- nccl-tests' `# Using devices` block: `device C [dddd:bb:dd]`;
- the rank's `CUDA_VISIBLE_DEVICES` (an index list or GPU UUIDs), with the logical index into it;
- nvidia-smi read-outs of the host (table rows: index and bus id; `-L`: index and UUID;
  `--query-gpu=index,uuid,pci.bus_id` CSV rows), joined by bus id, else by physical index.

A rank for which none of these is known keeps its logical index with source "logical only".
NCCL prints the bus id as one hex number (`1b000` is 0000:1b:00.0); nvidia-smi as
`00000000:1B:00.0`: both become `dddd:bb:dd.f`, joined on `dddd:bb:dd`.
Frames here are one row per (host, rank, device) or per nvidia-smi GPU, never per line.
"""

from __future__ import annotations

import polars as pl

LOGICAL_ONLY = "logical only"
_OUT = ["host", "gpu", "bus_id", "uuid", "logical_device", "rank", "source"]
_ROW_SCHEMA = {
    "host": pl.String, "rank": pl.Int64, "logical_device": pl.Int64, "nvml_index": pl.String,
    "bus_id": pl.String, "source": pl.String,
}
_SMI_SCHEMA = {"host": pl.String, "smi_index": pl.String, "smi_bus": pl.String, "smi_uuid": pl.String, "smi_source": pl.String}
_SMI_BUS = r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])"
_UUID = r"((?:GPU|MIG)-[0-9A-Za-z-]+)"
# nvidia-smi's table row: `|   1  NVIDIA H200   On  |   00000000:00:07.0 Off |`.
_SMI_TABLE = r"^\|\s+(\d+)\s+[^|]*\|\s+" + _SMI_BUS + r"\s"
_SMI_LIST = r"GPU (\d+):[^(]*\(UUID: " + _UUID + r"\)"
_SMI_CSV = r"^\s*(\d+),\s*" + _UUID + r",\s*" + _SMI_BUS
_VISIBLE = r"CUDA_VISIBLE_DEVICES['\"]?\s*[=:]\s*['\"]?([0-9A-Za-z,\-]+)"


def _where(label: str) -> pl.Expr:
    return pl.format(label + " ({}:{})", "file", "line")


def _nccl_bus(hex_id: pl.Expr) -> pl.Expr:
    """NCCL's `busId 1b000` (the PCI id's hex digits as one number) as `0000:1b:00.0`."""
    digits = hex_id.str.to_lowercase().str.zfill(9)
    n = digits.str.len_chars()
    return pl.format(
        "{}:{}:{}.{}",
        digits.str.slice(0, n - 5).str.slice(-4).str.zfill(4),
        digits.str.slice(n - 5, 2), digits.str.slice(n - 3, 2), digits.str.slice(n - 1, 1),
    )


def _pci_bus(text: pl.Expr) -> pl.Expr:
    """`00000000:1B:00.0` (nvidia-smi) or `0000:1b:00` (nccl-tests) with a four-digit domain."""
    parts = text.str.to_lowercase().str.extract_groups(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})(\.[0-9a-f])?$")
    domain = parts.struct.field("1").str.slice(-4).str.zfill(4)
    return pl.concat_str(domain, pl.lit(":"), parts.struct.field("2"), pl.lit(":"), parts.struct.field("3"),
                         parts.struct.field("4").fill_null(""))


def _bus_key(bus: pl.Expr) -> pl.Expr:
    return bus.str.slice(0, 10)  # dddd:bb:dd: nccl-tests prints no PCI function


def _seen_devices(events: pl.DataFrame) -> pl.DataFrame:
    """What NCCL and nccl-tests printed per (host, rank, logical device)."""
    comm = events.filter((pl.col("kind") == "nccl.comm_init") & pl.col("rank").is_not_null() & pl.col("device").is_not_null())
    tests = events.filter((pl.col("kind") == "nccltests.device") & pl.col("rank").is_not_null())
    frames = [
        comm.select(
            "host", "rank", pl.col("device").alias("logical_device"),
            pl.col("message").str.extract(r"nvmlDev (\d+)").alias("nvml_index"),
            pl.when(pl.col("peer").is_not_null()).then(_nccl_bus(pl.col("peer"))).alias("bus_id"),
            _where("NCCL comm init cudaDev/nvmlDev/busId").alias("source"), "event_id",
        ),
        tests.select(
            "host", "rank", pl.col("device").alias("logical_device"), pl.lit(None, pl.String).alias("nvml_index"),
            _pci_bus(pl.col("message").str.extract(r"\[([0-9A-Fa-f:.]+)\]")).alias("bus_id"),
            _where("nccl-tests device list").alias("source"), "event_id",
        ),
    ]
    seen = pl.concat([f.cast({"logical_device": pl.Int64}) for f in frames], how="vertical")
    # The first line per device names it; a later init of a sub-communicator says the same.
    return seen.sort("event_id").group_by("host", "rank", "logical_device", maintain_order=True).agg(
        pl.col("nvml_index").drop_nulls().first(), pl.col("bus_id").drop_nulls().first(), pl.col("source").first()
    )


def _logical_devices(events: pl.DataFrame, seen: pl.DataFrame) -> pl.DataFrame:
    """Ranks no NCCL or nccl-tests line identifies: the device index their own lines print most."""
    others = events.filter(pl.col("rank").is_not_null() & pl.col("device").is_not_null()).join(
        seen.select("host", "rank"), on=["host", "rank"], how="anti", nulls_equal=True
    )
    return others.group_by("host", "rank").agg(pl.col("device").mode().sort().first().alias("logical_device")).select(
        "host", "rank", "logical_device", pl.lit(None, pl.String).alias("nvml_index"), pl.lit(None, pl.String).alias("bus_id"),
        pl.lit(None, pl.String).alias("source"),
    )


def _visible_devices(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """CUDA_VISIBLE_DEVICES per (host, rank); a host-wide line (no rank) counts where it is the host's only value."""
    lines = events.filter(pl.col("message").str.contains("CUDA_VISIBLE_DEVICES", literal=True)).select(
        "host", "rank", "event_id", pl.col("message").str.extract(_VISIBLE).alias("visible"), _where("CUDA_VISIBLE_DEVICES").alias("visible_source")
    ).filter(pl.col("visible").is_not_null() & pl.col("host").is_not_null()).sort("event_id")
    per_rank = lines.filter(pl.col("rank").is_not_null()).group_by("host", "rank").agg(pl.col("visible", "visible_source").first())
    host_wide = (
        lines.filter(pl.col("rank").is_null()).group_by("host")
        .agg(pl.col("visible").n_unique().alias("n"), pl.col("visible", "visible_source").first())
        .filter(pl.col("n") == 1).drop("n")
        .rename({"visible": "host_visible", "visible_source": "host_visible_source"})
    )
    return per_rank, host_wide


def _smi_gpus(events: pl.DataFrame) -> pl.DataFrame:
    """One row per (host, physical index) from nvidia-smi read-outs: bus id and UUID where printed."""
    msg = pl.col("message")
    lines = events.filter(pl.col("host").is_not_null() & msg.str.contains(r"UUID: GPU-|GPU-|[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:"))
    if lines.height == 0:
        return pl.DataFrame(schema=_SMI_SCHEMA)
    rows = pl.concat([
        lines.select("host", msg.str.extract(_SMI_TABLE, 1).alias("smi_index"), _pci_bus(msg.str.extract(_SMI_TABLE, 2)).alias("smi_bus"),
                     pl.lit(None, pl.String).alias("smi_uuid"), _where("nvidia-smi").alias("smi_source"), "event_id"),
        lines.select("host", msg.str.extract(_SMI_LIST, 1).alias("smi_index"), pl.lit(None, pl.String).alias("smi_bus"),
                     msg.str.extract(_SMI_LIST, 2).alias("smi_uuid"), _where("nvidia-smi -L").alias("smi_source"), "event_id"),
        lines.select("host", msg.str.extract(_SMI_CSV, 1).alias("smi_index"), _pci_bus(msg.str.extract(_SMI_CSV, 3)).alias("smi_bus"),
                     msg.str.extract(_SMI_CSV, 2).alias("smi_uuid"), _where("nvidia-smi query").alias("smi_source"), "event_id"),
    ]).filter(pl.col("smi_index").is_not_null())
    return rows.sort("event_id").group_by("host", "smi_index", maintain_order=True).agg(
        pl.col("smi_bus").drop_nulls().first(), pl.col("smi_uuid").drop_nulls().first(), pl.col("smi_source").first()
    )


def rank_gpus(events: pl.DataFrame) -> pl.DataFrame:
    """One row per (host, rank, logical device): physical index, bus id, UUID and how each was known."""
    need = {"kind", "rank", "host", "device", "message", "peer", "file", "line", "event_id"}
    if events.height == 0 or not need <= set(events.columns):
        return pl.DataFrame(schema={**_ROW_SCHEMA, "gpu": pl.String, "uuid": pl.String})
    seen = _seen_devices(events)
    rows = pl.concat([seen.cast(_ROW_SCHEMA), _logical_devices(events, seen).cast(_ROW_SCHEMA)], how="vertical")
    per_rank, host_wide = _visible_devices(events)
    rows = rows.join(per_rank, on=["host", "rank"], how="left", nulls_equal=True).join(host_wide, on="host", how="left", nulls_equal=True)
    rows = rows.with_columns(
        pl.coalesce("visible", "host_visible").alias("visible"),
        pl.coalesce("visible_source", "host_visible_source").alias("visible_source"),
    )
    entry = pl.col("visible").str.split(",").list.get(pl.col("logical_device"), null_on_oob=True).str.strip_chars()
    rows = rows.with_columns(
        pl.when(entry.str.contains(r"^\d+$")).then(entry).alias("visible_index"),
        pl.when(entry.str.contains(r"^(?:GPU|MIG)-")).then(entry).alias("visible_uuid"),
    ).with_columns(
        pl.when(pl.col("visible_index").is_not_null() | pl.col("visible_uuid").is_not_null()).then(pl.col("visible_source")).alias("visible_source")
    )
    # NVML's index is the physical one; CUDA_VISIBLE_DEVICES indices are CUDA's order, the same on
    # nodes of one GPU model (CUDA_DEVICE_ORDER aside).
    rows = rows.with_columns(pl.coalesce("nvml_index", "visible_index").alias("index"))
    smi = _smi_gpus(events)
    by_bus = smi.select("host", _bus_key(pl.col("smi_bus")).alias("key"), pl.col("smi_index").alias("bus_smi_index"),
                        pl.col("smi_uuid").alias("bus_smi_uuid"), pl.col("smi_bus").alias("bus_smi_bus"), pl.col("smi_source").alias("bus_smi_source")
                        ).filter(pl.col("key").is_not_null()).unique(["host", "key"], keep="first", maintain_order=True)
    by_index = smi.rename({"smi_index": "index"})
    rows = (
        rows.with_columns(_bus_key(pl.col("bus_id")).alias("key"))
        .join(by_bus, on=["host", "key"], how="left")
        .join(by_index, on=["host", "index"], how="left")
        .with_columns(
            pl.coalesce("index", "bus_smi_index").alias("index"),
            pl.coalesce("bus_id", "bus_smi_bus", "smi_bus").alias("bus_id"),
            pl.coalesce("visible_uuid", "bus_smi_uuid", "smi_uuid").alias("uuid"),
            pl.coalesce("bus_smi_source", "smi_source").alias("smi_source"),
        )
    )
    source = pl.concat_str("source", "visible_source", "smi_source", separator="; ", ignore_nulls=True)
    physical = pl.col("index").is_not_null() | pl.col("bus_id").is_not_null() | pl.col("uuid").is_not_null()
    return rows.select(
        "host", "rank", "logical_device", pl.coalesce("index", "bus_id", "uuid").alias("gpu"), "bus_id", "uuid",
        pl.when(physical).then(source).otherwise(pl.lit(LOGICAL_ONLY)).alias("source"),
    ).sort("host", "rank", "logical_device", nulls_last=True)


def culprit_gpus(events: pl.DataFrame, ranks: list[int], hosts: list[str], evidence: list[int]) -> list[dict]:
    """The culprits' GPUs: each culprit rank's own device(s); without culprit ranks, the devices the
    verdict's evidence lines from a culprit host name (their ranks' GPUs, or the GPU of a PCI bus id such
    as an Xid line's). Nothing when no culprit is named."""
    if not (ranks or hosts) or events.height == 0:
        return []
    table = rank_gpus(events)
    if ranks:
        chosen = table.filter(pl.col("rank").is_in(ranks))
    else:
        lines = events.filter(pl.col("event_id").is_in(evidence) & pl.col("host").is_in(hosts))
        chosen = table.join(lines.select("host", "rank").unique(), on=["host", "rank"], how="semi").select(_OUT)
        chosen = pl.concat([chosen, _evidence_bus_ids(lines, table, _smi_gpus(events)).select(_OUT)], how="vertical").unique(maintain_order=True)
    return chosen.select(_OUT).to_dicts()


def _evidence_bus_ids(lines: pl.DataFrame, table: pl.DataFrame, smi: pl.DataFrame) -> pl.DataFrame:
    """A PCI bus id printed on an evidence line (`Xid (PCI:0000:1b:00): 79`) names a physical GPU: the
    rank's GPU with that bus id on the host where NCCL or nccl-tests named one, else the index
    nvidia-smi prints beside that bus id on the host, else the bus id itself."""
    found = lines.select(
        "host", _pci_bus(pl.col("message").str.extract(r"PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)")).alias("bus_id"),
        _where("PCI bus id on the evidence line").alias("source"),
    ).filter(pl.col("bus_id").is_not_null()).with_columns(_bus_key(pl.col("bus_id")).alias("key"))
    known = table.filter(pl.col("bus_id").is_not_null()).with_columns(_bus_key(pl.col("bus_id")).alias("key"))
    of_ranks = known.join(found.select("host", "key").unique(), on=["host", "key"], how="semi").select(_OUT)
    by_bus = smi.filter(pl.col("smi_bus").is_not_null()).select(
        "host", _bus_key(pl.col("smi_bus")).alias("key"), "smi_index", "smi_uuid", "smi_source"
    ).unique(["host", "key"], keep="first", maintain_order=True)
    alone = (
        found.join(known.select("host", "key"), on=["host", "key"], how="anti")
        .unique(["host", "key"], keep="first", maintain_order=True)
        .join(by_bus, on=["host", "key"], how="left")
    )
    return pl.concat([of_ranks, alone.select(
        "host", pl.coalesce("smi_index", "bus_id").alias("gpu"), "bus_id", pl.col("smi_uuid").alias("uuid"),
        pl.lit(None, pl.Int64).alias("logical_device"), pl.lit(None, pl.Int64).alias("rank"),
        pl.concat_str("source", "smi_source", separator="; ", ignore_nulls=True).alias("source"),
    )], how="vertical")


def gpu_label(gpu: dict) -> str:
    """`host/gpu1` for a physical index, `host/0000:1b:00.0` for a bus id, else `host/cuda0 (logical only)`."""
    host = gpu.get("host") or "?"
    if gpu.get("source") == LOGICAL_ONLY:
        return f"{host}/cuda{gpu.get('logical_device')} ({LOGICAL_ONLY})"
    value = gpu.get("gpu")
    return f"{host}/gpu{value}" if value is not None and str(value).isdigit() else f"{host}/{value}"
