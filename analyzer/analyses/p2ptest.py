"""Stage 4, detect (analysis "p2p_test"): what the CUDA samples' peer-to-peer tests say of the GPU links.

p2pBandwidthLatencyTest measures every ordered pair of GPUs twice: with peer access disabled (the
copy is staged through host memory) and enabled (the GPUs write to each other over NVLink or PCIe).
Where the runtime grants peer access the direct path is the faster one; a pair whose P2P=Enabled
figure is a fraction of its P2P=Disabled one has a broken peer path (an IOMMU translating or
faulting the peer DMA, PCIe ACS redirecting it through the root complex, a bad NVLink):
`p2ptest-peer-bandwidth-collapsed`. The sample prints a matrix's title before measuring it and its
rows after; an output that ends after a title, with none of its rows and without the sample's
closing line, stopped inside that measurement, i.e. a copy between two GPUs that never completed:
`p2ptest-stalled-in-measurement` (a pasted output cut short reads the same: hence its confidence).
simpleP2P's `Verification error` lines: data copied between the GPUs came back wrong,
`p2ptest-verification-failed`. The file's own CUDA failure lines are the CUDA vocabulary's.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

# A peer path slower than half the staged copy is broken, not merely PCIe through a CPU (measured
# healthy P2P over PCIe runs at or above the staged figure; NVLink several times above it).
COLLAPSE_FRACTION = 0.5
MAX_EVIDENCE = 8
MAX_PAIRS_NAMED = 6


@register("p2p_test")
def p2p_test(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    own = events.filter(pl.col("source") == "p2ptest")
    if own.height == 0:
        return findings_frame([])
    return findings_frame([*_collapsed(own), *_stalled(own, events), *_verification(own)])


def _cells(own: pl.DataFrame) -> pl.DataFrame:
    """One row per measured pair (i != j) of the bandwidth matrices: matrix, direction, P2P on or off."""
    rows = own.filter((pl.col("kind") == "p2ptest.row") & pl.col("pg").str.contains(r"Bandwidth\b"))
    cells = rows.select(
        "file", "event_id", pl.col("device").alias("i"), pl.col("pg"),
        pl.col("detail").str.split(",").cast(pl.List(pl.Float64)).alias("v"),
    ).with_columns(pl.int_ranges(pl.col("v").list.len()).alias("j")).explode("v", "j")
    return cells.filter(pl.col("i") != pl.col("j")).with_columns(
        pl.col("pg").str.contains("P2P=Enabled").alias("p2p"),
        pl.when(pl.col("pg").str.starts_with("Bidirectional")).then(pl.lit("bidirectional"))
        .otherwise(pl.lit("unidirectional")).alias("direction"),
    )


def _collapsed(own: pl.DataFrame) -> list[dict]:
    cells = _cells(own)
    if cells.height == 0:
        return []
    keys = ["file", "direction", "i", "j"]
    enabled = cells.filter(pl.col("p2p")).group_by(keys).agg(pl.col("v").min().alias("on"), pl.col("event_id").first())
    disabled = cells.filter(~pl.col("p2p")).group_by(keys).agg(pl.col("v").max().alias("off"))
    denied = own.filter((pl.col("kind") == "p2ptest.peer_access") & (pl.col("code") == "CANNOT")).select(
        "file", pl.col("device").alias("i"), pl.col("peer").cast(pl.Int64, strict=False).alias("j"))
    pairs = (
        enabled.join(disabled, on=keys).join(denied, on=["file", "i", "j"], how="anti")
        .filter((pl.col("off") > 0) & (pl.col("on") < COLLAPSE_FRACTION * pl.col("off")))
        .sort("file", "direction", "i", "j", descending=[False, True, False, False])
    )
    if pairs.height == 0:
        return []
    named = ", ".join(
        f"GPU{p['i']}->GPU{p['j']} {p['on']:g} vs {p['off']:g} GB/s ({p['direction']})"
        for p in pairs.head(MAX_PAIRS_NAMED).iter_rows(named=True)
    )
    more = f" and {pairs.height - MAX_PAIRS_NAMED} more" if pairs.height > MAX_PAIRS_NAMED else ""
    return [finding(
        "p2ptest-peer-bandwidth-collapsed",
        confidence=0.75,
        summary=(f"{pairs.row(0, named=True)['file']}: with peer access enabled, {pairs.height} GPU pair measurement(s) run "
                 f"under {COLLAPSE_FRACTION:.0%} of the same pair's staged copy (P2P=Disabled): {named}{more}"),
        evidence=pairs.get_column("event_id").unique().sort().head(MAX_EVIDENCE).to_list(),
    )]


def _stalled(own: pl.DataFrame, events: pl.DataFrame) -> list[dict]:
    """Files whose last p2p test event is a matrix title without rows, with no closing line or failure."""
    failed_files = events.filter(pl.col("severity").is_in(["error", "fatal"])).get_column("file").unique().to_list()
    per_file = (
        own.sort("file", "line").group_by("file", maintain_order=True)
        .agg(pl.col("kind").last().alias("last"), pl.col("event_id").last(), pl.col("message").last(),
             (pl.col("kind") == "p2ptest.end").any().alias("ended"),
             (pl.col("kind") == "p2ptest.start").any().alias("started"))
        .filter(pl.col("started") & ~pl.col("ended") & (pl.col("last") == "p2ptest.section") & ~pl.col("file").is_in(failed_files))
    )
    return [finding(
        "p2ptest-stalled-in-measurement",
        confidence=0.5,
        summary=(f"{row['file']}: the output stops after the title '{row['message']}', before any row of it and before the "
                 "test's closing line: a copy between two GPUs of that measurement never completed"),
        evidence=[row["event_id"]],
    ) for row in per_file.iter_rows(named=True)]


def _verification(own: pl.DataFrame) -> list[dict]:
    bad = own.filter(pl.col("kind") == "p2ptest.verification_error")
    if bad.height == 0:
        return []
    return [finding(
        "p2ptest-verification-failed",
        confidence=0.75,
        summary=(f"{bad.row(0, named=True)['file']}: {bad.height} Verification error line(s): data copied between the GPUs "
                 f"over peer access came back wrong ({bad.row(0, named=True)['message']})"),
        evidence=bad.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )]
