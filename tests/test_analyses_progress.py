"""The collective progress matrix: ranks absent from a stalled collective, mismatched collectives."""

from __future__ import annotations

import pickle
from pathlib import Path

import polars as pl
import pytest

from analyzer.analyses import JobContext, load_all
from analyzer.analyses.progress import (
    collective_observations,
    collective_progress,
    progress_matrix,
    progress_table,
)
from analyzer.io import discover
from analyzer.events import concat_events, events_from_records
from analyzer.findings import FINDING_SCHEMA
from analyzer.parse.flight_recorder import flight_recorder_events, parse_flight_recorder

SHARED = Path(__file__).resolve().parents[2] / "shared"
FR_DIR = SHARED / "formats-samples" / "flight-recorder"
needs_shared_dumps = pytest.mark.skipif(not FR_DIR.is_dir(), reason="../shared/formats-samples/flight-recorder is not beside this checkout")
ABSENT = "hang-rank-absent-from-collective"
MISMATCH = "hang-collective-mismatch"
T0 = 1_796_050_641_000_000_000


def _template() -> dict:
    # A real 2.10 dump recorded in this repository (so these tests also run where shared/ is absent).
    path = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "hang_uneven_data" / "job" / "fr" / "nccl_trace_rank_0"
    return pickle.loads(path.read_bytes())  # recorded by this project: trusted in tests


_TEMPLATE: dict | None = None


