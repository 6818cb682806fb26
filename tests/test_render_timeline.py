"""The timeline's data side: marker classes, lanes, clocks, collective progress, thinning, folding."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from analyzer.api import analyze
from analyzer.events import events_from_records
from analyzer.render.timeline import assign_lanes, behaviour_keys, build_timeline, rank_ranges, step_times, unit_table
from analyzer.render.timeline_marks import MAX_PER_CLASS, classify, collective_marks, evidence_frame, unit_markers

ROOT = Path(__file__).resolve().parents[1]
HANG = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
T0 = datetime(2026, 11, 30, 14, 0, 0, tzinfo=timezone.utc)


def events(rows: list[dict]) -> pl.DataFrame:
    """Canonical events numbered the way correlate numbers them."""
    defaults = {"file": "job.log", "source": "text", "severity": "info"}
    frame = events_from_records([{**defaults, "line": i + 1, **row} for i, row in enumerate(rows)])
    return frame.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


def hang_rows(world: int, culprit: int, seq: int = 35, odd: int | None = None) -> list[dict]:
    """Every rank inits; all but `culprit` time out in ALLREDUCE #seq; `odd` also warns."""
    rows = []
    for r in range(world):
        host = f"h{r // 8}"
        rows.append({"rank": r, "host": host, "kind": "nccl.comm_init", "file": f"{host}.log", "text": f"init {r}"})
        if r == odd:
            rows.append({"rank": r, "host": host, "kind": "nccl.warn", "severity": "warning", "file": f"{host}.log",
                         "text": "NCCL WARN odd"})
        if r == culprit:
            rows.append({"rank": r, "host": host, "kind": "watchdog.pg_status", "severity": "error", "pg": "0",
                         "last_enqueued": seq - 1, "last_completed": seq - 1, "file": f"{host}.log",
                         "ts": T0 + timedelta(seconds=47), "ts_source": "c10d-year-inferred", "text": f"dump {r}"})
            continue
        rows.append({"rank": r, "host": host, "kind": "watchdog.timeout", "severity": "error", "seq": seq,
                     "op": "ALLREDUCE", "file": f"{host}.log", "ts": T0 + timedelta(milliseconds=r),
                     "ts_source": "c10d-year-inferred", "text": f"[Rank {r}] Watchdog caught collective operation timeout"})
        rows.append({"rank": r, "host": host, "kind": "watchdog.pg_status", "severity": "error", "pg": "0", "seq": seq,
                     "last_enqueued": seq, "last_completed": seq - 1, "file": f"{host}.log",
                     "ts": T0 + timedelta(milliseconds=r), "ts_source": "c10d-year-inferred", "text": f"status {r}"})
    return rows


def test_kinds_become_marker_classes_and_context_lines_do_not():
    ev = events([
        {"rank": 0, "kind": "nccl.comm_init"},
        {"rank": 0, "kind": "train.step"},
        {"rank": 0, "kind": "nccl.warn", "severity": "warning"},
        {"rank": 0, "kind": "cuda.error", "severity": "error"},
        {"rank": 0, "kind": "watchdog.timeout", "severity": "error"},
        {"rank": 0, "kind": "traceback.exception", "severity": "error"},
        {"rank": 0, "kind": "log.last"},
        {"rank": 0, "kind": "watchdog.frame", "severity": "error"},  # context of the timeout line
        {"rank": 0, "kind": "nccl.transport"},  # info: not a marker
        {"rank": 0, "kind": "nccl.transport"},  # ... unless it is evidence
    ])
    marks = classify(ev, evidence_frame([], [9]))
    assert marks.get_column("cls").to_list() == ["init", "step", "warning", "error", "watchdog", "exception", "last", "evidence"]
    assert marks.filter(pl.col("event_id") == 9).get_column("evidence").item() == 1


