"""Stage 2, parse (Kineto): PyTorch profiler Chrome traces -> compact per-rank timeline events.

One trace is one rank's profile: `analyzer.parse.kineto_stream` streams its `traceEvents` array
down to the GPU activity, the CPU-side annotations and the allocator calls; this module names the
rank from the trace's `distributedInfo`, its device (the one most of its GPU activity ran on) and
the wall clock of trace time 0 (`baseTimeNanoseconds`), and hands them to
`analyzer.parse.trace_summary.summarize_timeline`, the reduction shared with Nsight Systems: one
`trace.rank` summary, one `trace.collective` per NCCL operation, one `trace.step` per profiled
step and the largest idle gaps, each citing one trace event by its 1-based position in
`traceEvents`. Nothing per kernel reaches the event table. A profile without GPU activity and one
whose blocks had to be decoded event by event say so in the input's reason.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analyzer.bounds import rank_number
from analyzer.io import InputFile
from analyzer.parse.kineto_stream import TraceMeta, read_kineto
from analyzer.parse.trace_summary import summarize_timeline


def parse_kineto(item: InputFile) -> pl.DataFrame:
    """The summary events of one trace; why a trace read only in part, or gave nothing, lands on `item.reason`."""
    with item.open_bytes() as fh:
        kept, meta = read_kineto(fh)
    info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank = _info_rank(info.get("rank"))
    world = _info_rank(info.get("world_size"))
    unit = pl.lit(0, dtype=pl.Int64).alias("unit")
    gpu = kept.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"])).with_columns(unit)
    device = gpu.get_column("device").drop_nulls().mode().sort().head(1).to_list() if gpu.height else []
    units = pl.DataFrame(
        {
            "unit": [0],
            "rank": [rank],
            "device": [device[0] if device else None],
            "nranks": [world],
            "base_ns": [_base_ns(meta, gpu)],
        },
        schema={"unit": pl.Int64, "rank": pl.Int64, "device": pl.Int64, "nranks": pl.Int64, "base_ns": pl.Int64},
    )
    marks = kept.filter(pl.col("kind") == "mark").select(unit, "name", "start", "end", "index")
    api = kept.filter(pl.col("kind") == "api").select(unit, "name", "start", "end")
    if gpu.height == 0:
        item.reason = "profiler trace without GPU activity (CPU-only profile): no timeline to analyse"
    if meta.slow_blocks:
        item.reason = f"{meta.slow_blocks} block(s) decoded event by event (unusual layout)"
    return summarize_timeline(
        gpu.select("unit", "kind", "name", "start", "end", "device", "stream", "index"),
        marks,
        api,
        units,
        source="kineto",
        file=item.path,
    )


def _info_rank(value: Any) -> int | None:
    """A rank or world size from distributedInfo; past any real job (or not a number) it is None."""
    return rank_number(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _base_ns(meta: TraceMeta, gpu: pl.DataFrame) -> int | None:
    """Wall clock (ns since the epoch) of trace time 0, when the trace says."""
    first = gpu.get_column("start").min() if gpu.height else None
    if first is not None and first > 10**17:  # old Kineto: absolute epoch microseconds
        return 0
    base = meta.get("baseTimeNanoseconds")
    return int(base) if isinstance(base, int | float) and not isinstance(base, bool) and base > 0 else None

