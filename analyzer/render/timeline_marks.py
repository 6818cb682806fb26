"""Stage 7, render (data side of the HTML timeline, first half): units and their markers as frames.

Everything here is polars over the canonical event frame (with `event_id`, as correlate numbers
it); `analyzer.render.timeline` folds what this module places into lanes.

- A **unit** is one thing that logs: a rank; failing that a process (`host` + `pid`), a host, or a
  file, so that lines no stage could attribute still appear, in a lane of their own.
- A **marker** is an event worth a point: init, steps, warnings, errors, watchdog timeouts,
  exceptions, collective state, the last line a file logged, and every finding's evidence.
- Three **panels** share the lanes. `time`: events with a wall clock, on one UTC axis whatever
  their source (`ts_source` says which, and whether the clock was inferred). `order`: events
  without one, by line order within their unit (the sequence axis). `seq`: collective progress
  by sequence number per process group (last completed, last enqueued, waiting/timed out), from
  watchdog lines, `pg_status` and Flight Recorder entries.
- Markers are thinned evenly per unit, panel and class (`thin`); evidence is always kept.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

PANELS = ("time", "order", "seq")

# Marker classes in legend order, with the legend name. Drawing attributes live in timeline_payload.py.
CLASSES: dict[str, str] = {
    "init": "init",
    "step": "step",
    "warning": "warning",
    "error": "error",
    "watchdog": "watchdog timeout",
    "exception": "exception",
    "collective": "collective state",
    "last": "last line logged",
    "evidence": "other evidence",
    "coll.completed": "last completed collective",
    "coll.enqueued": "last enqueued collective",
    "coll.waiting": "waiting / timed out in collective",
}

# Kinds with a class of their own; other warning/error/fatal kinds fall back to their severity.
KIND_CLASS: dict[str, str] = {
    "nccl.comm_init": "init",
    "train.step": "step",
    "progress": "step",
    "train.end": "step",
    "watchdog.timeout": "watchdog",
    "watchdog.heartbeat": "watchdog",
    "traceback.exception": "exception",
    "torchrun.child_failed": "exception",
    "watchdog.pg_status": "collective",
    "desync.report": "collective",
    "desync.lagging": "collective",
    "frtrace.missing_ranks": "collective",
    "frtrace.culprit": "collective",
    "log.last": "last",
}

# Error-severity kinds that are context of another line (stack frames, table rows, NCCL's error
# call chain), not events of their own: one watchdog timeout brings a dozen of them.
QUIET_KINDS = frozenset(
    {
        "watchdog.frame",
        "native.frame",
        "nccl.error_chain",
        "torchrun.table_field",
        "torchrun.table_section",
        "stack.thread",
        "stack.process",
        "fr.entry",
        "fr.pg_status",
    }
)

MAX_PER_CLASS = 200  # markers per unit, panel and class; steps are thinned evenly beyond it


# --- units -----------------------------------------------------------------------------------------


def unit_columns() -> list[pl.Expr]:
    """`unit` (a stable key), `unit_type`, `unit_label` from rank, host, pid and file."""
    rank, host, pid, file = pl.col("rank"), pl.col("host"), pl.col("pid"), pl.col("file")
    unit_type = (
        pl.when(rank.is_not_null())
        .then(pl.lit("rank"))
        .when(host.is_not_null() & pid.is_not_null())
        .then(pl.lit("process"))
        .when(host.is_not_null())
        .then(pl.lit("host"))
        .otherwise(pl.lit("file"))
    )
    unit = (
        pl.when(rank.is_not_null())
        .then(pl.format("r:{}", rank))
        .when(host.is_not_null() & pid.is_not_null())
        .then(pl.format("p:{}:{}", host, pid))
        .when(host.is_not_null())
        .then(pl.format("h:{}", host))
        .otherwise(pl.format("f:{}", file.fill_null("?")))
    )
    label = (
        pl.when(rank.is_not_null() & host.is_not_null())
        .then(pl.format("rank {} ({})", rank, host))
        .when(rank.is_not_null())
        .then(pl.format("rank {}", rank))
        .when(host.is_not_null() & pid.is_not_null())
        .then(pl.format("{} pid {}", host, pid))
        .when(host.is_not_null())
        .then(pl.format("{} (no rank)", host))
        .otherwise(pl.format("{} (no rank or host)", file.fill_null("?")))
    )
    return [unit.alias("unit"), unit_type.alias("unit_type"), label.alias("unit_label")]


# --- markers ---------------------------------------------------------------------------------------


def evidence_frame(verdict_ids: Collection[int], other_ids: Collection[int]) -> pl.DataFrame:
    """event_id -> evidence level: 2 for the verdict's evidence, 1 for another finding's."""
    frame = pl.DataFrame(
        {
            "event_id": [*map(int, verdict_ids), *map(int, other_ids)],
            "evidence": [2] * len(verdict_ids) + [1] * len(other_ids),
        },
        schema={"event_id": pl.Int64, "evidence": pl.Int8},
    )
    return frame.group_by("event_id").agg(pl.col("evidence").max()).sort("event_id")


def classify(events: pl.DataFrame, evidence: pl.DataFrame | None = None) -> pl.DataFrame:
    """Events that become time/order markers, with their class, unit and clock.

    Columns: event_id, unit, unit_type, rank, host, file, line, cls, ts_ms (epoch ms,
    UTC, null without a clock), ts_source, inferred, evidence (0, 1, 2).
    """
    evidence = evidence if evidence is not None else evidence_frame((), ())
    kind_class = pl.col("kind").replace_strict(KIND_CLASS, default=None, return_dtype=pl.String)
    by_severity = (
        pl.when(pl.col("kind").is_in(sorted(QUIET_KINDS)))
        .then(pl.lit(None, dtype=pl.String))
        .when(pl.col("severity") == "warning")
        .then(pl.lit("warning"))
        .when(pl.col("severity").is_in(["error", "fatal"]))
        .then(pl.lit("error"))
    )
    # Evidence turns any line into a marker (it is why a finding fired); test membership before
    # the join so that the units are only computed for the few rows kept.
    is_evidence = pl.col("event_id").is_in(evidence.get_column("event_id").implode())
    cls = pl.coalesce(kind_class, by_severity, pl.when(is_evidence).then(pl.lit("evidence")))
    return (
        events.select("event_id", "rank", "host", "pid", "file", "line", "kind", "severity", "ts", "ts_source")
        .with_columns(cls.alias("cls"))
        .filter(pl.col("cls").is_not_null())
        .join(evidence, on="event_id", how="left")
        .with_columns(unit_columns()[:2])
        .select(
            "event_id", "unit", "unit_type", "rank", "host", "file", "line", "cls",
            (pl.col("ts").dt.epoch("us") / 1000.0).alias("ts_ms"),
            "ts_source",
            pl.col("ts_source").fill_null("").str.contains("inferred").alias("inferred"),
            pl.col("evidence").fill_null(0).cast(pl.Int8),
        )
        .sort("event_id")
    )


def collective_marks(events: pl.DataFrame) -> pl.DataFrame:
    """Collective progress per unit and process group: last completed, last enqueued, waiting.

    Columns: unit, group (process group, "" when unknown), cls (coll.completed, coll.enqueued,
    coll.waiting), x (sequence number), op, event_id. Completed/enqueued keep the highest number
    seen, waiting the lowest (the collective the unit is stuck in). Flight Recorder dumps can hold
    thousands of entries per rank, so rows are reduced per (rank, host, pid, file, pg) with
    numeric aggregations before any unit string is built.
    """
    ids = ["rank", "host", "pid", "file", "group"]
    base = events.select(
        "event_id", "rank", "host", "pid", "file", "kind", "seq", "op", "code", "last_enqueued", "last_completed",
        pl.col("pg").fill_null("").alias("group"),
    )
    no_op = pl.lit(None, dtype=pl.String)
    waiting = pl.col("kind").is_in(["watchdog.timeout", "desync.report"]) & pl.col("seq").is_not_null()
    fr = (pl.col("kind") == "fr.entry") & pl.col("seq").is_not_null()
    parts = [
        (waiting, "coll.waiting", pl.col("seq"), pl.col("op")),
        (pl.col("last_enqueued").is_not_null(), "coll.enqueued", pl.col("last_enqueued"), no_op),
        (pl.col("last_completed").is_not_null(), "coll.completed", pl.col("last_completed"), no_op),
        (fr, "coll.enqueued", pl.col("seq"), pl.col("op")),
        (fr & (pl.col("code") == "completed"), "coll.completed", pl.col("seq"), pl.col("op")),
        (fr & pl.col("code").is_in(["scheduled", "started"]), "coll.waiting", pl.col("seq"), pl.col("op")),
    ]
    rows = pl.concat(
        [
            base.filter(keep).select(*ids, pl.lit(cls).alias("cls"), x.cast(pl.Int64).alias("x"), op.alias("op"), "event_id")
            for keep, cls, x, op in parts
        ],
        how="vertical",
    )
    # Highest for completed/enqueued, lowest for waiting; an event with the op named wins a tie,
    # then the earliest event.
    order = pl.when(pl.col("cls") == "coll.waiting").then(pl.col("x")).otherwise(-pl.col("x"))
    reduced = (
        rows.group_by([*ids, "cls"])
        .agg(pl.col("x", "op", "event_id").sort_by([order, pl.col("op").is_null(), pl.col("event_id")]).first())
        .cast({"x": pl.Int64, "op": pl.String, "event_id": pl.Int64})  # an empty frame aggregates to nulls
    )
    units = reduced.with_columns(unit_columns()[0])
    # Older watchdog lines name no process group; when a unit's other collective lines name
    # exactly one, the unnamed ones are that group's (else one wait would show twice).
    only = (
        units.filter(pl.col("group") != "")
        .group_by("unit")
        .agg(pl.col("group").unique().alias("_groups"))
        .filter(pl.col("_groups").list.len() == 1)
        .select("unit", pl.col("_groups").list.first().alias("_only"))
    )
    units = units.join(only, on="unit", how="left").with_columns(
        pl.when(pl.col("group") == "").then(pl.coalesce("_only", pl.lit(""))).otherwise(pl.col("group")).alias("group")
    )
    return (
        units.with_columns(order.alias("_o"), pl.col("op").is_null().alias("_no_op"))
        .sort(["unit", "group", "cls", "_o", "_no_op", "event_id"])
        .unique(["unit", "group", "cls"], keep="first", maintain_order=True)
        .select("unit", "group", "cls", "x", "op", "event_id")
    )


def runs(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Add `_pos` (0-based position within each run of equal `keys`) and `_n` (the run's length).

    The frame must be sorted by `keys`. Cheaper than windows `.over(keys)` on string keys: one
    run id, a forward-filled run start, and the run lengths gathered back.
    """
    run = pl.struct(keys).rle_id()
    index = pl.int_range(pl.len(), dtype=pl.Int64)
    start = pl.when(pl.col("_run") != pl.col("_run").shift(1).fill_null(-1)).then(index).forward_fill()
    return (
        frame.with_columns(run.alias("_run"))
        .with_columns(
            (index - start).alias("_pos"),
            pl.col("_run").rle().struct.field("len").gather(pl.col("_run")).alias("_n"),
        )
        .drop("_run")
    )