def test_units_fall_back_from_rank_to_process_host_and_file():
    ev = events([
        {"rank": 3, "host": "a", "pid": 10, "kind": "nccl.warn", "severity": "warning"},
        {"host": "a", "pid": 11, "kind": "nccl.warn", "severity": "warning"},
        {"host": "b", "kind": "nccl.warn", "severity": "warning"},
        {"file": "console.log", "kind": "nccl.warn", "severity": "warning"},
    ])
    markers = unit_markers(ev)
    units = unit_table(ev, markers)
    assert units.get_column("unit_label").to_list() == ["rank 3 (a)", "a pid 11", "b (no rank)", "console.log (no rank or host)"]
    assert units.get_column("unit_type").to_list() == ["rank", "process", "host", "file"]


def test_timestamps_go_on_the_time_axis_and_the_rest_by_line_order():
    ev = events([
        {"rank": 0, "kind": "nccl.comm_init", "line": 5},
        {"rank": 0, "kind": "nccl.warn", "severity": "warning", "ts": T0, "ts_source": "nccl"},
        {"rank": 0, "kind": "log.last", "line": 90},
        {"rank": 0, "kind": "cuda.error", "severity": "error", "line": 40, "ts": T0 + timedelta(seconds=1),
         "ts_source": "c10d-year-inferred"},
    ])
    markers = unit_markers(ev).sort("event_id")
    assert markers.get_column("panel").to_list() == ["order", "time", "order", "time"]
    # line order within the lane: the init line (5) before the last line (90)
    assert markers.filter(pl.col("panel") == "order").get_column("x").to_list() == [1.0, 2.0]
    assert markers.filter(pl.col("panel") == "time").get_column("x").to_list() == [T0.timestamp() * 1000, T0.timestamp() * 1000 + 1000]
    assert markers.get_column("inferred").to_list() == [False, False, False, True]


def test_collective_progress_keeps_highest_completed_and_lowest_waiting():
    ev = events([
        {"rank": 0, "kind": "fr.entry", "pg": "0", "seq": s, "op": "ALLREDUCE", "code": state, "line": s}
        for s, state in [(1, "completed"), (2, "completed"), (3, "started"), (4, "scheduled")]
    ] + [
        {"rank": 1, "kind": "watchdog.timeout", "severity": "error", "seq": 3, "op": "ALLREDUCE"},  # no pg named
        {"rank": 1, "kind": "watchdog.pg_status", "severity": "error", "pg": "0", "last_enqueued": 3, "last_completed": 2},
    ])
    marks = collective_marks(ev)
    got = {(u, c): (x, op) for u, c, x, op in marks.select("unit", "cls", "x", "op").iter_rows()}
    assert got[("r:0", "coll.completed")] == (2, "ALLREDUCE")
    assert got[("r:0", "coll.waiting")] == (3, "ALLREDUCE")
    assert got[("r:0", "coll.enqueued")] == (4, "ALLREDUCE")
    assert got[("r:1", "coll.waiting")] == (3, "ALLREDUCE")
    # the watchdog line named no process group; the rank's only group is 0
    assert marks.filter(pl.col("unit") == "r:1").get_column("group").unique().to_list() == ["0"]


def test_markers_are_thinned_evenly_but_evidence_is_kept():
    rows = [{"rank": 0, "kind": "train.step", "line": i + 1} for i in range(5000)]
    ev = events(rows)
    markers = unit_markers(ev, evidence_frame([], [1234]))
    lines = ev.join(markers.select("event_id"), on="event_id").get_column("line").sort().to_list()
    assert MAX_PER_CLASS <= len(lines) <= MAX_PER_CLASS + 2
    assert lines[0] == 1 and lines[-1] == 5000 and 1235 in lines


def test_rank_ranges():
    frame = pl.DataFrame({"g": [1] * 6 + [2, 3], "r": [0, 2, 3, 4, 7, 7, None, 5]}, schema={"g": pl.Int64, "r": pl.Int64})
    out = frame.group_by("g").agg(rank_ranges(pl.col("r")).alias("t")).sort("g")
    assert out.get_column("t").to_list() == ["0,2-4,7", "", "5"]


