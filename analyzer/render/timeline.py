"""Stage 7, render (data side of the HTML timeline): lanes, folded lanes and marker rows as frames.

Analysis returns frames and only the report draws: this module and `analyzer.render.timeline_marks`
decide *what* the cross-rank timeline shows and `analyzer.render.html` decides *how*. The marks
module places every unit's markers on the three panels (time, line order, collective sequence);
here the units become lanes.

- **Folding**: at `fold_threshold` units or more, units that behave alike (same marker classes in
  the same order, same collective states) share one lane, e.g. "ranks 0,2-1023: waiting in
  ALLREDUCE #35"; the odd ones and the culprits keep their own lanes. When exact behaviour still
  leaves more than `max_lanes` lanes, coarser keys (sequence numbers ignored, then only the
  final state) fold further. The folded units' own markers stay available (`members`) so the
  report can expand a fold.
- **Step times** (`step_times`): for slow jobs, each rank's step duration by step and the part of it
  spent outside collectives, from the trace parsers' `trace.step` events. Collectives synchronise
  the ranks, so every rank's step lasts as long; the straggler is the rank whose time outside the
  collectives is longest (the others spend theirs waiting for it inside NCCL).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import polars as pl

from analyzer.render.timeline_marks import (MAX_PER_CLASS, classify, clock_sources, evidence_frame, runs, thin,
                                            unit_columns, unit_markers)

# Unit types in lane order within a host: ranks first, then processes, hosts, files.
_UNIT_TYPES = {"rank": 0, "process": 1, "host": 2, "file": 3}

MIN_PER_CLASS = 8  # per-class cap of a job with many units: never fewer than this
POINT_BUDGET = 40_000  # per-class cap ~ budget / units, so a thousand unfolded lanes stay drawable
MAX_PER_CLASS_MEMBER = 2  # units inside a fold keep their first and last (and middle) marker per class
FOLD_THRESHOLD = 1024
MAX_LANES = 256
STEP_RANKS = 48  # ranks drawn in the step-time panel: the culprits, then evenly spread others
STEP_POINTS = 400  # steps per rank drawn; evenly thinned beyond
_STEP_DETAIL = pl.Struct({"step_us": pl.Float64, "nccl_us": pl.Float64})


@dataclass(frozen=True)
class Timeline:
    """The frames the HTML report draws (see the module docstring)."""

    lanes: pl.DataFrame  # one row per lane, in display order
    markers: pl.DataFrame  # one row per point drawn in a lane (aggregated over a fold's members)
    members: pl.DataFrame  # folded units' own markers, for expanding a fold
    units: pl.DataFrame  # every unit, its lane, label and behaviour
    clocks: pl.DataFrame  # ts_source -> events with that clock, inferred flag
    stats: dict = field(default_factory=dict)


# --- behaviour and folding ------------------------------------------------------------------------


def unit_table(events: pl.DataFrame, markers: pl.DataFrame, culprit_ranks: Collection[int] = (),
               culprit_hosts: Collection[str] = ()) -> pl.DataFrame:
    """One row per unit that has a marker: label, host, rank, display order, culprit flag.

    A culprit is a named rank; when the verdict names hosts only, every unit on those hosts.
    """
    attrs = (
        events.join(markers.select("event_id").unique(), on="event_id", how="semi").with_columns(unit_columns())
        .group_by("unit")
        .agg(
            pl.col("unit_type").first(),
            pl.col("rank").first(),
            pl.col("host").drop_nulls().mode().sort().first().alias("host"),
            pl.col("pid").drop_nulls().min().alias("pid"),
            pl.col("file").min().alias("file"),
        )
        # The label from the unit's settled host, not from whichever line came first.
        .with_columns(unit_columns()[2])
    )
    ranks = sorted(int(r) for r in culprit_ranks)
    hosts = sorted(str(h) for h in culprit_hosts)
    culprit = pl.col("rank").is_in(ranks) if ranks else (pl.col("host").is_in(hosts) if hosts else pl.lit(False))
    return (
        attrs.with_columns(
            pl.col("unit_type").replace_strict(_UNIT_TYPES, return_dtype=pl.Int8).alias("_t"),
            culprit.fill_null(False).alias("culprit"),
        )
        .sort(["host", "_t", "rank", "pid", "file", "unit"], nulls_last=True)
        .with_row_index("unit_order")
        .drop("_t")
    )


def behaviour_keys(markers: pl.DataFrame) -> pl.DataFrame:
    """Per unit, three keys from exact to coarse, and a state phrase.

    - `exact`: marker classes in order (repeats collapsed; the last-line marker left out) + each
      collective state with its number;
    - `coarse`: the same without sequence numbers;
    - `final`: the unit's most telling state only (waiting in OP, raised, last class logged).
    """
    # The last line a file logged is a position, not a behaviour: with one file per host only the
    # rank that printed last has one, and it must not split ranks that otherwise behave alike.
    flow = (
        markers.filter((pl.col("panel") != "seq") & (pl.col("cls") != "last"))
        .sort(["unit", pl.col("panel").replace_strict({"time": 0, "order": 1}, return_dtype=pl.Int8), "x", "event_id"])
        .filter(pl.col("cls") != pl.col("cls").shift(1).over("unit").fill_null(""))
        .group_by("unit", maintain_order=True)
        .agg(pl.col("cls").str.join(">").alias("flow"), pl.col("cls").last().alias("last_cls"),
             (pl.col("cls") == "exception").any().alias("raised"))
    )
    seq = markers.filter(pl.col("panel") == "seq").sort(["unit", "group", "cls"])
    coll = seq.group_by("unit", maintain_order=True).agg(
        pl.format("{}:{}:{}:{}", "group", "cls", pl.col("op").fill_null(""), pl.col("x").cast(pl.Int64)).str.join(";").alias("coll_exact"),
        pl.format("{}:{}:{}", "group", "cls", pl.col("op").fill_null("")).str.join(";").alias("coll_coarse"),
    )
    waiting = (
        seq.filter(pl.col("cls") == "coll.waiting")
        .sort(["unit", "x", "group"])
        .unique("unit", keep="first", maintain_order=True)
        .select("unit", pl.col("op").alias("wait_op"))
    )
    units = pl.concat([flow.select("unit"), coll.select("unit")]).unique().sort("unit")
    keys = (
        units.join(flow, on="unit", how="left")
        .join(coll, on="unit", how="left")
        .join(waiting, on="unit", how="left")
        .with_columns(pl.col("flow", "coll_exact", "coll_coarse").fill_null(""))
    )
    final = (
        pl.when(pl.col("raised")).then(pl.lit("raised"))
        .when(pl.col("wait_op").is_not_null()).then(pl.format("waiting in {}", "wait_op"))
        .when(pl.col("coll_coarse").str.contains("coll.waiting")).then(pl.lit("waiting in a collective"))
        .otherwise(pl.format("last: {}", pl.col("last_cls").fill_null("collective state")))
    )
    return keys.select(
        "unit",
        pl.format("{}|{}", "flow", "coll_exact").alias("exact"),
        pl.format("{}|{}", "flow", "coll_coarse").alias("coarse"),
        final.alias("final"),
    )


def assign_lanes(units: pl.DataFrame, keys: pl.DataFrame, fold_threshold: int = FOLD_THRESHOLD,
                 max_lanes: int = MAX_LANES) -> tuple[pl.DataFrame, str]:
    """unit -> lane id (and the key level used: none, exact, coarse, final).

    Below `fold_threshold` units every unit is its own lane. Otherwise non-culprit units with the
    same key share a lane; the first key level that leaves at most `max_lanes` lanes is used.
    Lane ids follow display order: a lane sits where its first unit would.
    """
    table = units.join(keys, on="unit", how="left").with_columns(pl.col("exact", "coarse", "final").fill_null(""))
    level = "none"
    grouped = table.with_columns(pl.col("unit").alias("_key"))
    if units.height >= fold_threshold:
        for level in ("exact", "coarse", "final"):
            key = pl.when(pl.col("culprit")).then(pl.format("culprit:{}", "unit")).otherwise(pl.col(level))
            grouped = table.with_columns(key.alias("_key"))
            if grouped.get_column("_key").n_unique() <= max_lanes:
                break
    first = grouped.group_by("_key").agg(pl.col("unit_order").min().alias("_first"))
    lane = first.sort("_first").with_row_index("lane").select("_key", pl.col("lane").cast(pl.Int32))
    assigned = grouped.join(lane, on="_key", how="left").drop("_key").sort("unit_order")
    return assigned, level


def rank_ranges(ranks: pl.Expr) -> pl.Expr:
    """A list of ranks as text, `[0, 2, 3, 4, 7]` -> `0,2-4,7` (for use inside `agg`)."""
    sorted_ranks = ranks.drop_nulls().unique().sort()
    run = sorted_ranks - pl.int_range(sorted_ranks.len())
    starts = sorted_ranks.filter(run != run.shift(1).fill_null(-(2**62)))
    ends = sorted_ranks.filter(run != run.shift(-1).fill_null(-(2**62)))
    spans = pl.when(starts == ends).then(starts.cast(pl.String)).otherwise(
        pl.format("{}-{}", starts, ends)
    )
    return spans.str.join(",")


def lane_table(assigned: pl.DataFrame, lane_markers: pl.DataFrame) -> pl.DataFrame:
    """One row per lane: label, state, host (when one), members, culprit, folded."""
    lanes = assigned.group_by("lane").agg(
        pl.len().alias("units"),
        pl.col("unit_label").first().alias("single_label"),
        pl.col("unit_type").first().alias("unit_type"),
        (pl.col("unit_type") == "rank").all().alias("all_ranks"),
        rank_ranges(pl.col("rank")).alias("ranks_text"),
        pl.col("rank").drop_nulls().sort().alias("ranks"),
        pl.col("host").drop_nulls().unique().sort().alias("hosts"),
        pl.col("culprit").any().alias("culprit"),
        pl.col("final").first().alias("final"),
    )
    state = _lane_state(lane_markers)
    folded = pl.col("units") > 1
    fold_label = (
        pl.when(pl.col("all_ranks"))
        .then(pl.format("ranks {}", "ranks_text"))
        .otherwise(pl.format("{} {} lanes", "units", "unit_type"))
    )
    return (
        lanes.join(state, on="lane", how="left")
        .with_columns(
            folded.alias("folded"),
            pl.when(folded).then(fold_label).otherwise(pl.col("single_label")).alias("label"),
            pl.when(pl.col("hosts").list.len() == 1).then(pl.col("hosts").list.first()).alias("host"),
            pl.coalesce("state", "final").fill_null("").alias("state"),
        )
        .sort("lane")
        .select("lane", "label", "state", "host", "hosts", "ranks", "ranks_text", "units", "unit_type", "culprit", "folded")
    )


def _lane_state(lane_markers: pl.DataFrame) -> pl.DataFrame:
    """A lane's state phrase from its collective marks, e.g. 'waiting in ALLREDUCE #35'."""
    seq = lane_markers.filter(pl.col("panel") == "seq")
    number = pl.when(pl.col("lo") == pl.col("hi")).then(pl.format("#{}", pl.col("lo").cast(pl.Int64))).otherwise(
        pl.format("#{}-{}", pl.col("lo").cast(pl.Int64), pl.col("hi").cast(pl.Int64))
    )
    pg = pl.when(pl.col("group").is_in(["", "0"])).then(pl.lit("")).otherwise(pl.format(" (pg {})", "group"))
    waiting = (
        seq.filter(pl.col("cls") == "coll.waiting")
        .sort(["lane", "lo", "group"])
        .unique("lane", keep="first", maintain_order=True)
        .select("lane", pl.format("waiting in {}{}{}", pl.coalesce(pl.col("op") + pl.lit(" "), pl.lit("")), number, pg).alias("wait"))
    )
    progress = (
        seq.filter(pl.col("cls").is_in(["coll.enqueued", "coll.completed"]))
        .sort(["lane", "group", "cls"], descending=[False, False, True])
        .group_by("lane", maintain_order=True)
        .agg(pl.format("last {} {}{}", pl.col("cls").str.strip_prefix("coll."), number, pg).str.join(", ").alias("progress"))
    )
    return (
        pl.concat([waiting.select("lane"), progress.select("lane")]).unique()
        .join(waiting, on="lane", how="left")
        .join(progress, on="lane", how="left")
        .select("lane", pl.coalesce("wait", "progress").alias("state"))
    )


