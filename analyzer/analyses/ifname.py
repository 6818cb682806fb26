"""Cross-host analyses (part of stage 4, detect): the network interfaces NCCL uses between hosts.

`ifname_differs_across_hosts`: one NCCL_SOCKET_IFNAME for hosts whose interfaces differ.

NCCL_SOCKET_IFNAME picks the bootstrap and socket interface by name (a prefix, or an exact name after
`=`). Set once for the whole job (a launcher's `-x NAME=value` / `--env`, an `export` in the batch
script) it must name an interface every host has; NCCL's maintainers say different interface names
across hosts are not supported. When it names a single interface and NCCL fails at init on some of
the job's hosts while the others got past it, the hosts that failed are the ones without that
interface (`enp6s0` on one server, `enp4s0` on the other), not a bug of NCCL.

`virtual_interface_selected`: NCCL's bootstrap or socket interface list names a container / virtual
interface (veth, docker, a bridge, loopback), whose addresses other hosts cannot reach. Only a cause
between hosts: on a job the logs show to run on one host (`shown_single_host`: `nNodes 1`, an nccl-tests
device table, or every bootstrap on a loopback address with nothing failing) the ranks reach each
other through P2P / SHM and the bootstrap's own addresses, so the list is harmless there.
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


# NCCL's interface list naming a container/virtual interface or loopback (`NET/Socket : Using
# [0]ens5:172.31.0.137<0> [1]veth75fa783:fe80::...`, `Bootstrap : Using [0]docker0:172.17.0.1<0>`;
# NCCL 2.2-2.3 print one interface a line, `NET : Using interface lo:127.0.0.1<0>`).
_VIRTUAL_INTERFACE = (r"(?:Bootstrap|NET/Socket|NET) ?: ?Using(?: interface)?.*(?:^|[\]\s])"
                      r"(?:veth\w*|docker\d*|virbr\d*|br-[0-9a-f]+|cni\d*|flannel[\w.]*|lo):")
# The same list pasted one entry a line under its `NET/Socket : Using` head (kind nccl.interface).
_VIRTUAL_ENTRY = r"^\s*\[\d+\](?:veth\w*|docker\d*|virbr\d*|br-[0-9a-f]+|cni\d*|flannel[\w.]*|lo):"
_LIST_HEAD = r"(?:Bootstrap|NET/Socket) ?: ?Using\s*$"
_NODES = r"\bnNodes (\d+)"
# A connection through the network transport: the job spans hosts (or was made to use the network).
_NET_PATH = r"via (?:NET|COLLNET)/"
MAX_EVIDENCE = 12
# NCCL's bootstrap interface (`Bootstrap : Using lo:127.0.0.1<0>`, `Bootstrap: Using [0]lo:127.0.0.1<0>`).
_BOOTSTRAP = r"Bootstrap ?: ?Using\b"
_LOOPBACK_BOOTSTRAP = r"Bootstrap ?: ?Using (?:\[\d+\])?[\w.\-]+:(?:127\.\d+\.\d+\.\d+|::1)<\d+>\s*$"
# A job where some rank could not reach another, or NCCL failed at init or a collective timed out.
_CONNECT_FAILURE_KINDS = ["nccl.error_raised", "nccl.last_error", "vocab.network_unreachable_or_firewall",
                          "vocab.wrong_network_interface", "vocab.nccl_init_failure", "vocab.nccl_timeout"]


@register("virtual_interface_selected")
def virtual_interface_selected(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    hits = events.filter((pl.col("kind") == "nccl.net") & pl.col("message").fill_null("").str.contains(_VIRTUAL_INTERFACE))
    hits = pl.concat([hits, _virtual_entries(events)]).unique("event_id", keep="first").sort("event_id")
    if hits.height == 0 or shown_single_host(events, job):
        return findings_frame([])
    hosts = hits.get_column("host").drop_nulls().unique().sort().to_list()
    where = f" on host{'s' if len(hosts) > 1 else ''} {', '.join(hosts[:8])}" if hosts else ""
    return findings_frame([finding(
        "nccl-virtual-interface-selected",
        hosts=hosts,
        confidence=0.7,
        summary=f"{hits.height} NCCL interface line{'s' if hits.height != 1 else ''}{where}: {hits.get_column('message')[0][:300]}",
        evidence=hits.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])


def _virtual_entries(events: pl.DataFrame) -> pl.DataFrame:
    """Entry lines (`[3]veth1a2b:fe80::1%veth1a2b<0>`) of an interface list whose `... : Using` head
    ends its own line, in a file that holds such a head: the list NCCL printed, one entry a line."""
    heads = events.filter((pl.col("kind") == "nccl.net") & pl.col("message").fill_null("").str.contains(_LIST_HEAD))
    entries = events.filter((pl.col("kind") == "nccl.interface") & pl.col("message").fill_null("").str.contains(_VIRTUAL_ENTRY))
    return entries.filter(pl.col("file").is_in(heads.get_column("file").implode()))


def shown_single_host(events: pl.DataFrame, job: JobContext) -> bool:
    """The logs state that every rank ran on one host, not merely that one host's lines were posted:
    NCCL's `nNodes 1`, an nccl-tests device table (which lists every rank of the test) or bootstraps on
    loopback only (`_bootstrap_on_loopback`), a single host name in the job, no `nNodes` above 1 and no
    connection through NET / COLLNET."""
    hosts = set(events.get_column("host").drop_nulls().unique().to_list()) | set(job.hosts)
    if len(hosts) != 1:
        return False
    kind, message = pl.col("kind"), pl.col("message").fill_null("")
    nodes = events.filter(kind == "nccl.topology").get_column("message").str.extract(_NODES, 1).cast(pl.Int64, strict=False).drop_nulls()
    if (nodes > 1).any() or events.filter((kind == "nccl.transport") & message.str.contains(_NET_PATH)).height:
        return False
    return bool((nodes == 1).any()) or events.filter(kind == "nccltests.device").height > 0 or _bootstrap_on_loopback(events)


def _bootstrap_on_loopback(events: pl.DataFrame) -> bool:
    """Every `Bootstrap : Using` line names a loopback address and nothing failed to connect, init or
    time out. A rank's bootstrap listens on that address and the root's is the one in the unique id
    every rank dials: 127.x / ::1 is reachable from its own host only (`NCCL_SOCKET_IFNAME=^docker0`
    lists `lo` first), so a job whose ranks all bootstrapped there and got on is one host's. Ranks on
    another host would have failed to reach it, and the interface is then the cause."""
    kind, message = pl.col("kind"), pl.col("message").fill_null("")
    bootstrap = events.filter((kind == "nccl.net") & message.str.contains(_BOOTSTRAP)).get_column("message")
    if bootstrap.len() == 0 or not bootstrap.str.contains(_LOOPBACK_BOOTSTRAP).all():
        return False
    return events.filter(kind.is_in(_CONNECT_FAILURE_KINDS) | kind.str.starts_with("watchdog.")).height == 0