def test_no_folding_below_the_threshold():
    ev = events(hang_rows(64, culprit=9))
    timeline = build_timeline(ev, culprit_ranks=[9])
    assert timeline.lanes.height == 64 and not timeline.lanes.get_column("folded").any()
    assert timeline.stats["fold_level"] == "none"
    culprit = timeline.lanes.filter(pl.col("culprit"))
    assert culprit.get_column("label").to_list() == ["rank 9 (h1)"]
    assert culprit.get_column("state").to_list() == ["last enqueued #34, last completed #34"]


def test_alike_ranks_fold_and_the_odd_ones_and_culprit_keep_lanes():
    world, culprit, odd = 1100, 777, 5
    ev = events(hang_rows(world, culprit, odd=odd))
    timeline = build_timeline(ev, culprit_ranks=[culprit], fold_threshold=1024)
    lanes = timeline.lanes
    assert timeline.stats["fold_level"] == "exact"
    assert lanes.height == 3
    fold = lanes.filter(pl.col("folded")).row(0, named=True)
    assert fold["label"] == "ranks 0-4,6-776,778-1099"
    assert fold["units"] == world - 2
    assert fold["state"] == "waiting in ALLREDUCE #35"
    assert len(fold["hosts"]) == (world + 7) // 8
    singles = lanes.filter(~pl.col("folded"))
    assert singles.get_column("label").to_list() == ["rank 5 (h0)", "rank 777 (h97)"]
    assert singles.get_column("culprit").to_list() == [False, True]
    # the fold's watchdog marker aggregates its members: count, spread, median
    timeout = timeline.markers.filter((pl.col("lane") == fold["lane"]) & (pl.col("cls") == "watchdog")).row(0, named=True)
    assert timeout["count"] == world - 2
    assert timeout["hi"] - timeout["lo"] == pytest.approx(world - 1)  # ms between rank 0's and rank 1099's
    # every folded rank keeps its own markers for "expand"
    members = timeline.members
    assert members.get_column("unit").n_unique() == world - 2
    assert set(members.get_column("lane").unique().to_list()) == {fold["lane"]}


def test_coarser_keys_when_exact_behaviour_leaves_too_many_lanes():
    # Every rank waits in a different collective: exact keys cannot fold; ignoring numbers can.
    rows = []
    for r in range(1030):
        rows.append({"rank": r, "kind": "watchdog.timeout", "severity": "error", "seq": r, "op": "ALLREDUCE"})
    ev = events(rows)
    markers = unit_markers(ev)
    assigned, level = assign_lanes(unit_table(ev, markers), behaviour_keys(markers), fold_threshold=1024, max_lanes=50)
    assert level == "coarse"
    assert assigned.get_column("lane").n_unique() == 1
    timeline = build_timeline(ev, fold_threshold=1024, max_lanes=50)
    assert timeline.lanes.get_column("state").to_list() == ["waiting in ALLREDUCE #0-1029"]


def test_hosts_are_the_culprit_when_no_rank_is_named():
    ev = events([
        {"host": "n48", "pid": 1, "kind": "nccl.warn", "severity": "warning"},
        {"host": "n48", "pid": 2, "kind": "nccl.warn", "severity": "warning"},
        {"host": "n51", "pid": 3, "kind": "nccl.warn", "severity": "warning"},
    ])
    timeline = build_timeline(ev, culprit_hosts=["n48"])
    assert timeline.lanes.select("label", "culprit").rows() == [("n48 pid 1", True), ("n48 pid 2", True), ("n51 pid 3", False)]


def test_empty_events_give_empty_frames():
    timeline = build_timeline(events([]))
    assert timeline.lanes.height == 0 and timeline.markers.height == 0 and timeline.members.height == 0