def thin(frame: pl.DataFrame, keys: list[str], cap: int) -> pl.DataFrame:
    """At most about `cap` rows per key, evenly spread (first and last kept); evidence always kept.

    Returns the rows sorted by keys, x, event_id.
    """
    ordered = runs(frame.sort([*keys, "x", "event_id"]), keys)
    stride = ((pl.col("_n") + cap - 1) // cap).clip(lower_bound=1)
    keep = (pl.col("evidence") > 0) | (pl.col("_pos") % stride == 0) | (pl.col("_pos") == pl.col("_n") - 1)
    return ordered.filter(keep).drop("_pos", "_n")


def unit_markers(events: pl.DataFrame, evidence: pl.DataFrame | None = None, cap: int = MAX_PER_CLASS,
                 marks: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every marker of every unit, placed: panel, x, and k (its ordinal within unit/panel/class/group).

    Columns: unit, panel, cls, group, k, x, event_id, evidence, inferred, op.
    `time` x is epoch ms (UTC); `order` x is the marker's line-order position in its unit
    (1, 2, ...; file then line); `seq` x is the collective sequence number.
    """
    evidence = evidence if evidence is not None else evidence_frame((), ())
    marks = classify(events, evidence) if marks is None else marks
    placed = marks.with_columns(
        pl.when(pl.col("ts_ms").is_not_null()).then(pl.lit("time")).otherwise(pl.lit("order")).alias("panel")
    )
    # Line order within the unit: file, then line (files of one rank: stderr, stdout, ...).
    placed = runs(placed.sort(["unit", "panel", "file", "line", "event_id"]), ["unit", "panel"])
    placed = placed.with_columns(
        pl.when(pl.col("panel") == "time").then(pl.col("ts_ms")).otherwise(pl.col("_pos") + 1).cast(pl.Float64).alias("x"),
        pl.lit("").alias("group"),
        pl.lit(None, dtype=pl.String).alias("op"),
    ).select("unit", "panel", "cls", "group", "x", "event_id", "evidence", "inferred", "op")
    coll = (
        collective_marks(events)
        .join(evidence, on="event_id", how="left")
        .select(
            "unit", pl.lit("seq").alias("panel"), "cls", "group", pl.col("x").cast(pl.Float64), "event_id",
            pl.col("evidence").fill_null(0).cast(pl.Int8), pl.lit(False).alias("inferred"), "op",
        )
    )
    keys = ["unit", "panel", "cls", "group"]
    thinned = runs(thin(pl.concat([placed, coll], how="vertical"), keys, cap), keys)
    return thinned.with_columns(pl.col("_pos").cast(pl.Int32).alias("k")).drop("_pos", "_n")


def clock_sources(events: pl.DataFrame) -> pl.DataFrame:
    """How the timestamps on the time axis were known: ts_source, events, inferred."""
    return (
        events.filter(pl.col("ts").is_not_null())
        .group_by(pl.col("ts_source").fill_null("unknown"))
        .agg(pl.len().alias("events"))
        .with_columns(pl.col("ts_source").str.contains("inferred").alias("inferred"))
        .sort("ts_source")
    )
