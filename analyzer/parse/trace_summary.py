"""Stage 2, parse (traces): per-rank GPU timelines -> compact summary events, for Kineto and nsys.

The reduction shared by `analyzer.parse.kineto` and `analyzer.parse.nsys`: per unit (one process's
view of its GPU, a rank), the GPU timeline (NCCL kernels vs compute kernels vs copies) is swept
once and becomes one `trace.rank` summary, one `trace.collective` per NCCL operation, one
`trace.step` per profiled step (at most `MAX_STEP_EVENTS`), the few largest idle gaps (`trace.gap`,
`TOP_GAPS` of at least `GAP_MIN_NS`) and the allocator calls (counted in `trace.rank`). With three
or more steps the first is left out (steady state). Figures travel in `detail` as a JSON object
(microseconds) that the trace analyses decode with polars. Each summary cites one trace event, the
evidence a reader can find in the file: `line` is that event's 1-based position in its source and
the text names it with its rank, `ts` (as the trace writes it), duration and step: a step's
annotation, an operation's longest NCCL kernel, the GPU op that ends an idle gap, a rank's first
analysed step. The names that say what a kernel, a step or an allocator call is are here too, for
both parsers.
"""

from __future__ import annotations

import polars as pl

from analyzer.events import EVENT_SCHEMA, UTC_TS, concat_events, conform, empty_events

# Allocator traffic: a caching allocator in steady state calls neither; a churning one calls both
# every step.
MALLOC_CALLS = r"^(?:cudaMalloc(?:Async|Managed)?|cuMemAlloc\w*|cuMemCreate|cudaMallocFromPoolAsync)(?:_v\d+)?$"
FREE_CALLS = r"^(?:cudaFree(?:Async)?|cuMemFree\w*|cuMemRelease)(?:_v\d+)?$"

NCCL_KERNEL = r"^(?:void )?nccl\w*Kernel"
_NCCL_OP = r"nccl(?:Dev)?Kernel_([A-Za-z]+)"
# Step annotations: torch.profiler's `ProfilerStep#N`, NVTX ranges such as `step12`, `iteration 12`.
STEP_NAME = r"(?i)^:?(?:ProfilerStep#|step[ _#:]?|iteration[ _#:]?|iter[ _#:]?)(\d+)$"

GAP_MIN_NS = 1_000_000  # an idle stretch shorter than 1 ms is launch latency, not a stall
TOP_GAPS = 3
MAX_STEP_EVENTS = 512
KERNEL_NAME_CHARS = 80  # a templated kernel name is cut in the evidence text (the trace holds it whole)

_US = 1000.0
_IDENTITY = ("rank", "local_rank", "device", "nranks", "pid", "host")  # a unit's columns every summary carries


def summarize_timeline(
    gpu: pl.DataFrame,
    marks: pl.DataFrame,
    api: pl.DataFrame,
    units: pl.DataFrame,
    *,
    source: str,
    file: str,
) -> pl.DataFrame:
    """Reduce per-unit GPU activity to compact canonical events.

    gpu: unit, kind (kernel|memcpy|memset), name, start, end (ns), device, stream.
    marks: unit, name, start, end: CPU-side ranges (step annotations and labels such as data_loader).
    api: unit, name, start, end: allocator API calls (cudaMalloc, cudaFree, cuMemCreate, ...).
    units: unit, rank, device, nranks, base_ns and optionally pid, host, local_rank.
    A unit is one process's view of its GPU: a rank.
    """
    if gpu.height == 0:
        return empty_events()
    units = units.with_columns(
        [pl.lit(None, dtype=EVENT_SCHEMA[c]).alias(c) for c in _IDENTITY if c not in units.columns]
    ).select("unit", "base_ns", *_IDENTITY)
    gpu = gpu.with_columns(
        pl.col("name").cast(pl.String),
        pl.col("kind").cast(pl.String),
    ).with_columns(
        ((pl.col("kind") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL)).alias("nccl"),
    ).with_columns(
        (pl.col("kind") == "kernel").and_(~pl.col("nccl")).alias("compute"),
        pl.col("kind").is_in(["memcpy", "memset"]).alias("copy"),
        pl.col("end").clip(lower_bound=pl.col("start")).alias("end"),
    )
    gpu, marks = _with_index(gpu), _with_index(marks.with_columns(pl.col("name").cast(pl.String)))
    steps = (
        marks.with_columns(pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64, strict=False).alias("step"))
        .filter(pl.col("step").is_not_null() & (pl.col("end") > pl.col("start")))
        .sort("unit", "step", pl.col("end") - pl.col("start"), descending=[False, False, True])
        .unique(["unit", "step"], keep="first", maintain_order=True)
        .select(
            "unit", "step", pl.col("start").alias("s_start"), pl.col("end").alias("s_end"),
            pl.col("name").alias("s_name"), pl.col("index").alias("s_index"),
        )
        .sort("unit", "s_start")
        # Steady state: with three or more steps, the first (lazy initialisation, allocator warm-up,
        # NCCL connection set-up) is left out.
        .filter((pl.len().over("unit") < 3) | (pl.col("step") != pl.col("step").min().over("unit")))
    )
    windows = _windows(gpu, steps)
    segments = _sweep(gpu, steps, windows)
    rank_rows = _rank_summary(segments, windows, steps, gpu, api)
    events = [
        _rank_events(rank_rows, steps, gpu, units),
        _collective_events(gpu, windows, steps, units),
        _step_events(segments, steps, units),
        _gap_events(segments, marks, gpu, steps, windows, units),
    ]
    frame = concat_events(
        e.with_columns(pl.lit(source).alias("source"), pl.lit(file).alias("file")) for e in events if e.height
    )
    return frame


