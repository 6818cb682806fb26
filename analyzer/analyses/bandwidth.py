"""Stage 4, detect (analysis "nccl_tests_bandwidth"): nccl-tests results against the hardware.

The runbook's first measurement is `all_reduce_perf` and its bus bandwidth (busbw): the per-link
figure nccl-tests derives so that it compares with the link's peak. A run is judged on its best
large-message busbw (rows of at least `large_message_bytes`, the plateau of the curve; smaller
rows measure latency) in three ways:

* against the expectation for its transport, from the job's own evidence: a run on one host uses
  NVLink, NVLS, P2P over PCIe or SHM (NCCL INFO `via P2P/...`, `via SHM`, NVLS lines; otherwise
  the GPU model's link), a run over several hosts uses NET/IB (per NIC: the port rate `ibstat` /
  `ibv_devinfo` print, times the NICs NCCL lists) or NET/Socket (the `ethtool` speed). The
  figures are data, `hardware/bandwidth.toml`, each row with its reference. Far below it (under
  `far_below` of the expectation): `nccltests-busbw-below-expected`, or
  `nccltests-busbw-below-expected-ib` when the slow link is InfiniBand/RoCE;
* against its peers: among several runs of one test on the same GPU model and rank count, a run
  under `peer_fraction` of the others' median: `nccltests-run-slower-than-peers` (`-ib` for runs
  over InfiniBand/RoCE), naming the hosts found only in slow runs (the slow host of per-host runs,
  the host common to slow pairs);
* against itself: a curve whose large-message busbw collapses under `collapse_fraction` of its
  best at smaller sizes (a healthy curve rises and plateaus): `nccltests-busbw-collapses`.

And `#wrong` above 0 or `Out of bounds values` above 0: the collective returned wrong data,
`nccltests-wrong-results`. A run of one rank (busbw is 0 by definition) or without large messages
is not judged. Failure lines are not this analysis': the parser emits them as `nccl.error_raised`
/ `cuda.error` events, which the catalogue's NCCL and CUDA signatures read.
"""

from __future__ import annotations

import json
import re
import tomllib
from functools import cache

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.parse.nccltests import results_frame, runs_frame
from analyzer.resources import data_dir

MAX_EVIDENCE = 12
_IB_DEVICE = r"\[\d+\]\s*[\w.\-]+:\d+/(?:IB|RoCE)"
_PORT_RATE = r"state Active, physical state (?:LinkUp|\?), rate ([\d.]+)"
_ETH_SPEED = r"^(\S+): speed (\d+)\s*Mb/s"
_SOCKET_IFACE = r"NET/Socket ?: ?Using \[\d+\]([\w.\-]+):"


@cache
def expectations() -> dict:
    """The expected-bandwidth table (hardware/bandwidth.toml)."""
    return tomllib.loads((data_dir("hardware") / "bandwidth.toml").read_text(encoding="utf-8"))


def gpu_row(gpu: str | None) -> dict | None:
    """The table's row for a GPU name (`NVIDIA H100 80GB HBM3`), first match wins."""
    if not gpu:
        return None
    return next((row for row in expectations()["gpu"] if re.search(row["pattern"], gpu)), None)


def transport_row(row_id: str) -> dict:
    return next(row for row in expectations()["transport"] if row["id"] == row_id)


def expected_busbw(transport: str, gpu: str | None, *, nvls: bool = False, ib_gbps: float | None = None,
                   ib_nics: int = 1, eth_mbps: float | None = None) -> tuple[float | None, str]:
    """(expected large-message busbw in GB/s or None, the basis in words) for a transport and GPU."""
    table = expectations()
    row = gpu_row(gpu)
    if transport == "net-ib":
        if ib_gbps is None:
            return None, "InfiniBand/RoCE of unknown port rate"
        t = transport_row("net-ib")
        return t["per_gbps"] * ib_gbps * ib_nics, f"{ib_nics} x {ib_gbps:g} Gb/s InfiniBand/RoCE port(s)"
    if transport == "net-socket":
        if eth_mbps is None:
            return None, "TCP sockets over a NIC of unknown speed"
        return transport_row("net-socket")["per_gbps"] * eth_mbps / 1000, f"TCP sockets over a {eth_mbps:g} Mb/s NIC"
    if row is None:
        return None, "a GPU model the table does not know"
    pcie_gen = row.get("pcie_gen")
    if transport in ("p2p", "nvlink") and "busbw" in row:
        if nvls and "nvls_busbw" in row:
            return row["nvls_busbw"], f"{row['link']} with NVLink SHARP"
        return row["busbw"], row["link"]
    pcie = next((t for t in table["transport"] if t.get("pcie_gen") == pcie_gen), None) if pcie_gen else None
    if transport == "shm":
        if pcie is None:
            return None, "SHM on a GPU of unknown PCIe generation"
        return pcie["busbw"] * transport_row("shm")["share_of_pcie"], f"SHM staged through host memory (PCIe Gen{pcie_gen})"
    if pcie:
        return pcie["busbw"], f"P2P over {row['link']}"
    return None, "a link the table does not know"


