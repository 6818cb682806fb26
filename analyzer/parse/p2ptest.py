"""Stage 2, parse (the CUDA samples' peer-to-peer tests): p2pBandwidthLatencyTest and simpleP2P output.

The runbook's check of the links between the GPUs of one machine, when NCCL hangs or crawls on it,
is a CUDA sample (NVIDIA/cuda-samples, Samples/5_Domain_Specific/p2pBandwidthLatencyTest and
Samples/0_Introduction/simpleP2P). p2pBandwidthLatencyTest prints its name in brackets, one
`Device: N, <name>, pciBusID: b, pciDeviceID: d, pciDomainID:x` line per GPU, one
`Device=i CAN|CANNOT Access Peer Device=j` line per ordered pair, the `P2P Connectivity Matrix`, and
then one titled matrix per measurement (`Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)`, `...
P2P=Enabled Bandwidth (P2P Writes) ...`, the bidirectional ones, the latency ones): the title is
printed before the measurement runs, the `D\\D` column header and the rows after it. It ends with
`NOTE: The CUDA Samples are not meant for performance measurements...`. simpleP2P prints `> Peer
access from <name> (GPUi) -> <name> (GPUj) : Yes|No`, one `cudaMemcpyPeer / cudaMemcpy between GPUi
and GPUj: X GB/s` figure, `Verification error @ element N: ...` lines when the data copied between
the GPUs came back wrong, and `Test passed` / `Test failed!`. Both print CUDA failures as `Cuda
failure file:line: '<message>'` / `CUDA error at ...`, which the text parser and the CUDA
vocabulary read like any other.

Events (source `p2ptest`): `p2ptest.start` (the sample's name line), `p2ptest.device` (device, its
name in `detail`), `p2ptest.peer_access` (device, the peer device in `peer`, `code` CAN or CANNOT),
`p2ptest.section` (a matrix title; `pg` names it), `p2ptest.row` (one matrix row: its device, the
figures as a JSON list in `detail`, the matrix in `pg`), `p2ptest.copy_bandwidth` (simpleP2P's
figure), `p2ptest.verification_error`, `p2ptest.end` (the closing NOTE, `Test passed`, `Test
failed!`: `code` says which). The analysis `p2p_test` reads them.
"""

from __future__ import annotations

import polars as pl

from analyzer.events import conform, empty_events
from analyzer.io import InputFile
from analyzer.parse.lines import read_peeled_lines

MAX_LINES = 200_000  # a p2p test's output is tens of lines per GPU; a huge file is not read past this

_START = r"^\[(?:P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test|[^\]]*simpleP2P)\](?: - Starting\.\.\.)?\s*$"
_DEVICE = r"^Device: (\d+), (.*?), pciBusID: ([0-9a-fA-F]+), pciDeviceID: ([0-9a-fA-F]+), pciDomainID:\s*([0-9a-fA-F]+)"
_ACCESS = r"^Device=(\d+) (CAN|CANNOT) Access Peer Device=(\d+)"
_SIMPLE_ACCESS = r"^> Peer access from .*? \(GPU(\d+)\) -> .*? \(GPU(\d+)\) : (Yes|No)\s*$"
# Every matrix title of the sample names P2P=Enabled|Disabled, or is the connectivity matrix.
_SECTION = r"^(?:(?:Unidirectional|Bidirectional) )?P2P=(?:Enabled|Disabled) (?:Bandwidth|Latency)\b.*\bMatrix\b|^P2P Connectivity Matrix\s*$"
_COLUMNS = r"^\s*(?:D\\D|GPU|CPU)(?:\s+\d+)+\s*$"
_ROW = r"^\s*(\d+)((?:\s+-?[0-9]+(?:\.[0-9]+)?)+)\s*$"
_COPY = r"^cudaMemcpyPeer / cudaMemcpy between GPU(\d+) and GPU(\d+): ([0-9.]+) ?GB/s"
_VERIFY = r"^Verification error @ element \d+: "
_END = r"^(?:NOTE: The CUDA Samples are not meant for performance measurements|Test passed\s*$|Test failed!\s*$)"
_LITERALS = ("GPU Bandwidth Latency Test", "simpleP2P", "Device", "P2P", "D\\D", "GPU", "CPU", "cudaMemcpyPeer",
             "Verification error", "NOTE: The CUDA Samples", "Test passed", "Test failed")


def parse_p2p_test(item: InputFile) -> tuple[pl.DataFrame, int]:
    """Events of one p2p test's output and how many of its lines were the format's own."""
    lines = read_peeled_lines(item, MAX_LINES, "p2p test")
    return p2p_test_events(lines) if lines is not None else (empty_events(), 0)


