"""Hang heuristics: who the ranks that timed out were waiting for, from log lines alone.

Each case is a console written in NCCL/c10d's own wording of one era and run through the whole
pipeline (parse, correlate, detect, decide), so the rank attribution of the c10d lines is part of
what is tested: pre-2.0 `[E ProcessGroupNCCL.cpp:821] [Rank 1] Watchdog caught ...` without
NumelIn, 2.x `[rank1]:[E...] [Rank 1] Watchdog caught ... NumelIn=1, NumelOut=1 ...`, and the
process-group prefixes `[PG 0 Rank 1]` / `[PG ID 0 PG GUID 0(default_pg) Rank 1]`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analyzer.analyses import JobContext
from analyzer.analyses.hang import busy_rank, hang_heuristics, silent_suspect, world_ranks
from analyzer.api import analyze
from analyzer.events import events_from_records

ABSENT = "hang-rank-absent-from-collective"
DIVERGED = "hang-data-collective-diverged"
BARRIER = "hang-barrier-rank-elsewhere"
HEURISTIC = "named first by a heuristic"


def _pre20(rank: int, seq: int, op: str = "ALLREDUCE") -> str:
    return (f"[E ProcessGroupNCCL.cpp:821] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)=1800000) ran for 1803400 milliseconds before timing out.")


def _v2(rank: int, seq: int, numel: int = 1, prefix: bool = True, pg: str = "") -> str:
    head = f"[rank{rank}]:" if prefix else ""
    pg = pg or f"[Rank {rank}]"
    return (f"{head}[E1130 16:49:00.385759124 ProcessGroupNCCL.cpp:689] {pg} Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=1800000) "
            "ran for 1800008 milliseconds before timing out.")


_ABORT = ("[E ProcessGroupNCCL.cpp:456] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
          "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")


def _run(tmp_path: Path, *lines: str):
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    analysis = analyze(tmp_path)
    return analysis.report["verdict"], {r["rule_id"]: r for r in analysis.findings.iter_rows(named=True)}, analysis


# --- pre-2.0 consoles: no rank prefix, no NumelIn ------------------------------------------------


def test_pre20_silent_rank_is_named_not_a_divergence(tmp_path):
    """Ranks 1-3 time out in an ALLREDUCE of unknown size; rank 0 never does: it is the one missing."""
    verdict, found, analysis = _run(tmp_path, "Evaluating the results...", _pre20(3, 4178), _pre20(1, 4178), _pre20(2, 4178), _ABORT)
    timeouts = analysis.events.filter(pl.col("kind") == "watchdog.timeout")
    assert sorted(timeouts.get_column("rank").to_list()) == [1, 2, 3]  # `[Rank N]` of the default group
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [0]
    assert "only one of ranks 0-3" in verdict["summary"] and "may have more" in verdict["summary"]
    assert 0.3 <= verdict["confidence"] <= 0.5  # moderate: the range 0-3 is inferred
    assert DIVERGED not in found


def test_pre20_every_rank_timed_out_leaves_nobody_silent(tmp_path):
    verdict, found, _ = _run(tmp_path, *(_pre20(r, 4178) for r in (2, 0, 3, 1)), _ABORT)
    assert verdict["culprit_ranks"] == []
    assert ABSENT not in found
    # The timeout lines' own readings (the watchdog signature and the vocabulary's) list the ranks that timed
    # out; no other finding names a rank.
    assert all(not f["ranks"] for f in found.values() if f["rule_id"] not in ("watchdog-timeout", "vocabulary-nccl-timeout"))
    assert found[DIVERGED]["summary"].startswith("ranks 0-3 timed out mid-run in ALLREDUCE #4178")


def test_pre20_data_collective_without_a_silent_rank_is_still_a_divergence(tmp_path):
    _, found, _ = _run(tmp_path, _pre20(0, 2059, op="ALLGATHER"))
    assert found[DIVERGED]["summary"].startswith("rank 0 timed out mid-run in ALLGATHER #2059")


# --- 2.x: a barrier (1-element ALLREDUCE) and the rank-0 heuristic --------------------------------


def test_one_visible_barrier_timeout_names_rank_0_by_a_weak_heuristic(tmp_path):
    verdict, found, _ = _run(tmp_path, _v2(2, 3, prefix=False).replace("[E1130", "RuntimeError: [E1130"), _ABORT)
    assert verdict["category"] == "rank_absent_from_collective"
    assert verdict["culprit_ranks"] == [0]
    assert HEURISTIC in verdict["summary"] and "rank 1 left no line either" in verdict["summary"]
    assert verdict["confidence"] <= 0.3
    assert found[BARRIER]["ranks"] == [0] and found[BARRIER]["confidence"] < 0.45


def test_the_heuristic_needs_a_barrier(tmp_path):
    """A gradient-sized all-reduce is not where rank 0's main-process work shows: all silent ranks are named."""
    verdict, _, _ = _run(tmp_path, _v2(2, 30, numel=1049600))
    assert verdict["culprit_ranks"] == [0, 1]
    assert HEURISTIC not in verdict["summary"]


