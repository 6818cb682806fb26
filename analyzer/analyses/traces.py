"""Stage 4, detect (slow-job analyses over traces and memory snapshots).

Logs cannot name a straggler: the all-reduce synchronises the ranks, so every rank logs the same
step time. The GPU timelines can. The trace parsers (Kineto, Nsight Systems) reduce each rank's
timeline to `trace.rank` / `trace.step` / `trace.gap` events whose figures (microseconds) travel
in `detail` as JSON; the memory-snapshot parser emits `memory.snapshot` / `memory.oom`. Analyses:

* `trace_straggler`: a collective ends when its last rank arrives, so the ranks that arrive early
  sit inside long NCCL kernels and the last one sees short ones. Per trace source, the rank(s)
  with the least collective-kernel time per step are the last arrivals; the others' excess is how
  long they wait for them (the lag). Point-to-point kernels (pipeline send/recv) are left out:
  they wait by design. Confirmed step by step when steps are annotated.
* `trace_idle_gaps`: GPU idle time per step (host-side stalls: data loading, synchronisation).
* `trace_exposed_communication`: NCCL time with no compute kernel running, measured on the
  last-arriving rank (whose NCCL time is transfer, not waiting).
* `allocator_churn`: device allocations and releases in the steady state (cudaMalloc/cudaFree in
  traces after the first profiled step; segments re-allocated after releases in a snapshot).
* `memory_fragmentation`: free memory stranded inside partly used allocator segments; with the
  snapshot's OOM, whether the failed request would have fitted had that memory been contiguous.
* `oom_reserved_unallocated`: a CUDA OOM message whose "reserved by PyTorch but unallocated"
  memory is at least the request that failed (`memory-oom-idle-cache-fragmented` when it is also
  a quarter or more of what PyTorch reserved).

The tables here have one row per rank (or per step of a rank), never per kernel.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label
from analyzer.units import byte_size

# A straggler must cost the others at least this much per step (absolute and relative to the step):
# below it, launch jitter and the rank that prints the log line look like "stragglers".
LAG_MIN_US = 5_000.0
LAG_MIN_FRACTION = 0.10
# Ranks whose wait is at most this share of the largest wait are the ones the others wait for.
LAST_ARRIVAL_SHARE = 0.3
IDLE_MIN_US = 10_000.0
IDLE_MIN_FRACTION = 0.30
EXPOSED_MIN_US = 10_000.0
EXPOSED_MIN_FRACTION = 0.30
CHURN_MIN_PER_STEP = 1.0
CHURN_MIN_CALLS = 4
SEGMENT_REALLOC_MIN = 8
STRANDED_MIN_BYTES = 64 << 20
FRAGMENTATION_MIN = 0.20
OOM_UNALLOCATED_MIN_BYTES = 256 << 20
MAX_EVIDENCE = 50

_RANK_DETAIL = pl.Struct(
    {
        "window_us": pl.Float64, "steps": pl.Int64, "step_us": pl.Float64, "busy_us": pl.Float64,
        "compute_us": pl.Float64, "nccl_us": pl.Float64, "overlap_us": pl.Float64, "exposed_us": pl.Float64,
        "idle_us": pl.Float64, "gap_us": pl.Float64, "gaps": pl.Int64, "mallocs": pl.Int64, "frees": pl.Int64,
    }
)
_STEP_DETAIL = pl.Struct({"step_us": pl.Float64, "nccl_us": pl.Float64, "compute_us": pl.Float64, "idle_us": pl.Float64})
_SNAPSHOT_DETAIL = pl.Struct(
    {
        "reserved": pl.Int64, "allocated": pl.Int64, "stranded": pl.Int64, "partial_segments": pl.Int64,
        "largest_free": pl.Int64, "segments": pl.Int64, "segment_allocs": pl.Int64, "segment_frees": pl.Int64,
        "segment_reallocs": pl.Int64, "ooms": pl.Int64, "oom_request": pl.Int64, "fragmentation": pl.Float64,
        "expandable": pl.Boolean,
    }
)


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def _who(ranks: list[int], inferred: bool) -> str:
    return ranks_label(ranks) + (" (GPU index; no rank in the trace)" if inferred else "")


def rank_table(events: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace source, rank): per-step figures decoded from the `trace.rank` events.

    A unit whose rank is unknown (an nsys export without the job's NCCL logs) is keyed by its
    CUDA device index, flagged `inferred`; an nsys profile covers one node, where they coincide.
    """
    rows = events.filter(pl.col("kind") == "trace.rank")
    if rows.height == 0:
        return pl.DataFrame()
    table = rows.select(
        "event_id", "source", "host",
        pl.coalesce("rank", "local_rank", "device").alias("key"),
        pl.col("rank").is_null().alias("inferred"),
        pl.col("detail").str.json_decode(_RANK_DETAIL).alias("d"),
    ).unnest("d")
    per = pl.coalesce("steps", pl.lit(1)).cast(pl.Float64)
    return (
        table.filter(pl.col("key").is_not_null())
        .with_columns(
            pl.coalesce("step_us", "window_us").alias("step_us"),
            (pl.col("nccl_us") / per).alias("nccl_ps"),
            (pl.col("compute_us") / per).alias("compute_ps"),
            (pl.col("idle_us") / per).alias("idle_ps"),
            (pl.col("exposed_us") / per).alias("exposed_ps"),
            (pl.col("overlap_us") / per).alias("overlap_ps"),
            (pl.col("idle_us") / pl.col("window_us")).alias("idle_share"),
        )
        # One row per rank and source even if a rank left several traces (several profiling windows).
        .group_by("source", "key")
        .agg(
            pl.col("event_id").min(),
            pl.col("event_id").alias("event_ids"),
            pl.col("host").drop_nulls().first(),
            pl.col("inferred").any(),
            pl.col("steps").sum(),
            *[pl.col(c).mean() for c in ("step_us", "nccl_ps", "compute_ps", "idle_ps", "exposed_ps", "overlap_ps", "idle_share")],
            pl.col("mallocs").sum(),
            pl.col("frees").sum(),
        )
        .sort("source", "key")
    )