def p2p_test_events(lines: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Events for the p2p test lines of a frame with `file`, `line`, `text`, `body` columns."""
    body = pl.col("body")
    frame = lines.filter(body.str.contains_any(list(_LITERALS)) | body.str.contains(_ROW)).select("file", "line", "text", "body")
    if frame.height == 0:
        return empty_events(), 0
    frame = frame.with_columns(
        pl.when(body.str.contains(_START)).then(pl.lit("p2ptest.start"))
        .when(body.str.contains(_DEVICE)).then(pl.lit("p2ptest.device"))
        .when(body.str.contains(_ACCESS) | body.str.contains(_SIMPLE_ACCESS)).then(pl.lit("p2ptest.peer_access"))
        .when(body.str.contains(_SECTION)).then(pl.lit("p2ptest.section"))
        .when(body.str.contains(_COLUMNS)).then(pl.lit("_columns"))
        .when(body.str.contains(_ROW)).then(pl.lit("p2ptest.row"))
        .when(body.str.contains(_COPY)).then(pl.lit("p2ptest.copy_bandwidth"))
        .when(body.str.contains(_VERIFY)).then(pl.lit("p2ptest.verification_error"))
        .when(body.str.contains(_END)).then(pl.lit("p2ptest.end"))
        .alias("kind"),
    ).filter(pl.col("kind").is_not_null())
    # A matrix row belongs to the last title above it in its file; rows before any title are no matrix.
    section = pl.when(pl.col("kind") == "p2ptest.section").then(body.str.strip_chars())
    frame = frame.with_columns(section.forward_fill().over("file").alias("pg"))
    frame = frame.filter((pl.col("kind") != "p2ptest.row") | pl.col("pg").is_not_null())
    own = frame.height
    events = frame.filter(pl.col("kind") != "_columns").with_columns(
        pl.lit("p2ptest").alias("source"),
        pl.when(pl.col("kind") == "p2ptest.verification_error").then(pl.lit("error"))
        .when((pl.col("kind") == "p2ptest.end") & body.str.contains("Test failed")).then(pl.lit("error"))
        .otherwise(pl.lit("info")).alias("severity"),
        body.str.strip_chars().alias("message"),
        _device().alias("device"),
        _peer().alias("peer"),
        _code().alias("code"),
        _detail().alias("detail"),
    )
    if events.height == 0:
        return empty_events(), own
    return conform(events.with_columns(pl.col("text").str.slice(0, 2000))), own


def _device() -> pl.Expr:
    kind, body = pl.col("kind"), pl.col("body")
    return pl.coalesce(
        pl.when(kind == "p2ptest.device").then(body.str.extract(_DEVICE, 1)),
        pl.when(kind == "p2ptest.peer_access").then(pl.coalesce(body.str.extract(_ACCESS, 1), body.str.extract(_SIMPLE_ACCESS, 1))),
        pl.when(kind == "p2ptest.row").then(body.str.extract(_ROW, 1)),
        pl.when(kind == "p2ptest.copy_bandwidth").then(body.str.extract(_COPY, 1)),
    ).cast(pl.Int64, strict=False)


def _peer() -> pl.Expr:
    kind, body = pl.col("kind"), pl.col("body")
    return pl.coalesce(
        pl.when(kind == "p2ptest.peer_access").then(pl.coalesce(body.str.extract(_ACCESS, 3), body.str.extract(_SIMPLE_ACCESS, 2))),
        pl.when(kind == "p2ptest.copy_bandwidth").then(body.str.extract(_COPY, 2)),
    )


def _code() -> pl.Expr:
    kind, body = pl.col("kind"), pl.col("body")
    granted = pl.coalesce(body.str.extract(_ACCESS, 2), body.str.extract(_SIMPLE_ACCESS, 3).replace_strict({"Yes": "CAN", "No": "CANNOT"}, default=None))
    return (
        pl.when(kind == "p2ptest.peer_access").then(granted)
        .when(kind == "p2ptest.end").then(
            pl.when(body.str.contains("Test failed")).then(pl.lit("failed"))
            .when(body.str.contains("Test passed")).then(pl.lit("passed")).otherwise(pl.lit("complete")))
    )


def _detail() -> pl.Expr:
    kind, body = pl.col("kind"), pl.col("body")
    figures = body.str.extract(_ROW, 2).str.extract_all(r"-?[0-9]+(?:\.[0-9]+)?").cast(pl.List(pl.Float64))
    return (
        pl.when(kind == "p2ptest.device").then(body.str.extract(_DEVICE, 2))
        .when(kind == "p2ptest.row").then(figures.list.eval(pl.element().cast(pl.String)).list.join(","))
        .when(kind == "p2ptest.copy_bandwidth").then(body.str.extract(_COPY, 3))
    )