def test_recorded_hang_lanes_clock_and_collectives():
    analysis = analyze(HANG)
    verdict = analysis.report["verdict"]
    timeline = build_timeline(analysis.events, culprit_ranks=verdict["culprit_ranks"], culprit_hosts=verdict["culprit_hosts"])
    lanes = timeline.lanes
    assert lanes.select("label", "culprit").rows() == [("rank 0 (vm)", False), ("rank 1 (vm)", True)]
    assert lanes.get_column("state").to_list() == ["waiting in ALLREDUCE #2", "last enqueued #1, last completed #1"]
    # 25 events on 16 lines: 9 of the watchdog's lines are also vocabulary hits (pytorch_c10d.csv's
    # timeout, dump-signal and teardown rows), each an event of its own on the same line.
    assert timeline.clocks.rows() == [("c10d-year-inferred", 25, True)]
    seq = timeline.markers.filter(pl.col("panel") == "seq")
    waiting = seq.filter(pl.col("cls") == "coll.waiting")
    assert waiting.select("lane", "x", "op").rows() == [(0, 2.0, "ALLREDUCE")]
    kinds = set(timeline.markers.get_column("cls").to_list())
    assert {"init", "watchdog", "last", "coll.completed", "coll.enqueued", "coll.waiting"} <= kinds


def test_deterministic():
    analysis = analyze(HANG)
    one = build_timeline(analysis.events, culprit_ranks=[1])
    two = build_timeline(analysis.events.sample(fraction=1.0, shuffle=True, seed=3), culprit_ranks=[1])
    for name in ("lanes", "markers", "members", "units", "clocks"):
        assert getattr(one, name).equals(getattr(two, name)), name


def trace_steps(ranks: int, steps: int, slow: int, extra_rows: list[dict] | None = None) -> pl.DataFrame:
    """`trace.step` events of a synchronised job: every step lasts 60 ms on every rank; the slow rank
    computes 55 ms of it, the others 5 ms and wait the rest inside NCCL."""
    rows = []
    for r in range(ranks):
        for s in range(steps):
            nccl = 5_000.0 if r == slow else 55_000.0
            rows.append({"rank": r, "seq": 10 + s, "kind": "trace.step", "file": f"traces/rank{r}.json", "line": 0,
                         "detail": f'{{"step_us": 60000.0, "nccl_us": {nccl}, "compute_us": 1.0, "idle_us": 0.0}}'})
    return events([*(extra_rows or []), *rows])


def test_step_times_per_rank_and_step_with_the_time_outside_collectives():
    frame, total = step_times(trace_steps(4, 3, slow=2, extra_rows=[{"kind": "train.step", "text": "step 1 loss 2"}]), [2])
    assert total == 4 and frame.height == 12
    assert frame.filter(pl.col("culprit")).get_column("rank").unique().to_list() == [2]
    outside = frame.group_by("culprit").agg(pl.col("outside_ms").mean()).sort("culprit").get_column("outside_ms").to_list()
    assert outside == [5.0, 55.0]
    assert frame.get_column("step_ms").unique().to_list() == [60.0]
    assert frame.filter(pl.col("rank") == 0).get_column("step").to_list() == [10, 11, 12]


def test_step_times_keep_the_culprits_and_thin_the_rest():
    frame, total = step_times(trace_steps(100, 30, slow=77), [77], max_ranks=10, max_steps=8)
    ranks = frame.get_column("rank").unique().sort().to_list()
    assert total == 100 and len(ranks) == 10 and 77 in ranks and ranks[0] == 0
    per_rank = frame.group_by("rank").agg(pl.len(), pl.col("step").max()).get_column("len").unique().to_list()
    assert max(per_rank) <= 9 and frame.get_column("step").max() == 39  # evenly thinned, the last step kept


def test_no_step_times_without_trace_steps():
    frame, total = step_times(events(hang_rows(8, 3)), [3])
    assert frame.height == 0 and total == 0
