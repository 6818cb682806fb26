"""Cross-host analysis (part of stage 4, detect): one NCCL_SOCKET_IFNAME for hosts whose interfaces differ.

NCCL_SOCKET_IFNAME picks the bootstrap and socket interface by name (a prefix, or an exact name after
`=`). Set once for the whole job (a launcher's `-x NAME=value` / `--env`, an `export` in the batch
script) it must name an interface every host has; NCCL's maintainers say different interface names
across hosts are not supported. When it names a single interface and NCCL fails at init on some of
the job's hosts while the others got past it, the hosts that failed are the ones without that
interface (`enp6s0` on one server, `enp4s0` on the other), not a bug of NCCL.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

# The value of the setting as an env assignment (`NCCL_SOCKET_IFNAME=eth0`) or NCCL's own echo of it
# (`NCCL_SOCKET_IFNAME set by environment to eth0`).
_IFNAME = r"\bNCCL_SOCKET_IFNAME(?:=|\s+set by environment to\s+)['\"]?([^\s'\";]+)"
# A list (`eth0,eth1`) or an exclusion (`^docker`) may match different names on different hosts.
_SINGLE_NAME = r"^=?[A-Za-z][\w.\-]*$"
# NCCL failing at its start: an NCCL error raised to the caller or a message the vocabularies map to
# an init failure, on a line whose host is known.
_INIT_FAILURE_KINDS = ["nccl.error_raised", "vocab.nccl_init_failure", "vocab.wrong_network_interface"]


@register("ifname_differs_across_hosts")
def ifname_differs_across_hosts(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    settings = _job_wide_settings(events)
    if settings.height == 0 or settings.get_column("value").n_unique() != 1:
        return findings_frame([])
    hosts = set(events.get_column("host").drop_nulls().unique().to_list())
    failed = events.filter(pl.col("kind").is_in(_INIT_FAILURE_KINDS) & pl.col("host").is_not_null())
    failed_hosts = set(failed.get_column("host").unique().to_list())
    if len(hosts) < 2 or not failed_hosts or failed_hosts >= hosts:
        return findings_frame([])
    value = settings.get_column("value")[0]
    names = ", ".join(sorted(failed_hosts))
    return findings_frame([finding(
        "nccl-socket-ifname-differs-across-hosts",
        hosts=failed_hosts,
        ranks=failed.get_column("rank").drop_nulls().to_list(),
        confidence=0.6,
        summary=f"NCCL_SOCKET_IFNAME={value} is set for all {len(hosts)} hosts, and NCCL failed at init on "
                f"{names} only: {'that host has' if len(failed_hosts) == 1 else 'those hosts have'} no interface "
                f"of that name",
        evidence=[*settings.get_column("event_id").to_list(), *failed.get_column("event_id").to_list()],
    )])


def _job_wide_settings(events: pl.DataFrame) -> pl.DataFrame:
    """The single-interface NCCL_SOCKET_IFNAME values the job's lines set or NCCL echoed, on any host."""
    return (
        events.filter(pl.col("kind").is_in(["env.assignment", "nccl.env"]))
        .select("event_id", pl.col("message").str.extract(_IFNAME, 1).alias("value"))
        .filter(pl.col("value").str.contains(_SINGLE_NAME))
        .with_columns(pl.col("value").str.strip_prefix("="))
    )