# Point-to-point kernels wait by design in a pipeline schedule (its bubbles): only collectives,
# which every member must join, say who arrived last.
_P2P_OPS = ("SendRecv", "Send", "Recv")


def _collective_time(events: pl.DataFrame, table: pl.DataFrame) -> pl.DataFrame:
    """`table` with coll_ps: time per step in collective (not point-to-point) NCCL kernels."""
    ops = events.filter((pl.col("kind") == "trace.collective") & ~pl.col("op").is_in(_P2P_OPS)).select(
        "source",
        pl.coalesce("rank", "local_rank", "device").alias("key"),
        pl.col("detail").str.json_decode(pl.Struct({"sum_us": pl.Float64})).struct.field("sum_us"),
    )
    per = ops.group_by("source", "key").agg(pl.col("sum_us").sum().alias("coll_us"))
    return table.join(per, on=["source", "key"], how="inner").with_columns(
        (pl.col("coll_us") / pl.max_horizontal(pl.col("steps").fill_null(1), pl.lit(1))).alias("coll_ps")
    )


@register("trace_straggler")
def trace_straggler(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = rank_table(events)
    rows = []
    if table.height == 0:
        return findings_frame(rows)
    table = _collective_time(events, table)
    steps = _step_table(events)
    for (source,), group in table.group_by("source", maintain_order=True):
        if group.height < 2:
            continue
        found = _straggler(group, steps.filter(pl.col("source") == source) if steps.height else steps, events, source)
        if found:
            rows.append(found)
    return findings_frame(rows)


def _step_table(events: pl.DataFrame) -> pl.DataFrame:
    rows = events.filter(pl.col("kind") == "trace.step")
    if rows.height == 0:
        return pl.DataFrame()
    return rows.select(
        "source",
        pl.coalesce("rank", "local_rank", "device").alias("key"),
        pl.col("seq").alias("step"),
        pl.col("detail").str.json_decode(_STEP_DETAIL).struct.field("nccl_us").alias("nccl_us"),
    ).filter(pl.col("key").is_not_null() & pl.col("step").is_not_null())


def _straggler(group: pl.DataFrame, steps: pl.DataFrame, events: pl.DataFrame, source: str) -> dict | None:
    group = group.with_columns((pl.col("coll_ps") - pl.col("coll_ps").min()).alias("wait"))
    max_wait = group.get_column("wait").max()
    if not max_wait or max_wait <= 0:
        return None
    group = group.with_columns((pl.col("wait") <= LAST_ARRIVAL_SHARE * max_wait).alias("last"))
    late, early = group.filter(pl.col("last")), group.filter(~pl.col("last"))
    if late.height * 2 > group.height or early.height == 0:
        return None  # most ranks arrive "last": no minority to blame
    lag = early.get_column("wait").median()
    step = group.get_column("step_us").median()
    if lag < LAG_MIN_US or not step or lag < LAG_MIN_FRACTION * step:
        return None
    culprits = sorted(late.get_column("key").to_list())
    inferred = bool(late.get_column("inferred").any())
    consistent, common = _consistency(steps, set(culprits))
    extra_compute = late.get_column("compute_ps").mean() - early.get_column("compute_ps").median()
    extra_idle = late.get_column("idle_ps").mean() - early.get_column("idle_ps").median()
    who = _who(culprits, inferred)
    fast = early.sort("wait", descending=True).row(0, named=True)
    slow = late.sort("coll_ps").row(0, named=True)
    summary = (
        f"{who} arrives last at the collectives: the other ranks wait {_ms(lag)} per step inside NCCL kernels "
        f"for it ({lag / step:.0%} of the {_ms(step)} step; collective kernels {_ms(fast['coll_ps'])}/step on rank "
        f"{fast['key']} vs {_ms(slow['coll_ps'])} on rank {slow['key']})"
    )
    if common:
        summary += f"; {'it was' if len(culprits) == 1 else 'they were'} last in {consistent} of {common} profiled steps"
    reasons = []
    if extra_compute > 0.1 * lag:
        reasons.append(f"{_ms(extra_compute)}/step more GPU compute")
    if extra_idle > 0.1 * lag:
        reasons.append(f"{_ms(extra_idle)}/step more GPU idle time (host-side stalls)")
    if reasons:
        summary += f"; {who.split(' (')[0]} has {' and '.join(reasons)} than the others"
    summary += f" ({source} traces)"
    confidence = 0.7
    if common >= 3 and consistent >= 0.8 * common:
        confidence += 0.15
    elif common >= 3 and consistent < 0.6 * common:
        confidence -= 0.2
    if inferred:
        confidence -= 0.15
    evidence = sorted(late.get_column("event_ids").explode().to_list() + early.get_column("event_ids").explode().to_list())
    evidence += _collective_evidence(events, source) + _gap_evidence(events, source, culprits)
    hosts = late.get_column("host").drop_nulls().to_list()
    return finding(
        "trace-straggler-rank",
        ranks=culprits,
        hosts=hosts,
        confidence=confidence,
        summary=summary,
        evidence=evidence[:MAX_EVIDENCE],
    )


def _consistency(steps: pl.DataFrame, culprits: set[int]) -> tuple[int, int]:
    """In how many steps profiled on every rank a culprit had the least NCCL time (arrived last)."""
    if steps.height == 0:
        return 0, 0
    n_keys = steps.get_column("key").n_unique()
    per_step = (
        steps.group_by("step")
        .agg(pl.col("key").n_unique().alias("n"), pl.col("key").sort_by("nccl_us").first().alias("last"))
        .filter(pl.col("n") == n_keys)
    )
    return int(per_step.get_column("last").is_in(sorted(culprits)).sum()), per_step.height


def _collective_evidence(events: pl.DataFrame, source: str) -> list[int]:
    """Every rank's collective summaries: each cites its longest kernel, long where a rank waited."""
    ops = events.filter((pl.col("kind") == "trace.collective") & (pl.col("source") == source) & ~pl.col("op").is_in(_P2P_OPS))
    return ops.get_column("event_id").to_list()


def _gaps(events: pl.DataFrame, source: str, keys: list[int]) -> pl.DataFrame:
    """The idle-gap events of `source`'s traces of the ranks (or devices) `keys`."""
    return events.filter(
        (pl.col("kind") == "trace.gap") & (pl.col("source") == source) & pl.coalesce("rank", "local_rank", "device").is_in(keys)
    )


def _gap_evidence(events: pl.DataFrame, source: str, keys: list[int]) -> list[int]:
    return _gaps(events, source, keys).get_column("event_id").to_list()


@register("trace_idle_gaps")
def trace_idle_gaps(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = rank_table(events)
    rows = []
    if table.height == 0:
        return findings_frame(rows)
    # Only annotated steps tell the steady state from start-up and teardown, when GPUs idle anyway.
    idle = table.filter(
        (pl.col("steps") > 0) & (pl.col("idle_ps") >= IDLE_MIN_US) & (pl.col("idle_share") >= IDLE_MIN_FRACTION)
    )
    for (source,), hit in idle.group_by("source", maintain_order=True):
        everyone = table.filter(pl.col("source") == source)
        keys = sorted(hit.get_column("key").to_list())
        inferred = bool(hit.get_column("inferred").any())
        worst = hit.sort("idle_ps", descending=True).row(0, named=True)
        labels = _gap_labels(events, source, keys)
        all_ranks = hit.height == everyone.height and everyone.height > 1
        summary = (
            f"{'every rank' if all_ranks else _who(keys, inferred)}: GPU idle {_ms(worst['idle_ps'])} per step, "
            f"{worst['idle_share']:.0%} of the profiled steps" + (f" ({_who([worst['key']], inferred)})" if len(keys) > 1 else "")
        )
        if labels:
            summary += f"; the longest gaps fall in {labels}"
        if not all_ranks and everyone.height > hit.height:
            others = everyone.filter(~pl.col("key").is_in(keys)).get_column("idle_ps").median()
            summary += f"; the other ranks idle {_ms(others)} per step"
        summary += f" ({source} traces)"
        evidence = sorted(hit.get_column("event_ids").explode().to_list()) + _gap_evidence(events, source, keys)
        rows.append(
            finding(
                "trace-gpu-idle-gaps",
                ranks=[] if all_ranks else keys,
                hosts=[] if all_ranks else hit.get_column("host").drop_nulls().to_list(),
                confidence=0.6 if not inferred else 0.5,
                summary=summary,
                evidence=evidence[:MAX_EVIDENCE],
            )
        )
    return findings_frame(rows)


def _gap_labels(events: pl.DataFrame, source: str, keys: list[int]) -> str:
    """The host-side ranges (record_function / NVTX labels) that the largest idle gaps fall in."""
    during = _gaps(events, source, keys).select(pl.col("detail").str.json_decode(pl.Struct({"during": pl.String})).struct.field("during")).to_series()
    names = during.drop_nulls().value_counts(sort=True).head(3).get_column("during").to_list() if during.drop_nulls().len() else []
    return ", ".join(repr(n) for n in names)


@register("trace_exposed_communication")
def trace_exposed_communication(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = rank_table(events)
    rows = []
    if table.height == 0:
        return findings_frame(rows)
    for (source,), group in table.group_by("source", maintain_order=True):
        if group.height < 2 or not (group.get_column("steps").fill_null(0) > 0).all():
            continue  # one trace cannot tell transfer from waiting; without steps, start-up blurs it
        best = group.sort("exposed_ps").row(0, named=True)
        step = group.get_column("step_us").median()
        if best["exposed_ps"] < EXPOSED_MIN_US or not step or best["exposed_ps"] < EXPOSED_MIN_FRACTION * step:
            continue
        nccl = best["nccl_ps"] or 0.0
        overlap = (best["overlap_ps"] or 0.0) / nccl if nccl else 0.0
        summary = (
            f"communication is not overlapped with compute: even on rank {best['key']}, which waits least, "
            f"{_ms(best['exposed_ps'])} of each {_ms(step)} step ({best['exposed_ps'] / step:.0%}) runs NCCL kernels with no "
            f"compute kernel beside them; only {overlap:.0%} of its NCCL time overlaps compute ({source} traces)"
        )
        rows.append(
            finding(
                "trace-communication-not-overlapped",
                confidence=0.6,
                summary=summary,
                evidence=sorted(group.get_column("event_ids").explode().to_list())[:MAX_EVIDENCE],
            )
        )
    return findings_frame(rows)


@register("allocator_churn")
def allocator_churn(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    rows = []
    table = rank_table(events)
    if table.height:
        churn = table.with_columns(
            ((pl.col("mallocs") + pl.col("frees")) / pl.max_horizontal(pl.col("steps").fill_null(1), pl.lit(1))).alias("per_step")
        ).filter(
            (pl.col("mallocs") >= CHURN_MIN_CALLS // 2)
            & (pl.col("frees") >= CHURN_MIN_CALLS // 2)
            & (pl.col("per_step") >= CHURN_MIN_PER_STEP)
        )
        for (source,), hit in churn.group_by("source", maintain_order=True):
            keys = sorted(hit.get_column("key").to_list())
            worst = hit.sort("per_step", descending=True).row(0, named=True)
            summary = (
                f"{_who(keys, bool(hit.get_column('inferred').any()))}: the caching allocator keeps calling the driver in the "
                f"steady state: {worst['mallocs']} device allocations and {worst['frees']} releases over "
                f"{worst['steps'] or 1} profiled steps (the first left out) on rank {worst['key']} "
                f"({worst['per_step']:.1f} per step; a warmed-up allocator makes none) ({source} traces)"
            )
            rows.append(
                finding(
                    "memory-allocator-churn",
                    ranks=keys,
                    hosts=hit.get_column("host").drop_nulls().to_list(),
                    confidence=0.6,
                    summary=summary,
                    evidence=sorted(hit.get_column("event_ids").explode().to_list())[:MAX_EVIDENCE],
                )
            )
    snapshots = _snapshot_table(events).filter(pl.col("segment_reallocs") >= SEGMENT_REALLOC_MIN)
    for row in snapshots.iter_rows(named=True):  # one row per GPU of each snapshot
        summary = (
            f"GPU {row['device']} memory snapshot: {row['segment_reallocs']} allocator segments were cudaMalloc'ed again "
            f"after the allocator had started releasing segments ({row['segment_allocs']} segment allocations, "
            f"{row['segment_frees']} releases in the recorded history)"
        )
        rows.append(
            finding("memory-allocator-churn", ranks=_opt(row["rank"]), confidence=0.55, summary=summary, evidence=[row["event_id"]])
        )
    return findings_frame(rows)


def _opt(value: int | None) -> list[int]:
    return [] if value is None else [value]


def _snapshot_table(events: pl.DataFrame) -> pl.DataFrame:
    rows = events.filter(pl.col("kind") == "memory.snapshot")
    if rows.height == 0:
        return pl.DataFrame(schema={"event_id": pl.Int64, "rank": pl.Int64, "device": pl.Int64, "file": pl.String, **_SNAPSHOT_DETAIL.to_schema()})
    return rows.select("event_id", "rank", "device", "file", pl.col("detail").str.json_decode(_SNAPSHOT_DETAIL).alias("d")).unnest("d")


@register("memory_fragmentation")
def memory_fragmentation(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    rows = []
    snapshots = _snapshot_table(events).filter(
        (pl.col("stranded") >= STRANDED_MIN_BYTES) & (pl.col("fragmentation") >= FRAGMENTATION_MIN)
    )
    ooms = events.filter(pl.col("kind") == "memory.oom")
    for row in snapshots.iter_rows(named=True):  # one row per GPU of each fragmented snapshot
        unallocated = row["reserved"] - row["allocated"]
        summary = (
            f"GPU {row['device']} ({row['file']}): {byte_size(row['stranded'])} free inside {row['partial_segments']} partly used "
            f"allocator segments, {row['fragmentation']:.0%} of the {byte_size(row['reserved'])} reserved; the largest free block "
            f"is {byte_size(row['largest_free'])}"
        )
        request = row["oom_request"]
        evidence = [row["event_id"]]
        fits_if_contiguous = bool(row["ooms"]) and request is not None and row["largest_free"] < request <= unallocated
        if fits_if_contiguous:
            summary += (
                f"; the {byte_size(request)} request that ran out of memory would have fitted in the {byte_size(unallocated)} "
                "reserved but unallocated, had it been contiguous"
            )
            same = ooms.filter((pl.col("file") == row["file"]) & (pl.col("device") == row["device"]))
            evidence += same.get_column("event_id").to_list()
        rows.append(
            finding(
                "memory-snapshot-fragmentation-oom" if fits_if_contiguous else "memory-snapshot-fragmented",
                ranks=_opt(row["rank"]),
                confidence=0.85 if fits_if_contiguous else 0.6,
                summary=summary,
                evidence=evidence,
            )
        )
    return findings_frame(rows)


_UNIT_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_AMOUNT = r"([\d.]+) ([KMGT]?i?B)"
# The share of PyTorch's reserved memory left idle (reserved but unallocated) from which an OOM is the
# cache's fragmentation rather than the model's need (memory-oom-idle-cache-fragmented).
IDLE_RESERVE_SHARE = 0.25


def _bytes(pattern: str) -> pl.Expr:
    text = pl.col("message")
    amount = text.str.extract(pattern, 1).cast(pl.Float64, strict=False)
    unit = text.str.extract(pattern, 2).replace_strict(_UNIT_BYTES, default=None, return_dtype=pl.Float64)
    return amount * unit


_OOM_KINDS = ["traceback.exception", "cuda.error", "log.error", "nccl.warn"]
_OOM_DETAIL_LINES = 4  # how far below its OOM line a size line (`memory.oom_detail`) still belongs to it


def _with_size_lines(events: pl.DataFrame) -> pl.DataFrame:
    """The OOM lines, each message extended with the size lines printed just below it by the same
    writer (`GPU has T total, F free.` / `PyTorch allocated: A` / `Reserved but unallocated: R`)."""
    ooms = events.filter(pl.col("kind").is_in(_OOM_KINDS) & pl.col("message").str.contains("Tried to allocate"))
    sizes = events.filter(pl.col("kind") == "memory.oom_detail").select("file", "rank", pl.col("line").alias("_at"), pl.col("message").alias("_size"))
    if ooms.height == 0 or sizes.height == 0:
        return ooms
    below = (
        ooms.select("event_id", "file", "rank", "line")
        .join(sizes, on=["file", "rank"], how="inner", nulls_equal=True)
        .filter((pl.col("_at") > pl.col("line")) & (pl.col("_at") <= pl.col("line") + _OOM_DETAIL_LINES))
        .sort("event_id", "_at")
        .group_by("event_id", maintain_order=True)
        .agg(pl.col("_size").str.strip_chars().str.join(" ").alias("_sizes"))
    )
    joined = ooms.join(below, on="event_id", how="left", maintain_order="left")
    return joined.with_columns(
        pl.when(pl.col("_sizes").is_not_null()).then(pl.col("message") + " " + pl.col("_sizes")).otherwise(pl.col("message")).alias("message")
    ).drop("_sizes")


@register("oom_reserved_unallocated")
def oom_reserved_unallocated(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    lines = _with_size_lines(events).filter(
        pl.col("message").str.contains("reserved by PyTorch but unallocated|reserved in total by PyTorch|Reserved but unallocated:")
    )
    if lines.height == 0:
        return findings_frame([])
    # PyTorch < 2.1 prints no unallocated clause: reserved in total minus already allocated is the same
    # amount, counted only when the request would have fit on the card beside what was allocated.
    allocated = _bytes(rf"{_AMOUNT} already allocated")
    request = _bytes(rf"Tried to allocate {_AMOUNT}")
    old_wording = pl.when(allocated + request <= _bytes(rf"{_AMOUNT} total capacity")).then(
        _bytes(rf"{_AMOUNT} reserved in total by PyTorch") - allocated
    )
    measured = lines.with_columns(
        request.alias("request"),
        pl.coalesce(_bytes(rf"{_AMOUNT} is reserved by PyTorch but unallocated"), _bytes(rf"Reserved but unallocated: {_AMOUNT}"),
                    old_wording).alias("unallocated"),
        pl.coalesce(_bytes(rf"{_AMOUNT} is allocated by PyTorch"), _bytes(rf"PyTorch allocated: {_AMOUNT}"), allocated).alias("allocated"),
    ).filter(
        pl.col("request").is_not_null()
        & (pl.col("unallocated") >= pl.col("request"))
        & (pl.col("unallocated") >= OOM_UNALLOCATED_MIN_BYTES)
    )
    if measured.height == 0:
        return findings_frame([])
    worst = measured.sort("unallocated", descending=True).row(0, named=True)
    ranks = measured.get_column("rank").drop_nulls().unique().sort().to_list()
    where = f" on {_who(ranks, False)}" if ranks else ""
    summary = (
        f"CUDA out of memory{where} with {byte_size(worst['unallocated'])} reserved by PyTorch but unallocated, at least the "
        f"{byte_size(worst['request'])} that was requested: the free memory is split into blocks too small for the request"
    )
    # A large idle share of the allocator's reserve: the model's own need cannot explain the failure. Where
    # it could (a card nearly full of live tensors, cases 022 and 148), at most 15% of the reserve was idle.
    reserved = (worst["allocated"] or 0) + worst["unallocated"]
    idle = worst["allocated"] is not None and worst["unallocated"] >= IDLE_RESERVE_SHARE * reserved
    if idle:
        summary += f", {worst['unallocated'] / reserved:.0%} of the {byte_size(reserved)} PyTorch reserved"
    return findings_frame(
        [
            finding(
                "memory-oom-idle-cache-fragmented" if idle else "memory-oom-reserved-unallocated",
                ranks=ranks,
                hosts=measured.get_column("host").drop_nulls().unique().to_list(),
                confidence=0.7 if idle else 0.6,
                summary=summary,
                evidence=measured.get_column("event_id").head(MAX_EVIDENCE).to_list(),
            )
        ]
    )