def aggregate_markers(markers: pl.DataFrame, assigned: pl.DataFrame) -> pl.DataFrame:
    """Markers per lane: a folded lane's k-th marker of a class aggregates its members' k-th.

    Columns: lane, panel, cls, group, k, x (median), lo, hi, count (units), event_id (of the
    first unit in display order), evidence (max), inferred (any), op.
    """
    keys = ["lane", "panel", "cls", "group", "k"]
    return (
        markers.join(assigned.select("unit", "lane", "unit_order"), on="unit", how="inner")
        .sort([*keys, "unit_order"])
        .group_by(keys, maintain_order=True)
        .agg(
            pl.col("x").median().alias("x"),
            pl.col("x").min().alias("lo"),
            pl.col("x").max().alias("hi"),
            pl.len().cast(pl.Int32).alias("count"),
            pl.col("event_id").first(),
            pl.col("evidence").max(),
            pl.col("inferred").any(),
            pl.col("op").drop_nulls().first(),
        )
        .sort(keys)
    )


def per_class_cap(units: int) -> int:
    """Markers kept per unit, panel and class: MAX_PER_CLASS for a few units, fewer for many."""
    return max(MIN_PER_CLASS, min(MAX_PER_CLASS, POINT_BUDGET // max(units, 1)))


def build_timeline(
    events: pl.DataFrame,
    *,
    culprit_ranks: Collection[int] = (),
    culprit_hosts: Collection[str] = (),
    verdict_evidence: Collection[int] = (),
    other_evidence: Collection[int] = (),
    fold_threshold: int = FOLD_THRESHOLD,
    max_lanes: int = MAX_LANES,
) -> Timeline:
    """Lanes, markers and fold members for the job's events (see the module docstring)."""
    evidence = evidence_frame(verdict_evidence, other_evidence)
    marks = classify(events, evidence)
    cap = per_class_cap(marks.get_column("unit").n_unique())
    markers = unit_markers(events, evidence, cap, marks)
    units = unit_table(events, markers, culprit_ranks, culprit_hosts)
    keys = behaviour_keys(markers)
    assigned, level = assign_lanes(units, keys, fold_threshold, max_lanes)
    lane_markers = aggregate_markers(markers, assigned)
    lanes = lane_table(assigned, lane_markers)
    folded_units = assigned.join(lanes.filter(pl.col("folded")).select("lane"), on="lane", how="semi")
    members = (
        thin(markers.join(folded_units.select("unit"), on="unit", how="semi"), ["unit", "panel", "cls", "group"],
              MAX_PER_CLASS_MEMBER)
        .join(folded_units.select("unit", "lane", "unit_order"), on="unit", how="inner")
        .sort(["lane", "unit_order", "panel", "cls", "group", "k"])
    )
    stats = {
        "units": units.height,
        "lanes": lanes.height,
        "fold_level": level,
        "folded_units": folded_units.height,
        "time_markers": markers.filter(pl.col("panel") == "time").height,
        "order_markers": markers.filter(pl.col("panel") == "order").height,
        "seq_markers": markers.filter(pl.col("panel") == "seq").height,
        "per_class_cap": cap,
        "member_cap": MAX_PER_CLASS_MEMBER,
    }
    return Timeline(lanes, lane_markers, members, assigned, clock_sources(events), stats)


# --- step times -----------------------------------------------------------------------------------


def step_times(events: pl.DataFrame, culprit_ranks: Collection[int] = (), max_ranks: int = STEP_RANKS,
               max_steps: int = STEP_POINTS) -> tuple[pl.DataFrame, int]:
    """Per rank and step: step_ms, outside_ms (the step less its NCCL kernel time), culprit.

    From `trace.step` events (`seq` is the step, figures in `detail`). At most `max_ranks` ranks
    (culprits first, then others evenly spread over the rank order) and `max_steps` steps per rank
    are kept; the second value is how many ranks had step times in all.
    """
    rows = events.filter((pl.col("kind") == "trace.step") & pl.col("rank").is_not_null() & pl.col("seq").is_not_null())
    detail = pl.col("detail").str.json_decode(_STEP_DETAIL)
    steps = (
        rows.select(
            "rank", pl.col("seq").alias("step"),
            (detail.struct.field("step_us") / 1000.0).alias("step_ms"),
            ((detail.struct.field("step_us") - detail.struct.field("nccl_us").fill_null(0.0)) / 1000.0).alias("outside_ms"),
        )
        .filter(pl.col("step_ms").is_not_null())
        # One trace per rank and step; a rank traced twice keeps its first reading of a step.
        .unique(["rank", "step"], keep="first")
        .with_columns(pl.col("rank").is_in(sorted(int(r) for r in culprit_ranks)).alias("culprit"))
    )
    ranks = steps.select("rank", "culprit").unique().sort(["culprit", "rank"], descending=[True, False])
    total = ranks.height
    others = ranks.filter(~pl.col("culprit"))
    room = max(max_ranks - (total - others.height), 0)
    stride = max(1, -(-others.height // room)) if room else others.height + 1
    kept = pl.concat([ranks.filter(pl.col("culprit")), others.gather_every(stride).head(room)]).select("rank")
    per_rank = runs(steps.join(kept, on="rank", how="semi").sort(["rank", "step"]), ["rank"])
    every = ((pl.col("_n") + max_steps - 1) // max_steps).clip(lower_bound=1)
    thinned = per_rank.filter((pl.col("_pos") % every == 0) | (pl.col("_pos") == pl.col("_n") - 1))
    return thinned.drop("_pos", "_n").select("rank", "step", "step_ms", "outside_ms", "culprit"), total