def test_a_silent_rank_seen_busy_beats_the_heuristic(tmp_path):
    verdict, _, _ = _run(
        tmp_path,
        "[rank1]:Evaluating:  40%|████      | 4/10 [00:10<00:15,  2.50s/it]",
        _v2(2, 3),
    )
    assert verdict["culprit_ranks"] == [1]
    assert "rank 1 was still busy: Evaluating" in verdict["summary"] and HEURISTIC not in verdict["summary"]
    assert verdict["confidence"] >= 0.6


def test_a_crashed_rank_beats_the_heuristic(tmp_path):
    """Direct evidence: rank 3 raised while ranks 1-2 waited in the barrier; rank 0 left nothing."""
    verdict, _, _ = _run(
        tmp_path,
        *(f"[default3]:[rank3]:{line}" for line in (
            " Traceback (most recent call last):",
            '   File "/work/train.py", line 18, in main',
            '     raise ValueError("corrupt record in shard 3")',
            " ValueError: corrupt record in shard 3",
        )),
        _v2(1, 3),
        _v2(2, 3),
    )
    assert verdict["category"] == "rank_crash_exception_then_hang"
    assert verdict["culprit_ranks"] == [3]


def test_a_stated_world_names_every_silent_rank(tmp_path):
    """NCCL's `nranks 4` states the size: silence is firm evidence, no heuristic narrows it."""
    init = [f"node1:100{r}:100{r} [{r}] NCCL INFO comm 0x5555 rank {r} nranks 4 cudaDev {r} busId {r}0000 - Init COMPLETE"
            for r in range(4)]
    verdict, _, _ = _run(tmp_path, *init, _v2(1, 3))
    assert verdict["culprit_ranks"] == [0, 2, 3]
    assert "inferred" not in verdict["summary"] and HEURISTIC not in verdict["summary"]


def test_a_glued_progress_bar_is_the_bar_printers_not_the_glued_lines_rank(tmp_path):
    """tqdm left no newline; rank 1's watchdog line follows rank 0's bar on the same line."""
    bar = "Creating dataset split:  96%|█████████▋| 1927287/2000000 [29:56<01:08, 1060.83it/s]"
    verdict, found, _ = _run(tmp_path, bar + _pre20(1, 3).replace("Timeout(ms)", "NumelIn=1, NumelOut=1, Timeout(ms)"))
    assert verdict["culprit_ranks"] == [0]
    assert f"rank 0 was still busy: {bar}" in verdict["summary"]
    assert found["hang-busy-rank-while-others-wait"]["ranks"] == [0]


# --- a divergence needs a rank whose position differs from the waiting ranks' ---------------------


def _nranks(n: int) -> list[str]:
    return [f"node1:100{r}:100{r} [{r}] NCCL INFO comm 0x5555 rank {r} nranks {n} cudaDev {r} busId {r}0000 - Init COMPLETE"
            for r in range(n)]


def test_every_rank_of_a_stated_job_waiting_in_one_collective_is_no_divergence(tmp_path):
    """Both ranks of a 2-rank job wait in the same ALLREDUCE #30 of the same size: no rank is elsewhere."""
    _, found, _ = _run(tmp_path, *_nranks(2), _v2(0, 30, numel=4096), _v2(1, 30, numel=4096))
    assert DIVERGED not in found


def test_two_ranks_in_one_collective_of_different_sizes_diverged(tmp_path):
    """Same job, same ALLREDUCE #30, but rank 1 passes another size: its position differs."""
    _, found, _ = _run(tmp_path, *_nranks(2), _v2(0, 30, numel=4096), _v2(1, 30, numel=1049600))
    assert found[DIVERGED]["summary"].startswith("ranks 0-1 timed out mid-run in ALLREDUCE #30")


def test_a_stated_rank_with_no_timeout_line_is_elsewhere(tmp_path):
    _, found, _ = _run(tmp_path, *_nranks(2), _v2(0, 30, numel=4096))
    assert DIVERGED in found


# --- process groups: only the default group's rank is a global rank ------------------------------


def test_default_pg_prefixes_of_every_era_give_the_global_rank(tmp_path):
    lines = [
        _v2(1, 3, prefix=False, pg="[PG 0 Rank 1]"),
        _v2(2, 3, prefix=False, pg="[PG ID 0 PG GUID 0(default_pg) Rank 2]"),
        _v2(3, 3, prefix=False, pg="[PG 0 (default_pg) Rank 3]"),
    ]
    verdict, _, analysis = _run(tmp_path, *lines)
    assert sorted(analysis.events.filter(pl.col("kind") == "watchdog.timeout").get_column("rank").to_list()) == [1, 2, 3]
    assert verdict["culprit_ranks"] == [0]


def test_a_sub_group_rank_is_not_a_global_rank(tmp_path):
    """`[PG 3 Rank 1]` is rank 1 of process group 3, whichever global rank that is: no rank is inferred
    from it, and the bare `[Rank N]` lines of the same job may belong to that group too."""
    lines = [
        _v2(1, 3, prefix=False, pg="[PG ID 3 PG GUID 3 Rank 1]"),
        _v2(2, 3, prefix=False, pg="[PG 3 Rank 2]"),
        _pre20(1, 3),
    ]
    verdict, found, analysis = _run(tmp_path, *lines)
    assert analysis.events.filter(pl.col("kind") == "watchdog.timeout").get_column("rank").null_count() == 3
    assert verdict["culprit_ranks"] == []
    assert all(not f["ranks"] for f in found.values())