def _windows(gpu: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The analysed stretch per unit: its profiled steps when annotated, else first to last activity.

    Step ranges are CPU-side; the GPU may still be running the last step's kernels when its range
    ends, so the window runs on to the end of the GPU work that started inside it.
    """
    by_steps = steps.group_by("unit").agg(
        pl.col("s_start").min().alias("w0"), pl.col("s_end").max().alias("s1"), pl.len().alias("steps")
    )
    tail = (
        gpu.join(by_steps, on="unit")
        .filter((pl.col("start") >= pl.col("w0")) & (pl.col("start") < pl.col("s1")))
        .group_by("unit")
        .agg(pl.col("end").max().alias("tail"))
    )
    by_gpu = gpu.group_by("unit").agg(pl.col("start").min().alias("g0"), pl.col("end").max().alias("g1"))
    return (
        by_gpu.join(by_steps, on="unit", how="left")
        .join(tail, on="unit", how="left")
        .select(
            "unit",
            pl.coalesce("w0", "g0").alias("w0"),
            pl.coalesce(pl.max_horizontal("s1", "tail"), "g1").alias("w1"),
            pl.col("steps").cast(pl.Int64),
        )
        .sort("unit")
    )


def _sweep(gpu: pl.DataFrame, steps: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Elementary segments of each unit's window with how many NCCL, compute and copy ops run.

    Every kernel start/end is a +1/-1 point and every step and window edge a 0 point, so each
    segment between two consecutive points lies inside one step and has constant counts.
    """
    flags = [pl.col(c).cast(pl.Int32) for c in ("nccl", "compute", "copy")]
    starts = gpu.select("unit", pl.col("start").alias("t"), *[f.alias(n) for f, n in zip(flags, ("dn", "dc", "dx"))])
    ends = gpu.select("unit", pl.col("end").alias("t"), *[(-f).alias(n) for f, n in zip(flags, ("dn", "dc", "dx"))])
    zero = [pl.lit(0, dtype=pl.Int32).alias(n) for n in ("dn", "dc", "dx")]
    edges = pl.concat(
        [
            windows.select("unit", pl.col("w0").alias("t"), *zero),
            windows.select("unit", pl.col("w1").alias("t"), *zero),
            steps.select("unit", pl.col("s_start").alias("t"), *zero),
            steps.select("unit", pl.col("s_end").alias("t"), *zero),
        ]
    )
    points = pl.concat([starts, ends, edges]).sort("unit", "t")
    segments = (
        points.with_columns(
            pl.col("dn").cum_sum().over("unit").alias("n_nccl"),
            pl.col("dc").cum_sum().over("unit").alias("n_comp"),
            pl.col("dx").cum_sum().over("unit").alias("n_copy"),
            pl.col("t").shift(-1).over("unit").alias("t1"),
        )
        .filter(pl.col("t1").is_not_null() & (pl.col("t1") > pl.col("t")))
        .join(windows.select("unit", "w0", "w1"), on="unit")
        .filter((pl.col("t") >= pl.col("w0")) & (pl.col("t1") <= pl.col("w1")))
        .select("unit", "t", (pl.col("t1") - pl.col("t")).alias("len"), "n_nccl", "n_comp", "n_copy")
        .sort("unit", "t")
    )
    if steps.height:
        segments = (
            segments.join_asof(steps.select("unit", "step", "s_start", "s_end"), left_on="t", right_on="s_start", by="unit",
                               strategy="backward", check_sortedness=False)
            .with_columns(pl.when(pl.col("t") < pl.col("s_end")).then(pl.col("step")).alias("step"))
            .drop("s_start", "s_end")
        )
    else:
        segments = segments.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    return segments.with_columns(
        (pl.col("n_nccl") > 0).alias("is_nccl"),
        (pl.col("n_comp") > 0).alias("is_comp"),
        ((pl.col("n_nccl") + pl.col("n_comp") + pl.col("n_copy")) == 0).alias("is_idle"),
    )


def _segment_sums() -> list[pl.Expr]:
    length = pl.col("len")
    return [
        length.filter(~pl.col("is_idle")).sum().alias("busy_ns"),
        length.filter(pl.col("is_nccl")).sum().alias("nccl_ns"),
        length.filter(pl.col("is_comp")).sum().alias("compute_ns"),
        length.filter(pl.col("is_nccl") & pl.col("is_comp")).sum().alias("overlap_ns"),
        length.filter(pl.col("is_nccl") & ~pl.col("is_comp")).sum().alias("exposed_ns"),
        length.filter(pl.col("is_idle")).sum().alias("idle_ns"),
        length.filter(pl.col("is_idle") & (length >= GAP_MIN_NS)).sum().alias("gap_ns"),
        (pl.col("is_idle") & (length >= GAP_MIN_NS)).sum().cast(pl.Int64).alias("gaps"),
    ]


def _rank_summary(
    segments: pl.DataFrame,
    windows: pl.DataFrame,
    steps: pl.DataFrame,
    gpu: pl.DataFrame,
    api: pl.DataFrame,
) -> pl.DataFrame:
    sums = segments.group_by("unit").agg(*_segment_sums())
    step_stats = steps.group_by("unit").agg((pl.col("s_end") - pl.col("s_start")).median().alias("step_ns"))
    in_window = gpu.join(windows, on="unit").filter((pl.col("start") >= pl.col("w0")) & (pl.col("start") < pl.col("w1")))
    counts = in_window.group_by("unit").agg(
        pl.col("compute").sum().cast(pl.Int64).alias("kernels"),
        pl.col("nccl").sum().cast(pl.Int64).alias("nccl_kernels"),
        (pl.col("end") - pl.col("start")).filter(pl.col("nccl")).sum().alias("nccl_sum_ns"),
    )
    allocs = (
        api.join(windows, on="unit")
        .filter((pl.col("start") >= pl.col("w0")) & (pl.col("start") < pl.col("w1")))
        .group_by("unit")
        .agg(
            pl.col("name").cast(pl.String).str.contains(MALLOC_CALLS).sum().cast(pl.Int64).alias("mallocs"),
            pl.col("name").cast(pl.String).str.contains(FREE_CALLS).sum().cast(pl.Int64).alias("frees"),
        )
    )
    return (
        windows.join(sums, on="unit", how="left")
        .join(step_stats, on="unit", how="left")
        .join(counts, on="unit", how="left")
        .join(allocs, on="unit", how="left")
        .with_columns(
            (pl.col("w1") - pl.col("w0")).alias("window_ns"),
            pl.col("mallocs").fill_null(0),
            pl.col("frees").fill_null(0),
        )
    )


def _us(name: str, expr: pl.Expr | None = None) -> pl.Expr:
    return ((expr if expr is not None else pl.col(name)).cast(pl.Float64) / _US).round(1).alias(name.replace("_ns", "_us"))


def _ms_text(expr: pl.Expr) -> pl.Expr:
    return (expr.cast(pl.Float64) / 1e6).round(1).cast(pl.String)


def _with_index(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with `index`, each entry's 0-based position in its source (null where unknown)."""
    return frame if "index" in frame.columns else frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("index"))


def _line(col: str) -> pl.Expr:
    """Where a trace event points: the cited entry's 1-based position in its source (Kineto: in
    traceEvents; nsys: the row of its table or report), 0 when no single entry is cited."""
    return (pl.col(col).cast(pl.Int64) + 1).fill_null(0).alias("line")


def _ts_text(col: str) -> pl.Expr:
    """A trace timestamp as the trace writes it (microseconds, exact to the ns), to search the file for."""
    ns = pl.col(col)
    frac = (ns % 1000).cast(pl.String).str.zfill(3).str.strip_chars_end("0")
    return pl.when(ns % 1000 == 0).then((ns // 1000).cast(pl.String)).otherwise(pl.format("{}.{}", ns // 1000, frac))


def _short(col: str) -> pl.Expr:
    name = pl.col(col).cast(pl.String)
    return pl.when(name.str.len_chars() > KERNEL_NAME_CHARS).then(
        name.str.slice(0, KERNEL_NAME_CHARS - 3) + pl.lit("...")
    ).otherwise(name)


def _in_step(frame: pl.DataFrame, steps: pl.DataFrame, at: str) -> pl.DataFrame:
    """`frame` with `s_name`: the step annotation whose range holds time `at` (null outside every step)."""
    if steps.height == 0:
        return frame.with_columns(pl.lit(None, dtype=pl.String).alias("s_name"))
    return (
        frame.sort(at)
        .join_asof(steps.select("unit", "s_start", "s_end", "s_name").sort("s_start"), left_on=at, right_on="s_start",
                   by="unit", strategy="backward", check_sortedness=False)
        .with_columns(pl.when(pl.col(at) < pl.col("s_end")).then(pl.col("s_name")).alias("s_name"))
        .drop("s_start", "s_end")
    )


def _step_text(col: str = "s_name") -> pl.Expr:
    return pl.when(pl.col(col).is_not_null()).then(pl.format(" in {}", pl.col(col))).otherwise(pl.lit(""))


def _who() -> pl.Expr:
    return (
        pl.when(pl.col("rank").is_not_null())
        .then(pl.format("rank {}", pl.col("rank")))
        .when(pl.col("pid").is_not_null())
        .then(pl.format("pid {} (GPU {})", pl.col("pid"), pl.col("device").cast(pl.String).fill_null("?")))
        .otherwise(pl.format("GPU {}", pl.col("device").cast(pl.String).fill_null("?")))
    )


def _wall(col: str) -> pl.Expr:
    """UTC time of a trace timestamp when the trace gives its clock base."""
    return (
        pl.when(pl.col("base_ns").is_not_null())
        .then(pl.from_epoch((pl.col("base_ns") + pl.col(col)) // 1000, time_unit="us").dt.replace_time_zone("UTC"))
        .otherwise(pl.lit(None, dtype=UTC_TS))
    )


def _summary_columns(kind: str, cited: str, message: pl.Expr, detail: pl.Expr, at: str | None = None) -> list[pl.Expr]:
    """The columns of every summary event: the line of the trace event it cites (column `cited`),
    its unit's identity, `kind`, `message` as message and text, the `detail` struct as JSON; with
    `at`, the wall time of that trace time where the trace gives its clock base."""
    timed = [
        _wall(at).alias("ts"),
        pl.when(pl.col("base_ns").is_not_null()).then(pl.lit("trace")).alias("ts_source"),
    ] if at is not None else []
    return [
        _line(cited),
        *timed,
        *_IDENTITY,
        pl.lit(kind).alias("kind"),
        pl.lit("info").alias("severity"),
        message.alias("message"),
        message.alias("text"),
        detail.struct.json_encode().alias("detail"),
    ]


def _rank_events(rows: pl.DataFrame, steps: pl.DataFrame, gpu: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    """One summary per unit; it cites its first analysed step's annotation (else its first GPU op)."""
    per = pl.coalesce(pl.col("steps"), pl.lit(1)).cast(pl.Float64)
    bounds = steps.sort("s_start").group_by("unit").agg(
        pl.col("s_name").first().alias("first_step"), pl.col("s_name").last().alias("last_step"),
        pl.col("s_index").first().alias("first_index"),
    )
    first_op = gpu.join(rows.select("unit", "w0"), on="unit").filter(pl.col("start") >= pl.col("w0")).sort("start") \
        .group_by("unit").agg(pl.col("index").first().alias("op_index"))
    frame = rows.join(bounds, on="unit", how="left").join(first_op, on="unit", how="left") \
        .with_columns(pl.coalesce("first_index", "op_index").alias("cited")).join(units, on="unit", how="left")
    detail = pl.struct(
        _us("window_ns"),
        pl.col("steps"),
        _us("step_ns"),
        _us("busy_ns"),
        _us("compute_ns"),
        _us("nccl_ns"),
        _us("nccl_sum_ns"),
        _us("overlap_ns"),
        _us("exposed_ns"),
        _us("idle_ns"),
        _us("gap_ns"),
        pl.col("gaps"),
        pl.col("kernels"),
        pl.col("nccl_kernels"),
        pl.col("mallocs"),
        pl.col("frees"),
    )
    span = (
        pl.when(pl.col("steps").is_not_null())
        .then(pl.format("{}..{} ts={} us dur={} ms ({} steps, median step {} ms); per step: ", pl.col("first_step"),
                        pl.col("last_step"), _ts_text("w0"), _ms_text(pl.col("window_ns")), pl.col("steps"),
                        _ms_text(pl.col("step_ns"))))
        .otherwise(pl.format("GPU activity ts={} us dur={} ms (no step annotations): ", _ts_text("w0"),
                             _ms_text(pl.col("window_ns"))))
    )
    message = pl.format(
        "{} {}NCCL {} ms (not overlapped {} ms), compute {} ms, GPU idle {} ms ({} gaps >= 1 ms){}",
        _who(),
        span,
        _ms_text(pl.col("nccl_ns") / per),
        _ms_text(pl.col("exposed_ns") / per),
        _ms_text(pl.col("compute_ns") / per),
        _ms_text(pl.col("idle_ns") / per),
        pl.col("gaps").fill_null(0),
        pl.when((pl.col("mallocs") + pl.col("frees")) > 0)
        .then(pl.format("; {} device allocations, {} releases", pl.col("mallocs"), pl.col("frees")))
        .otherwise(pl.lit("")),
    )
    return conform(frame.select(*_summary_columns("trace.rank", "cited", message, detail, at="w0")))


def _collective_events(gpu: pl.DataFrame, windows: pl.DataFrame, steps: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    """One event per unit and NCCL operation; it cites the operation's longest kernel."""
    nccl = (
        gpu.filter(pl.col("nccl"))
        .join(windows, on="unit")
        .filter((pl.col("start") >= pl.col("w0")) & (pl.col("start") < pl.col("w1")))
        .with_columns(
            pl.col("name").str.extract(_NCCL_OP, 1).fill_null("other").alias("op"),
            (pl.col("end") - pl.col("start")).alias("dur"),
        )
    )
    if nccl.height == 0:
        return empty_events()
    stats = nccl.group_by("unit", "op").agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col("dur").sum().alias("sum_ns"),
        pl.col("dur").median().alias("median_ns"),
        pl.col("dur").min().alias("min_ns"),
        pl.col("dur").max().alias("max_ns"),
    )
    longest = nccl.sort("dur", "start", descending=[True, False]).group_by("unit", "op", maintain_order=True).first() \
        .select("unit", "op", pl.col("name").alias("k_name"), pl.col("start").alias("k_start"), pl.col("index").alias("k_index"))
    frame = stats.join(_in_step(longest, steps, "k_start"), on=["unit", "op"], how="left").join(units, on="unit", how="left")
    message = pl.format(
        "{} {} ts={} us dur={} ms{}: the longest of {} {} kernels (median {} ms, min {}), {} ms in all",
        _who(),
        _short("k_name"),
        _ts_text("k_start"),
        (pl.col("max_ns") / 1e6).round(3).cast(pl.String),
        _step_text(),
        pl.col("count"),
        pl.col("op"),
        (pl.col("median_ns") / 1e6).round(3).cast(pl.String),
        (pl.col("min_ns") / 1e6).round(3).cast(pl.String),
        _ms_text(pl.col("sum_ns")),
    )
    detail = pl.struct(pl.col("count"), _us("sum_ns"), _us("median_ns"), _us("min_ns"), _us("max_ns"))
    return conform(
        frame.select(*_summary_columns("trace.collective", "k_index", message, detail), pl.col("op"))
        .sort("rank", "op", nulls_last=True)
    )


def _step_events(segments: pl.DataFrame, steps: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    if steps.height == 0:
        return empty_events()
    per_step = (
        segments.filter(pl.col("step").is_not_null())
        .group_by("unit", "step")
        .agg(*_segment_sums())
        .join(steps, on=["unit", "step"])
        .with_columns((pl.col("s_end") - pl.col("s_start")).alias("step_ns"))
        .sort("unit", "step")
        .group_by("unit", maintain_order=True)
        .head(MAX_STEP_EVENTS)
    )
    frame = per_step.join(units, on="unit", how="left")
    message = pl.format(
        "{} {} ts={} us dur={} ms: NCCL {} ms, compute {} ms, GPU idle {} ms",
        _who(),
        pl.col("s_name"),
        _ts_text("s_start"),
        _ms_text(pl.col("step_ns")),
        _ms_text(pl.col("nccl_ns")),
        _ms_text(pl.col("compute_ns")),
        _ms_text(pl.col("idle_ns")),
    )
    detail = pl.struct(_us("step_ns"), _us("nccl_ns"), _us("compute_ns"), _us("exposed_ns"), _us("idle_ns"), _us("gap_ns"))
    return conform(frame.select(*_summary_columns("trace.step", "s_index", message, detail, at="s_start"), pl.col("step").alias("seq")))


def _gap_events(
    segments: pl.DataFrame, marks: pl.DataFrame, gpu: pl.DataFrame, steps: pl.DataFrame, windows: pl.DataFrame,
    units: pl.DataFrame,
) -> pl.DataFrame:
    """The largest idle stretches per unit; each cites the GPU op that ends it (the first after it)."""
    gaps = (
        segments.filter(pl.col("is_idle") & (pl.col("len") >= GAP_MIN_NS))
        .sort("unit", "len", "t", descending=[False, True, False])
        .group_by("unit", maintain_order=True)
        .head(TOP_GAPS)
        .select("unit", "step", pl.col("t").alias("g0"), (pl.col("t") + pl.col("len")).alias("g1"), "len")
    )
    if gaps.height == 0:
        return empty_events()
    labels = marks.filter(~pl.col("name").str.contains(STEP_NAME))
    if labels.height:
        # What the host was doing while the GPU sat idle: the CPU range that covers most of the gap.
        covering = (
            gaps.join(labels, on="unit")
            .with_columns((pl.min_horizontal("g1", "end") - pl.max_horizontal("g0", "start")).alias("cover"))
            .filter(pl.col("cover") > 0)
            .sort("unit", "g0", "cover", descending=[False, False, True])
            .unique(["unit", "g0"], keep="first")
            .select("unit", "g0", pl.col("name").alias("during"))
        )
        gaps = gaps.join(covering, on=["unit", "g0"], how="left")
    else:
        gaps = gaps.with_columns(pl.lit(None, dtype=pl.String).alias("during"))
    after = gaps.sort("g1").join_asof(
        gpu.select("unit", pl.col("start").alias("n_start"), pl.col("name").alias("n_name"), pl.col("index").alias("n_index"))
        .sort("n_start"),
        left_on="g1", right_on="n_start", by="unit", strategy="forward", check_sortedness=False,
    )
    names = steps.select("unit", "step", "s_name") if steps.height else pl.DataFrame(
        schema={"unit": pl.Int64, "step": pl.Int64, "s_name": pl.String})
    frame = after.join(names, on=["unit", "step"], how="left").join(windows.select("unit", "w0"), on="unit") \
        .join(units, on="unit", how="left")
    message = pl.format(
        "{} GPU idle ts={} us dur={} ms{}{}{}",
        _who(),
        _ts_text("g0"),
        (pl.col("len") / 1e6).round(2).cast(pl.String),
        _step_text(),
        pl.when(pl.col("during").is_not_null()).then(pl.format(" while the host ran {}", pl.col("during"))).otherwise(pl.lit("")),
        pl.when(pl.col("n_name").is_not_null()).then(pl.format(", until {}", _short("n_name"))).otherwise(pl.lit("")),
    )
    detail = pl.struct(_us("len_ns", pl.col("len")), _us("offset_ns", pl.col("g0") - pl.col("w0")), pl.col("during"))
    return conform(
        frame.select(*_summary_columns("trace.gap", "n_index", message, detail, at="g0"), pl.col("step").alias("seq"))
        .sort("rank", "ts", nulls_last=True)
    )

