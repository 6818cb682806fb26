"""Stage 4, detect (cross-host analysis "ib_port_state"): HCA ports that are down or slow.

`ibstat` / `ibstatus` output in the job directory (a capture's `node.ibstat.txt`, a health-check
dump) becomes one `node.ib_port` event per port (analyzer/parse/nodestate.py). Whether a port
that is not `Active`/`LinkUp` matters depends on whether the job used it: NCCL names its devices
(`NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ...`). Three findings:

* `ib-port-down-used-by-nccl`: a port NCCL chose on that host is not active (the cause of the
  transport errors and timeouts that follow);
* `ib-port-not-active`: a port is not active and nothing says whether the job used it (context:
  hosts often carry unused ports);
* `ib-port-rate-degraded`: an active port runs slower than the same-named port on the other
  hosts (a link trained down: the whole job runs at that host's pace).
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

_PORT = r"^(?P<ca>\S+) port (?P<port>\d+): state (?P<state>[^,]*), physical state (?P<physical>[^,]*), rate (?P<rate>[^,]*), (?P<layer>.*)$"
_NCCL_DEVICE = r"\[\d+\]\s*([\w.\-]+:\d+)/(?:IB|RoCE)"


def _ports(events: pl.DataFrame) -> pl.DataFrame:
    ports = events.filter(pl.col("kind") == "node.ib_port").select(
        "event_id", "host", pl.col("message").str.extract_groups(_PORT).alias("p")
    ).unnest("p")
    return ports.with_columns(
        pl.concat_str("ca", pl.lit(":"), "port").alias("device"),
        ((pl.col("state").str.to_lowercase() == "active") & pl.col("physical").str.to_lowercase().is_in(["linkup", "?"])).alias("up"),
        pl.col("rate").cast(pl.Float64, strict=False).alias("gbps"),
    )


def _nccl_devices(events: pl.DataFrame) -> pl.DataFrame:
    """(host, device) pairs NCCL said it uses."""
    return (
        events.filter((pl.col("kind") == "nccl.net") & pl.col("message").str.contains("NET/IB ?: ?Using"))
        .select("host", pl.col("message").str.extract_all(_NCCL_DEVICE).alias("device"))
        .explode("device")
        .with_columns(pl.col("device").str.extract(_NCCL_DEVICE, 1))
        .filter(pl.col("device").is_not_null())
        .unique()
    )


def _describe(rows: pl.DataFrame) -> str:
    items = [
        f"{device} on {host or 'an unknown host'} ({state}, {physical})"
        for device, host, state, physical in rows.select("device", "host", "state", "physical").unique().sort("host", "device", nulls_last=True).head(6).iter_rows()
    ]
    more = rows.select("device", "host").unique().height - len(items)
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")


@register("ib_port_state")
def ib_port_state(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    ports = _ports(events)
    if ports.height == 0:
        return findings_frame([])
    used = _nccl_devices(events)
    down = ports.filter(~pl.col("up"))
    rows = []
    if down.height:
        marked = down.join(used.with_columns(pl.lit(True).alias("used")), on=["host", "device"], how="left", nulls_equal=True)
        in_use = marked.filter(pl.col("used").fill_null(False))
        unknown = marked.filter(~pl.col("used").fill_null(False))
        if used.height:  # NCCL named its devices: a down port it did not choose is not this job's problem
            unknown = unknown.filter(~pl.col("host").is_in(used.get_column("host").implode()))
        if in_use.height:
            rows.append(finding(
                "ib-port-down-used-by-nccl", hosts=in_use.get_column("host").drop_nulls(), confidence=0.85,
                summary=f"NCCL uses {_describe(in_use)}: the port is not up",
                evidence=in_use.get_column("event_id"),
            ))
        if unknown.height:
            rows.append(finding(
                "ib-port-not-active", hosts=unknown.get_column("host").drop_nulls(), confidence=0.5,
                summary=f"HCA port(s) not active: {_describe(unknown)}",
                evidence=unknown.get_column("event_id"),
            ))
    rows.extend(_slow_ports(ports))
    return findings_frame(rows)


def _slow_ports(ports: pl.DataFrame) -> list[dict]:
    """Active ports slower than the usual rate of the same device name on the other hosts."""
    active = ports.filter(pl.col("up") & pl.col("gbps").is_not_null() & pl.col("host").is_not_null())
    if active.select("host").n_unique() < 2:
        return []
    usual = active.group_by("device").agg(pl.col("gbps").mode().max().alias("usual"), pl.col("host").n_unique().alias("hosts"))
    slow = active.join(usual, on="device").filter((pl.col("hosts") >= 2) & (pl.col("gbps") < pl.col("usual")))
    if slow.height == 0:
        return []
    items = ", ".join(
        f"{d} on {h} at {g:g} Gb/s (others {u:g})"
        for d, h, g, u in slow.select("device", "host", "gbps", "usual").sort("host", "device").head(6).iter_rows()
    )
    return [finding(
        "ib-port-rate-degraded", hosts=slow.get_column("host"), confidence=0.7,
        summary=f"link trained below its peers: {items}", evidence=slow.get_column("event_id"),
    )]