def make_dump(rank: int, entries: list[tuple], *, pgs: dict[str, list[int]], keep_last: int | None = None) -> dict:
    """A dump shaped like the real 2.10 sample. entries: (pg, seq, state, profiling_name, numel, t_ms)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = _template()
    base = next(e for e in _TEMPLATE["entries"] if e["profiling_name"] == "nccl:all_reduce" and e["frames"])
    out, status = [], {}
    for record_id, (pg, seq, state, name, numel, t_ms) in enumerate(entries):
        entry = dict(base)
        entry.update(
            record_id=record_id, pg_id=int(pg), process_group=(pg, "default_pg" if pg == "0" else "undefined"),
            collective_seq_id=seq, op_id=seq, profiling_name=name, state=state,
            input_sizes=[[numel]], output_sizes=[[numel]], time_created_ns=T0 + t_ms * 1_000_000,
            retired=state == "completed",
            time_discovered_completed_ns=None if state != "completed" else T0 + t_ms * 1_000_000 + 1000,
        )
        out.append(entry)
        st = status.setdefault(pg, {"last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1})
        st["last_enqueued_collective"] = max(st["last_enqueued_collective"], seq)
        if state == "completed":
            st["last_completed_collective"] = max(st["last_completed_collective"], seq)
    if keep_last is not None:
        out = out[-keep_last:]  # the ring buffer dropped the oldest entries; pg_status still knows
    return {
        "version": "2.10",
        "comm_lib_version": "2.28.9",
        "pg_config": {pg: {"name": pg, "desc": "default_pg" if pg == "0" else "undefined", "ranks": str(ranks)} for pg, ranks in pgs.items()},
        "pg_status": status,
        "entries": out,
    }


def events_of(dumps: dict[int, dict]) -> pl.DataFrame:
    return concat_events(flight_recorder_events(doc, file=f"nccl_trace_rank_{rank}", rank=rank)[0] for rank, doc in dumps.items())


def _run(events: pl.DataFrame, **job) -> pl.DataFrame:
    findings = progress_matrix(events, JobContext(**job))
    assert dict(findings.schema) == FINDING_SCHEMA
    return findings


def _one(findings: pl.DataFrame, rule: str) -> dict:
    rows = findings.filter(pl.col("rule_id") == rule).to_dicts()
    assert len(rows) == 1, findings.to_dicts()
    return rows[0]


def _hang(world: int, late: dict[int, int], *, target: int = 35, op: str = "nccl:all_reduce", numel: int = 1024, pg: str = "0"):
    """Every rank completes 1..target-1 and waits in `target`, except `late` ranks (rank -> last enqueued)."""
    dumps = {}
    for rank in range(world):
        last = late.get(rank, target)
        entries = [(pg, s, "completed", op, numel, s * 10) for s in range(1, min(last, target - 1) + 1)]
        if last >= target:
            entries.append((pg, target, "scheduled", op, numel, target * 10))
        dumps[rank] = make_dump(rank, entries, pgs={pg: list(range(world))})
    return dumps


# --- real samples ---------------------------------------------------------------------------------


@needs_shared_dumps
def test_real_timeout_dumps_name_rank_1():
    _template()
    events = concat_events(parse_flight_recorder(item)[0] for item in discover(FR_DIR / "timeout-dump_TORCH_NCCL_DUMP_ON_TIMEOUT"))
    found = _one(_run(events, world_size=2), ABSENT)
    assert found["ranks"] == [1]
    assert found["summary"] == "rank 0 waits in ALLREDUCE #2 (pg 0); rank 1 last enqueued #1"
    assert found["evidence"]


@needs_shared_dumps
def test_real_api_dump_of_a_healthy_run_is_silent():
    _template()
    events = concat_events(parse_flight_recorder(item)[0] for item in discover(FR_DIR / "api-dump") if item.format in ("pickle", "flight_recorder_json"))
    assert _run(events, world_size=2).height == 0


def test_real_watchdog_log_names_rank_1():
    logtext = pytest.importorskip("analyzer.parse.logtext")
    path = SHARED / "formats-samples" / "torch-c10d" / "torch-2.11_watchdog-timeout_fr-dump_torchrun-tee.log"
    if not path.exists():
        pytest.skip("sample not available")
    from analyzer.parse import parse_inputs

    del logtext
    events = parse_inputs(discover(path))
    found = _one(_run(events, world_size=2), ABSENT)
    assert found["ranks"] == [1]
    assert "rank 1 last enqueued #1" in found["summary"] and "#2" in found["summary"]
    assert found["confidence"] >= 0.8


def test_evidence_ids_do_not_depend_on_row_order():
    # One rank restates "last enqueued 19" in two watchdog lines and its dump; the dump's entry and a
    # watchdog line share seq 19. Row order (thread completion, file order) must not pick the evidence.
    status = pl.DataFrame(
        {"pg": ["0"] * 3, "rank": [1] * 3, "enq": [19] * 3, "done": [19] * 3, "at_seq": [None] * 3,
         "event_id": [161, 53, 102], "src": ["watchdog", "watchdog", "fr"]},
        schema_overrides={"at_seq": pl.Int64},
    )
    observations = pl.DataFrame(
        {"pg": ["0"] * 3, "rank": [1] * 3, "seq": [18, 19, 19], "op": ["ALLREDUCE"] * 3, "state": ["completed"] * 3,
         "start_ts": [None] * 3, "timeout_ms": [None] * 3, "event_id": [120, 140, 121], "src": ["fr", "watchdog", "fr"]},
        schema_overrides={"start_ts": pl.Datetime("us", "UTC"), "timeout_ms": pl.Int64},
    )
    picks = set()
    for seed in range(12):
        table = progress_table(observations.sample(fraction=1.0, shuffle=True, seed=seed), status.sample(fraction=1.0, shuffle=True, seed=seed))
        picks.add(table.select("st_eid", "last_eid").row(0))
    assert picks == {(53, 121)}  # the earliest watchdog line over the dump's status; the earliest entry at the top seq


def _timeouts(seqs: dict[int, int]) -> pl.DataFrame:
    rows = [
        {"kind": "watchdog.timeout", "rank": r, "pg": None, "seq": seq, "op": "ALLREDUCE", "numel_in": 8, "numel_out": 8,
         "timeout_ms": 600000, "file": f"r{r}.log", "line": 1}
        for r, seq in seqs.items()
    ]
    return events_from_records(rows)


def test_ranks_timed_out_far_apart_are_not_one_group():
    # Each rank's watchdog reports its oldest unfinished work: in one group no rank can wait more than
    # one collective beyond another's. 20518 against 369526 is two runs or two groups, not an absentee.
    assert _run(_timeouts({1: 369526, 4: 20518}), world_size=5).filter(pl.col("rule_id") == ABSENT).height == 0


def test_a_rank_one_collective_behind_in_its_own_timeout_is_absent():
    found = _one(_run(_timeouts({0: 8, 1: 8, 2: 7}), world_size=3), ABSENT)
    assert found["ranks"] == [2]


def test_registered():
    assert load_all()["progress_matrix"] is progress_matrix


# --- rank absent ----------------------------------------------------------------------------------


def test_one_rank_never_arrived_out_of_64():
    found = _one(_run(events_of(_hang(64, {1: 34})), world_size=64), ABSENT)
    assert found["ranks"] == [1]
    assert found["summary"] == "ranks 0,2-63 wait in ALLREDUCE #35 (pg 0); rank 1 last enqueued #34"
    assert found["confidence"] >= 0.7


def test_ring_buffers_cut_at_different_points():
    dumps = _hang(16, {5: 34})
    for rank, doc in dumps.items():
        doc["entries"] = doc["entries"][-(3 + rank % 7):]
    found = _one(_run(events_of(dumps)), ABSENT)
    assert found["ranks"] == [5]
    assert "rank 5 last enqueued #34" in found["summary"]


def test_culprit_dump_missing_is_a_suspect_by_absence():
    dumps = _hang(64, {})
    del dumps[9]
    found = _one(_run(events_of(dumps), world_size=64), ABSENT)
    assert found["ranks"] == [9]
    assert "no progress evidence from rank 9" in found["summary"]
    assert 0.3 <= found["confidence"] < 0.7  # lower than with evidence
    # Without world_size or pg_config nobody is known to be missing.
    for doc in dumps.values():
        doc["pg_config"] = {}
    assert _run(events_of(dumps)).height == 0


def test_evidence_beats_absence_and_both_are_reported():
    dumps = _hang(8, {3: 30})
    del dumps[6]
    found = _one(_run(events_of(dumps), world_size=8), ABSENT)
    assert found["ranks"] == [3]
    assert "rank 3 last enqueued #30" in found["summary"] and "no progress evidence from rank 6" in found["summary"]


def test_several_late_ranks_grouped_by_last_seq():
    found = _one(_run(events_of(_hang(32, {4: 34, 5: 34, 6: 34, 20: 31}))), ABSENT)
    assert found["ranks"] == [4, 5, 6, 20]
    assert "ranks 4-6 last enqueued #34" in found["summary"] and "rank 20 last enqueued #31" in found["summary"]


def test_everyone_arrived_is_not_a_missing_rank():
    assert _run(events_of(_hang(8, {}))).filter(pl.col("rule_id") == ABSENT).height == 0


def test_healthy_dumps_are_silent():
    dumps = {r: make_dump(r, [("0", s, "completed", "nccl:all_reduce", 1024, s) for s in range(1, 20)], pgs={"0": list(range(4))}) for r in range(4)}
    assert _run(events_of(dumps), world_size=4).height == 0


def test_first_stalled_group_is_reported_with_the_chain():
    # pg 1 = ranks 0-3 (tensor parallel) stalls at #7 because rank 2 never arrives; ranks 0-3 then
    # never reach pg 0's #20, where ranks 4-7 wait (later).
    pgs = {"0": list(range(8)), "1": [0, 1, 2, 3]}
    dumps = {}
    for rank in range(8):
        entries = [("0", s, "completed", "nccl:all_reduce", 64, s) for s in range(1, 20)]
        if rank < 4:
            entries += [("1", s, "completed", "nccl:_all_gather_base", 8, 100 + s) for s in range(1, 7 if rank != 2 else 7)]
            if rank != 2:
                entries.append(("1", 7, "scheduled", "nccl:_all_gather_base", 8, 200))
        else:
            entries.append(("0", 20, "scheduled", "nccl:all_reduce", 64, 900))
        dumps[rank] = make_dump(rank, entries, pgs=pgs)
    found = _one(_run(events_of(dumps), world_size=8), ABSENT)
    assert found["ranks"] == [2]
    assert found["summary"].startswith("ranks 0-1,3 wait in _ALLGATHER_BASE #7 (pg 1); rank 2 last enqueued #6")
    assert "then pg 0 at ALLREDUCE #20 (waiting for ranks 0-3)" in found["summary"]


def test_watchdog_log_events_alone():
    rows = [
        {"kind": "watchdog.timeout", "rank": r, "pg": None, "seq": 7, "op": "_ALLGATHER_BASE", "numel_in": 1024,
         "numel_out": 16384, "timeout_ms": 600000, "file": f"r{r}.log", "line": 10}
        for r in (0, 2, 3)
    ] + [
        {"kind": "watchdog.pg_status", "rank": r, "pg": "1", "seq": 7, "last_enqueued": 8, "last_completed": 6, "file": f"r{r}.log", "line": 11}
        for r in (0, 2, 3)
    ] + [
        {"kind": "watchdog.pg_status", "rank": 1, "pg": "1", "last_enqueued": 6, "last_completed": 6, "file": "r1.log", "line": 11},
    ]
    found = _one(_run(events_from_records(rows), world_size=4), ABSENT)
    assert found["ranks"] == [1]
    assert found["summary"] == "ranks 0,2-3 wait in _ALLGATHER_BASE #7 (pg 1); rank 1 last enqueued #6"
    assert found["confidence"] >= 0.8


def test_garbage_last_completed_of_pytorch_2_3_is_ignored():
    rows = [
        {"kind": "watchdog.pg_status", "rank": 7, "pg": "0", "seq": 1, "last_enqueued": 1, "last_completed": 3452013982},
        {"kind": "watchdog.timeout", "rank": 7, "seq": 1, "op": "ALLREDUCE", "numel_in": 1, "timeout_ms": 600000},
        {"kind": "watchdog.pg_status", "rank": 3, "pg": "0", "last_enqueued": 0, "last_completed": -1},
    ]
    found = _one(_run(events_from_records(rows)), ABSENT)
    assert found["ranks"] == [3] and "rank 7 waits in ALLREDUCE #1" in found["summary"]


def test_only_one_rank_logged_is_weak_absence():
    rows = [{"kind": "watchdog.timeout", "rank": 1, "pg": "0", "seq": 5, "op": "ALLREDUCE", "numel_in": 1, "timeout_ms": 600000}]
    found = _one(_run(events_from_records(rows), world_size=4), ABSENT)
    assert found["ranks"] == [0, 2, 3] and found["confidence"] <= 0.35


# --- collective mismatch --------------------------------------------------------------------------


def test_minority_op_at_same_seq():
    dumps = _hang(16, {})
    bad = dumps[7]["entries"][-1]
    bad["profiling_name"] = "nccl:broadcast"
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [7] and found["confidence"] >= 0.8
    assert "pg 0 #35" in found["summary"] and "BROADCAST" in found["summary"] and "ALLREDUCE" in found["summary"]
    assert _run(events_of(dumps)).filter(pl.col("rule_id") == ABSENT).height == 0


def test_uneven_data_barrier_against_gradient_allreduce():
    dumps = _hang(2, {}, numel=1049600)
    last = dumps[1]["entries"][-1]
    last.update(profiling_name="nccl:all_reduce_barrier", input_sizes=[[1]], output_sizes=[[1]])
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [1]
    assert "NumelIn 1049600 vs 1" in found["summary"] and "BARRIER" in found["summary"]
    assert "diverged" not in found["summary"]  # identical shapes before the mismatch
    assert 0.4 <= found["confidence"] <= 0.6


def test_tie_goes_to_the_rank_that_advanced_further():
    # Rank 1 skipped a 1-element all_reduce: at #10 rank 0 is in the small one, rank 1 already in
    # the next step's gradient all_reduce and enqueued more behind it.
    dumps = {
        0: make_dump(0, [("0", s, "completed", "nccl:all_reduce", 1, s) for s in range(1, 10)] + [("0", 10, "scheduled", "nccl:all_reduce", 1, 10)], pgs={"0": [0, 1]}),
        1: make_dump(1, [("0", s, "completed", "nccl:all_reduce", 1, s) for s in range(1, 10)]
                     + [("0", s, "scheduled", "nccl:all_reduce", 1049600, s) for s in range(10, 14)], pgs={"0": [0, 1]}),
    }
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [1]


def test_shift_after_a_skipped_collective_is_shown_where_it_began():
    # Rank 1 skipped the 1-element token-count all_reduce of a step: at #10 its 0-d loss all_reduce
    # paired with rank 0's token count (one element each, so NCCL did not notice); at #11 rank 0's
    # loss met rank 1's gradient bucket and both hung.
    history = [("0", s, "completed", "nccl:all_reduce", 1049600, s) for s in range(1, 10)]
    dumps = {
        0: make_dump(0, history + [("0", 10, "completed", "nccl:all_reduce", 1, 10), ("0", 11, "scheduled", "nccl:all_reduce", 1, 11)],
                     pgs={"0": [0, 1]}),
        1: make_dump(1, history + [("0", 10, "completed", "nccl:all_reduce", 1, 10)]
                     + [("0", s, "scheduled", "nccl:all_reduce", 1049600, s) for s in (11, 12)], pgs={"0": [0, 1]}),
    }
    dumps[0]["entries"][-1].update(input_sizes=[[]], output_sizes=[[]])  # the loss: a 0-d tensor
    dumps[1]["entries"][-3].update(input_sizes=[[]], output_sizes=[[]])
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [1]
    assert found["summary"].startswith("pg 0 #11: ")
    assert "already diverged at #10: rank 0 ALLREDUCE in=[[1]] vs rank 1 ALLREDUCE in=[[]]" in found["summary"]


def test_equal_camps_without_a_tie_breaker_implicate_both():
    dumps = _hang(2, {})
    dumps[1]["entries"][-1]["profiling_name"] = "nccl:broadcast"
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [0, 1] and found["confidence"] < 0.5
    assert "cannot tell" in found["summary"]


def test_dtype_mismatch():
    dumps = _hang(8, {})
    dumps[3]["entries"][-1].update(input_dtypes=["Half"], output_dtypes=["Half"])
    found = _one(_run(events_of(dumps)), MISMATCH)
    assert found["ranks"] == [3] and "Half" in found["summary"]


def test_uneven_all_to_all_sizes_are_not_a_mismatch():
    dumps = _hang(4, {}, op="nccl:all_to_all")
    for rank, doc in dumps.items():
        for entry in doc["entries"]:
            entry["input_sizes"] = [[100 + rank]]
    assert _run(events_of(dumps)).filter(pl.col("rule_id") == MISMATCH).height == 0


def test_watchdog_numel_against_fr_barrier():
    # Log-only evidence for rank 0 (old 2.x: no FR), FR for rank 1.
    rows = [{"kind": "watchdog.timeout", "rank": 0, "pg": "0", "seq": 9, "op": "ALLREDUCE", "numel_in": 1049600,
             "numel_out": 1049600, "timeout_ms": 1800000}]
    dump = make_dump(1, [("0", s, "completed", "nccl:all_reduce", 1049600, s) for s in range(1, 9)]
                     + [("0", 9, "scheduled", "nccl:all_reduce_barrier", 1, 9)], pgs={"0": [0, 1]})
    events = concat_events([events_from_records(rows), events_of({1: dump})])
    found = _one(_run(events), MISMATCH)
    assert found["ranks"] == [1]


def test_fingerprint_reports_name_the_odd_rank():
    def report(me, my_op, other, other_op):
        return (
            f"RuntimeError: Detected mismatch between collectives on ranks. Rank {me} is running collective: "
            f"CollectiveFingerPrint(SequenceNumber=21, OpType={my_op}, TensorShape=[1], TensorDtypes=Long, "
            f"TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda)), but Rank {other} is running collective: "
            f"CollectiveFingerPrint(SequenceNumber=21, OpType={other_op}, TensorShape=[1], TensorDtypes=Long, "
            f"TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda)).Collectives differ in the following aspects:   Op type: {my_op}vs {other_op}"
        )

    rows = [
        {"kind": "c10d.fingerprint_mismatch", "rank": r, "seq": 21, "op": "ALLREDUCE", "ranks_ref": [r, 5], "message": report(r, "ALLREDUCE", 5, "BROADCAST")}
        for r in range(8) if r != 5
    ] + [{"kind": "c10d.fingerprint_mismatch", "rank": 5, "seq": 21, "op": "BROADCAST", "ranks_ref": [5, 0], "message": report(5, "BROADCAST", 0, "ALLREDUCE")}]
    found = _one(_run(events_from_records(rows)), MISMATCH)
    assert found["ranks"] == [5] and found["confidence"] >= 0.8
    assert "ranks 0-4,6-7 run ALLREDUCE" in found["summary"] and "rank 5 runs BROADCAST" in found["summary"]


def test_fingerprint_with_one_side_only():
    rows = [{"kind": "c10d.fingerprint_mismatch", "rank": 1, "seq": 21, "op": "BROADCAST", "message":
             "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
             "CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, TensorDeviceTypes=TensorOptions(memory_format"}]
    found = _one(_run(events_from_records(rows)), MISMATCH)
    assert found["ranks"] == [1] and found["confidence"] < 0.5


# --- helpers and scale ----------------------------------------------------------------------------


def test_public_tables():
    events = events_of(_hang(4, {2: 34}))
    table = collective_progress(events).sort("rank")
    assert table.get_column("enq").to_list() == [35, 35, 34, 35]
    assert table.get_column("stuck").to_list() == [35, 35, None, 35]
    assert table.get_column("done").to_list() == [34, 34, 34, 34]
    observations = collective_observations(events)
    assert set(observations.get_column("family").unique().to_list()) == {"ALLREDUCE"}
    assert observations.get_column("dtype").unique().to_list() == ["Float"]


def test_4096_ranks_with_missing_dump_and_cut_ring_buffers():
    world = 4096
    pgs = {"0": list(range(world))}
    dumps = {}
    for rank in range(world):
        if rank == 4000:
            continue  # its dump is missing
        last = 33 if rank in (17, 2049) else 35
        n = 20 + rank % 10  # ring buffers cut at different points
        entries = [("0", s, "completed", "nccl:all_reduce", 4096, s) for s in range(max(1, last - n), min(last, 34) + 1)]
        if last == 35:
            entries.append(("0", 35, "scheduled", "nccl:all_reduce", 4096, 35))
        dumps[rank] = make_dump(rank, entries, pgs=pgs)
    events = events_of(dumps)
    findings = _run(events, world_size=world)
    found = _one(findings, ABSENT)
    assert found["ranks"] == [17, 2049]
    assert found["summary"].startswith("ranks 0-16,18-2048,2050-3999,4001-4095 wait in ALLREDUCE #35 (pg 0); ranks 17,2049 last enqueued #33")
    assert "no progress evidence from rank 4000" in found["summary"]
    assert findings.filter(pl.col("rule_id") == MISMATCH).height == 0