# --- the helpers, on events ----------------------------------------------------------------------


def _events(rows):
    frame = events_from_records([{"file": "console.log", "line": i + 1, "source": "c10d", **r} for i, r in enumerate(rows)])
    return frame.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


def test_world_is_inferred_only_when_nothing_states_it():
    rows = [{"kind": "watchdog.timeout", "rank": 2, "seq": 3, "op": "ALLREDUCE"}]
    assert world_ranks(_events(rows), JobContext(world_size=3)) == ([0, 1, 2], True)
    assert world_ranks(_events(rows), JobContext(world_size=8)) == (list(range(8)), False)
    stated = rows + [{"kind": "nccl.comm_init", "rank": 0, "pg_rank": 0, "nranks": 3}]
    assert world_ranks(_events(stated), JobContext(world_size=3)) == ([0, 1, 2], False)


def test_silent_suspect_rules():
    busy = (1, 42, "Evaluating 40%")
    assert silent_suspect([0, 1], {2}, busy, maybe_barrier=True, inferred=True).rank == 1
    assert silent_suspect([0, 1], {2}, busy, maybe_barrier=True, inferred=True).direct
    heuristic = silent_suspect([0, 1], {2}, None, maybe_barrier=True, inferred=True)
    assert heuristic.rank == 0 and not heuristic.direct and HEURISTIC in heuristic.note
    assert silent_suspect([0, 1], {2}, None, maybe_barrier=False, inferred=True) is None  # not a barrier
    assert silent_suspect([0, 1], {2}, None, maybe_barrier=True, inferred=False) is None  # size stated
    assert silent_suspect([1, 3], {2}, None, maybe_barrier=True, inferred=True) is None  # rank 0 is not silent
    assert silent_suspect([], {0, 1, 2}, busy, maybe_barrier=True, inferred=True) is None  # everyone waited


def test_busy_rank_ignores_waiting_ranks_and_log_tails():
    rows = [
        {"kind": "progress", "rank": 2, "message": (bar := "Epoch 3: 50%|#####     | 5/10 [00:01<00:01]"), "text": bar},
        {"kind": "log.last", "rank": 1, "message": "evaluating on rank 1", "text": "evaluating on rank 1"},
    ]
    assert busy_rank(_events(rows), {2}) is None
    assert busy_rank(_events(rows), set())[0] == 2


def test_heuristics_without_correlate_do_not_invent_ranks_from_pg_ranks():
    """A timeout whose only rank is a process-group rank (pg_rank) is not counted as a global rank."""
    rows = [{"kind": "watchdog.timeout", "pg": "3", "pg_rank": 1, "seq": 3, "op": "ALLREDUCE", "numel_in": 1,
             "message": "[PG 3 Rank 1] Watchdog caught"}]
    found = hang_heuristics(_events(rows), JobContext())
    assert found.height == 1 and found.get_column("ranks").to_list() == [[]]


# --- watchdog lines without SeqNum (torch < 1.10) and Horovod's stall check -----------------------


def _noseq(rank: int, op: str = "BROADCAST") -> str:
    return (f"[E ProcessGroupNCCL.cpp:566] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(OpType={op}, Timeout(ms)=60000) ran for 66853 milliseconds before timing out.")


def test_seqless_timeouts_name_the_lone_silent_rank_not_a_divergence(tmp_path):
    verdict, found, _ = _run(tmp_path, _noseq(1), _noseq(2), _noseq(3), _ABORT)
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [0]
    assert DIVERGED not in found and found[ABSENT]["confidence"] <= 0.5


def test_seqless_timeouts_in_different_ops_name_nobody(tmp_path):
    _, found, _ = _run(tmp_path, _noseq(1), _noseq(2, op="ALLGATHER"), _noseq(3), _ABORT)
    assert ABSENT not in found


def test_horovod_ready_ranks_name_the_complement(tmp_path):
    line = "Stalled ops: HorovodBroadcast_w_0 [ready ranks: 5, 6, 3, 1, 4, 0], HorovodBroadcast_b_0 [ready ranks: 5, 6, 3, 1, 4, 0]"
    verdict, found, _ = _run(tmp_path, line)
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [2]
    assert found["horovod-stalled-rank-missing"]["confidence"] == 0.6


def test_horovod_missing_ranks_are_named_directly(tmp_path):
    lines = [f"[1,0]<stderr>:[2019-04-13 13:53:31.851506: W horovod/common/operations.cc:588] HorovodBroadcast_{n}_0 [missing ranks: 1]" for n in ("a", "b")]
    verdict, found, _ = _run(tmp_path, *lines)
    assert verdict["culprit_ranks"] == [1] and found["horovod-stalled-rank-missing"]["confidence"] == 0.8