def _run_transport(events: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """Per run: the transport the evidence in its file (or, else, the job) shows, and NVLS use."""
    msg = pl.col("message")
    nccl = events.filter(pl.col("source") == "nccl").select("file", "message")
    flags = nccl.group_by("file").agg(
        msg.str.contains(r"via NET/IB|NET/IB ?: ?Using \[|Using network IB").any().alias("ib"),
        msg.str.contains(r"via NET/Socket|Using network Socket").any().alias("socket"),
        msg.str.contains(r"via SHM").any().alias("shm"),
        msg.str.contains(r"via P2P").any().alias("p2p"),
        msg.str.contains(r"NVLS|nvls channels [1-9]").any().alias("nvls"),
        msg.str.extract_all(_IB_DEVICE).list.len().max().alias("ib_nics"),
    )
    job = flags.select(pl.exclude("file").max()) if flags.height else None
    runs = runs.join(flags, on="file", how="left")
    if job is not None:  # evidence printed by another file of the job (the rank logs next to the table)
        runs = runs.with_columns(*[pl.coalesce(c, pl.lit(job.get_column(c)[0])).alias(c) for c in job.columns])
    multi = pl.col("hosts").list.len() > 1
    transport = (
        pl.when(multi & pl.col("socket").fill_null(False) & ~pl.col("ib").fill_null(False)).then(pl.lit("net-socket"))
        .when(multi).then(pl.lit("net-ib"))
        .when(pl.col("shm").fill_null(False) & ~pl.col("p2p").fill_null(False)).then(pl.lit("shm"))
        .otherwise(pl.lit("p2p"))
    )
    return runs.with_columns(transport.alias("transport"), pl.col("nvls").fill_null(False), pl.col("ib_nics").fill_null(0))


def _link_speeds(events: pl.DataFrame) -> tuple[dict, dict]:
    """Per host: its fastest active HCA port rate (Gb/s), and the speed (Mb/s) of the interface NCCL's
    sockets use (`NET/Socket : Using [0]eth0:...`), else of its fastest interface: a host's spare
    slow port is not the job's link."""
    ports = events.filter(pl.col("kind") == "node.ib_port").select(
        "host", pl.col("message").str.extract(_PORT_RATE, 1).cast(pl.Float64, strict=False).alias("gbps")
    ).drop_nulls("gbps").group_by("host").agg(pl.col("gbps").max())
    used = events.filter(pl.col("kind").str.starts_with("nccl.")).select(
        "host", pl.col("message").str.extract(_SOCKET_IFACE, 1).alias("iface")).drop_nulls().unique()
    eth = events.filter(pl.col("kind") == "node.eth_speed").select(
        "host", pl.col("message").str.extract(_ETH_SPEED, 1).alias("iface"),
        pl.col("message").str.extract(_ETH_SPEED, 2).cast(pl.Float64, strict=False).alias("mbps"),
    ).drop_nulls("mbps")
    chosen = eth.join(used.with_columns(pl.lit(True).alias("_used")), on=["host", "iface"], how="left")
    chosen = chosen.filter(pl.col("_used").fill_null(False).any().over("host").not_() | pl.col("_used").fill_null(False))
    return dict(ports.iter_rows()), dict(chosen.group_by("host").agg(pl.col("mbps").max()).iter_rows())


def _cross_numa(events: pl.DataFrame) -> dict[str, list[str]]:
    """Per host: the GPUs `nvidia-smi topo -m` shows reaching every NIC only through SYS."""
    rows = events.filter((pl.col("kind") == "node.topology") & (pl.col("severity") == "warning"))
    return {h: sorted(g) for h, g in rows.group_by("host").agg(pl.col("detail").unique()).iter_rows() if h}


def _peaks(results: pl.DataFrame, large: int) -> pl.DataFrame:
    """Per run: best large-message busbw, best busbw below the large sizes, the rows that show it."""
    best = pl.max_horizontal(pl.col("oop_busbw"), pl.col("ip_busbw"))
    return results.with_columns(best.alias("busbw"), (pl.col("size") >= large).alias("large")).group_by("run").agg(
        pl.col("busbw").filter(pl.col("large")).max().alias("peak"),
        pl.col("busbw").filter(~pl.col("large")).max().alias("small_peak"),
        pl.col("size").filter(pl.col("large")).max().alias("largest"),
        pl.col("event_id").filter(pl.col("large")).alias("large_events"),
        pl.col("event_id").filter(pl.col("oop_wrong").fill_null(0) + pl.col("ip_wrong").fill_null(0) > 0).alias("wrong_events"),
        pl.col("size").filter(pl.col("oop_wrong").fill_null(0) + pl.col("ip_wrong").fill_null(0) > 0).alias("wrong_sizes"),
        (pl.col("oop_wrong").fill_null(0) + pl.col("ip_wrong").fill_null(0)).sum().alias("wrong"),
    )


def judged_runs(events: pl.DataFrame) -> pl.DataFrame:
    """One row per nccl-tests run: transport, peaks, and the expectation (`expected`, `basis`, the
    hosts' link figures `links`) the evidence gives; the report's curve draws the same line."""
    runs = runs_frame(events)
    if runs.height == 0:
        return runs
    table = expectations()
    runs = _run_transport(events, runs).join(_peaks(results_frame(events), table["large_message_bytes"]), on="run", how="left")
    runs = runs.with_columns(pl.col("gpus").list.first().alias("gpu"), pl.col("nranks").fill_null(0))
    ports, eth = _link_speeds(events)
    expected, basis, links = [], [], []
    for run in runs.iter_rows(named=True):
        hosts = _hosts_of(run)
        known = {h: ports[h] for h in hosts if h in ports} if run["transport"] == "net-ib" else {h: eth[h] for h in hosts if h in eth}
        best = max(known.values()) if known else None
        figure, words = expected_busbw(
            run["transport"], run["gpu"], nvls=run["nvls"] and run["transport"] == "p2p",
            ib_gbps=best, ib_nics=max(int(run["ib_nics"] or 0), 1), eth_mbps=best,
        )
        expected.append(figure)
        basis.append(words)
        links.append(json.dumps(known))
    return runs.with_columns(pl.Series("expected", expected, dtype=pl.Float64), pl.Series("basis", basis, dtype=pl.String),
                             pl.Series("links", links, dtype=pl.String))


@register("nccl_tests_bandwidth")
def nccl_tests_bandwidth(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    runs = judged_runs(events)
    if runs.height == 0:
        return findings_frame([])
    table = expectations()
    rows: list[dict] = []
    rows.extend(_wrong_results(events, runs))
    # One rank has no bus (busbw 0 by definition); a run without large messages measured latency.
    judged = runs.filter((pl.col("nranks") != 1) & pl.col("peak").is_not_null() & (pl.col("peak") > 0))
    rows.extend(_below_expected(judged, table["far_below"], _cross_numa(events)))
    rows.extend(_slower_than_peers(judged, table["peer_fraction"]))
    rows.extend(_collapses(judged, table["collapse_fraction"]))
    return findings_frame(rows)


def _hosts_of(run: dict) -> list[str]:
    return [h for h in (run.get("hosts") or []) if h]


def _label(run: dict) -> str:
    test = run.get("test") or "nccl-tests"
    hosts = _hosts_of(run)
    where = f" on {', '.join(hosts[:6])}" if hosts else ""
    return f"{test} ({run['file']}{where})"


def _below_expected(runs: pl.DataFrame, far_below: float, cross_numa: dict) -> list[dict]:
    """The expectation of a network run is its hosts' best link: a host whose link is a fraction of
    the others' (a NIC that negotiated 100 Mb/s, a port trained down) is the one named."""
    rows = []
    for run in runs.iter_rows(named=True):
        hosts = _hosts_of(run)
        expected, basis, links = run["expected"], run["basis"], json.loads(run["links"])
        if expected is None or run["peak"] >= far_below * expected:
            continue
        best = max(links.values()) if links else None
        slow_links = {h: v for h, v in links.items() if v < far_below * best}
        named = sorted(slow_links) or hosts
        unit = "Gb/s" if run["transport"] == "net-ib" else "Mb/s"
        why = "".join(f"; {h}'s link runs at {v:g} {unit} (best {best:g})" for h, v in sorted(slow_links.items()))
        why += "".join(f"; on {h} GPU(s) {', '.join(g)} reach every NIC only through SYS (across NUMA nodes)"
                       for h, g in sorted(cross_numa.items()) if h in named and run["transport"] == "net-ib")
        ib = run["transport"] == "net-ib"
        rows.append(finding(
            "nccltests-busbw-below-expected-ib" if ib else "nccltests-busbw-below-expected",
            hosts=named, confidence=0.8 if slow_links else (0.75 if links or not ib else 0.6),
            summary=(f"{_label(run)}: best large-message busbw {run['peak']:g} GB/s, "
                     f"{run['peak'] / expected:.0%} of the {expected:g} GB/s expected for {basis}{why}"),
            evidence=[run["event_id"], *(run["large_events"] or [])][:MAX_EVIDENCE],
        ))
    return rows


def _slower_than_peers(runs: pl.DataFrame, fraction: float) -> list[dict]:
    """Runs of one test, GPU model and rank count, far below the median of the others."""
    kind = [pl.col("test").fill_null(""), pl.col("gpu").fill_null(""), pl.col("nranks"), pl.col("largest")]
    peers = runs.with_columns(
        pl.len().over(kind).alias("_n"),
        ((pl.col("peak").sum().over(kind) - pl.col("peak")) / (pl.len().over(kind) - 1)).alias("_others"),
        pl.col("peak").median().over(kind).alias("_median"),
    ).filter(pl.col("_n") >= 2)
    slow = peers.filter(pl.col("peak") < fraction * pl.max_horizontal("_median", "_others"))
    if slow.height == 0:
        return []
    healthy_hosts = set(peers.filter(pl.col("peak") >= fraction * pl.col("_median")).get_column("hosts").explode().drop_nulls())
    rows = []
    for run in slow.iter_rows(named=True):
        hosts = _hosts_of(run)
        culprits = [h for h in hosts if h not in healthy_hosts] or hosts
        network = run["transport"] in ("net-ib", "net-socket")
        link = {"net-ib": "InfiniBand/RoCE", "net-socket": "TCP sockets"}.get(run["transport"]) or run["basis"] or "its intra-node link"
        rows.append(finding(
            "nccltests-run-slower-than-peers-ib" if run["transport"] == "net-ib" else "nccltests-run-slower-than-peers",
            hosts=culprits, confidence=0.8 if len(culprits) < len(hosts) or len(hosts) == 1 else 0.6,
            summary=(f"{_label(run)}: best large-message busbw {run['peak']:g} GB/s, {run['peak'] / run['_median']:.0%} of the "
                     f"{run['_median']:g} GB/s median of {run['_n']} comparable runs over {link}; "
                     f"slow host(s): {', '.join(culprits) or 'unknown'}"
                     + (" (the host common to the slow runs and absent from the fast ones)" if network and len(culprits) < len(hosts) else "")),
            evidence=[run["event_id"], *(run["large_events"] or [])][:MAX_EVIDENCE],
        ))
    return rows


def _collapses(runs: pl.DataFrame, fraction: float) -> list[dict]:
    collapsed = runs.filter(pl.col("small_peak").is_not_null() & (pl.col("peak") < fraction * pl.col("small_peak")))
    return [finding(
        "nccltests-busbw-collapses", hosts=_hosts_of(run), confidence=0.6,
        summary=(f"{_label(run)}: busbw falls to {run['peak']:g} GB/s at large messages after reaching "
                 f"{run['small_peak']:g} GB/s at smaller ones (a healthy curve plateaus)"),
        evidence=[run["event_id"], *(run["large_events"] or [])][:MAX_EVIDENCE],
    ) for run in collapsed.iter_rows(named=True)]


def _wrong_results(events: pl.DataFrame, runs: pl.DataFrame) -> list[dict]:
    oob = events.filter(pl.col("kind") == "nccltests.out_of_bounds").select("event_id", pl.col("pg").alias("run"))
    bad = runs.filter((pl.col("wrong").fill_null(0) > 0) | pl.col("run").is_in(oob.get_column("run").implode()))
    rows = []
    for run in bad.iter_rows(named=True):
        extra = oob.filter(pl.col("run") == run["run"]).get_column("event_id").to_list()
        sizes = run["wrong_sizes"] or []
        what = f"{int(run['wrong'])} wrong elements at size(s) {', '.join(map(str, sizes[:6]))}" if sizes else \
            f"Out of bounds values: {run['out_of_bounds']}"
        rows.append(finding(
            "nccltests-wrong-results", hosts=_hosts_of(run), confidence=0.8,
            summary=f"{_label(run)}: the collective returned wrong data ({what})",
            evidence=[*(run["wrong_events"] or []), *extra][:MAX_EVIDENCE],
        ))
    return rows
