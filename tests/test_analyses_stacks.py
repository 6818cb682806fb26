"""STAT-style stack clustering: the rank outside every collective while the others wait in one."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyzer.analyses import JobContext, load_all
from analyzer.analyses.stacks import stack_clustering, stack_clusters
from analyzer.io import discover
from analyzer.events import concat_events, events_from_records
from analyzer.findings import FINDING_SCHEMA
from analyzer.parse.pyspy import parse_pyspy_json, parse_pyspy_text

SHARED = Path(__file__).resolve().parents[2] / "shared"
PYSPY_DIR = SHARED / "formats-samples" / "py-spy"
RULE = "hang-rank-stuck-outside-collective"

WAITING = (
    "all_reduce (torch/distributed/distributed_c10d.py:2501) <- wrapper (torch/distributed/c10d_logger.py:83) "
    "<- backward (torch/autograd/__init__.py:251) <- train_step (train.py:88) <- main (train.py:120) <- <module> (train.py:130)"
)
SLEEPING = "load_shard (data.py:41) <- get_batch (data.py:60) <- train_step (train.py:80) <- main (train.py:120) <- <module> (train.py:130)"


def _thread(rank, detail, *, state="idle", name="MainThread", pid=None, tid=None, file=None, line=4):
    pid = pid if pid is not None else 1000 + (rank or 0)
    return {
        "kind": "stack.thread", "source": "pyspy", "rank": rank, "pid": pid, "tid": tid if tid is not None else pid,
        "code": state, "file": file or f"pyspy/rank{rank}.txt", "line": line,
        "message": f'thread "{name}" ({state}): {detail.split(" (")[0]}', "detail": detail,
    }


def _run(rows, **job) -> pl.DataFrame:
    findings = stack_clustering(events_from_records(rows), JobContext(**job))
    assert dict(findings.schema) == FINDING_SCHEMA
    return findings


def test_registered():
    assert load_all()["stack_clustering"] is stack_clustering


def test_real_samples_two_ranks():
    if not PYSPY_DIR.is_dir():
        pytest.skip("shared/formats-samples not available")
    frames = []
    for item in discover(PYSPY_DIR):
        if item.format == "pyspy_text":
            frames.append(parse_pyspy_text(item))
        elif item.format == "pyspy_json":
            frames.append(parse_pyspy_json(item))
    events = concat_events(frames)
    clusters = stack_clusters(events)
    assert clusters.height == 2
    assert sorted(clusters.get_column("ranks").to_list()) == [[0], [1]]
    findings = stack_clustering(events, JobContext(world_size=2))
    found = findings.row(0, named=True)
    assert found["rule_id"] == RULE and found["ranks"] == [1]
    assert found["summary"] == "rank 0: synchronize <- <module> (active); rank 1: <module> (idle)"
    assert 0.4 <= found["confidence"] <= 0.6  # one against one


def test_classic_culprit_among_64():
    rows = [_thread(r, WAITING) for r in range(64) if r != 1] + [_thread(1, SLEEPING)]
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [1] and found["confidence"] >= 0.75
    assert found["summary"] == "ranks 0,2-63: all_reduce <- backward (idle); rank 1: load_shard <- get_batch (idle)"
    assert found["evidence"]


def test_line_numbers_do_not_split_clusters_but_functions_do():
    rows = [_thread(r, WAITING.replace("train.py:88", f"train.py:{88 + r % 3}")) for r in range(8)]
    clusters = stack_clusters(events_from_records(rows))
    assert clusters.height == 1 and clusters.row(0, named=True)["ranks"] == list(range(8))


def test_everyone_in_a_collective_is_silent():
    rows = [_thread(r, WAITING) for r in range(8)]
    rows.append(_thread(8, WAITING.replace("all_reduce", "broadcast").replace("backward", "sync_params")))
    assert _run(rows).height == 0


def test_threading_wait_is_not_a_collective():
    dataloader = "wait (threading.py:324) <- get (queue.py:180) <- _get_data (torch/utils/data/dataloader.py:1100) <- main (train.py:120)"
    rows = [_thread(r, WAITING) for r in range(8) if r != 5] + [_thread(5, dataloader)]
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [5] and "wait <- get" in found["summary"]


def test_native_cuda_synchronize_counts_as_waiting():
    native = "0x7fb9f801488c (libcuda.so.580.159.04) <- cuCtxSynchronize_v2 (libcuda.so.580.159.04) <- global_mean (train.py:30) <- main (train.py:120)"
    rows = [_thread(r, native, state="active") for r in range(4)] + [_thread(4, SLEEPING)]
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [4]
    assert "ranks 0-3: global_mean <- main (active)" in found["summary"]


def test_main_thread_is_chosen_among_threads():
    rows = []
    for r in range(4):
        rows.append(_thread(r, "run (threading.py:1010) <- _bootstrap (threading.py:1030)", name="Thread-1 (_pin_memory_loop)", tid=5000 + r, line=4))
        rows.append(_thread(r, WAITING if r != 2 else SLEEPING, line=10))
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [2]


def test_majority_outside_collectives_is_not_this_rule():
    rows = [_thread(r, SLEEPING) for r in range(6)] + [_thread(6, WAITING)]
    assert _run(rows).height == 0


def test_no_collective_visible_gives_only_a_weak_guess():
    item_wait = "global_mean (train.py:30) <- main (train.py:120) <- <module> (train.py:130)"
    rows = [_thread(r, item_wait, state="active") for r in range(7)] + [_thread(7, SLEEPING)]
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [7] and found["confidence"] <= 0.35 and "--native" in found["summary"]
    assert _run([_thread(0, item_wait), _thread(1, SLEEPING)]).height == 0  # 1 vs 1: no majority to trust


def test_pid_only_dumps_are_reported_by_pid():
    rows = [_thread(None, WAITING, pid=2000 + i) for i in range(4)] + [_thread(None, SLEEPING, pid=2999)]
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [] and "pid 2999" in found["summary"] and "pids 2000,2001,2002,2003" in found["summary"]


def test_hosts_from_job_context():
    rows = [_thread(r, WAITING) for r in range(4)] + [_thread(4, SLEEPING)]
    found = _run(rows, rank_hosts={4: "node7"}).row(0, named=True)
    assert found["hosts"] == ["node7"]


def test_4096_ranks_two_odd_ones():
    rows = [_thread(r, WAITING if r not in (5, 4000) else SLEEPING) for r in range(4096)]
    rows += [_thread(r, "run (threading.py:1010)", name="pt_autograd_0", tid=90000 + r) for r in range(4096)]
    events = events_from_records(rows)
    found = stack_clustering(events, JobContext(world_size=4096)).row(0, named=True)
    assert found["ranks"] == [5, 4000]
    assert found["summary"].startswith("ranks 0-4,6-3999,4001-4095: all_reduce <- backward")


def test_install_paths_do_not_split_clusters():
    absolute = WAITING.replace("torch/distributed/", "/opt/venv-a/lib/python3.12/site-packages/torch/distributed/")
    other_host = WAITING.replace("torch/distributed/", "/usr/local/lib/python3.11/dist-packages/torch/distributed/")
    rows = [_thread(0, WAITING), _thread(1, absolute), _thread(2, other_host)]
    clusters = stack_clusters(events_from_records(rows))
    assert clusters.height == 1 and clusters.row(0, named=True)["in_collective"]


# --- stacks correlated with the progress matrix (Flight Recorder / watchdog) ------------------------

ITEM_WAIT = "global_mean (train.py:30) <- main (train.py:120) <- <module> (train.py:130)"


def _fr(rank, *, enq, done, waiting_op="nccl:all_reduce"):
    """A rank's Flight Recorder view: pg_status plus, when it has work pending, the entry it waits in."""
    rows = [{"kind": "fr.pg_status", "source": "flight_recorder", "rank": rank, "pg": "0", "last_enqueued": enq,
             "last_completed": done, "file": f"fr/nccl_trace_rank_{rank}", "line": 0, "message": "pg 0 status"}]
    rows.append({"kind": "fr.entry", "source": "flight_recorder", "rank": rank, "pg": "0", "seq": done, "op": "ALLREDUCE",
                 "code": "completed", "file": f"fr/nccl_trace_rank_{rank}", "line": 1, "message": f"pg 0 #{done} ALLREDUCE"})
    if enq > done:
        rows.append({"kind": "fr.entry", "source": "flight_recorder", "rank": rank, "pg": "0", "seq": done + 1, "op": "ALLREDUCE",
                     "code": "scheduled", "file": f"fr/nccl_trace_rank_{rank}", "line": 2, "message": f"pg 0 #{done + 1} ({waiting_op})"})
    return rows


def test_flight_recorder_places_an_item_wait_inside_the_collective():
    # py-spy sees rank 0 in user code (blocked in `.item()` after its all_reduce); its dump shows it
    # waiting in #20, while rank 1's dump has nothing pending and its stack is in data loading.
    rows = [_thread(0, ITEM_WAIT, state="active"), _thread(1, SLEEPING)] + _fr(0, enq=22, done=19) + _fr(1, enq=19, done=19)
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [1]
    assert found["summary"] == (
        "rank 0: global_mean <- main (active; waiting in ALLREDUCE #20 per Flight Recorder); "
        "rank 1: load_shard <- get_batch (idle; nothing pending per Flight Recorder/watchdog)"
    )
    assert found["confidence"] == 0.65  # one against one, confirmed by the dumps
    events = events_from_records(rows)
    cited = events.with_row_index("event_id").filter(pl.col("event_id").is_in(found["evidence"]))
    assert {"pyspy/rank1.txt", "fr/nccl_trace_rank_1", "fr/nccl_trace_rank_0"} <= set(cited.get_column("file").to_list())


def test_flight_recorder_clears_a_rank_that_only_looks_outside():
    # Uneven data: rank 1 is in barrier(), rank 0 in `.item()` after the gradient all_reduce it is
    # waiting in. Without the dumps rank 0 would be named; with them nobody is outside.
    rows = [_thread(0, ITEM_WAIT, state="active"), _thread(1, WAITING.replace("all_reduce", "barrier"))]
    assert _run(rows).row(0, named=True)["ranks"] == [0]
    assert _run(rows + _fr(0, enq=31, done=28) + _fr(1, enq=29, done=28)).height == 0


def test_one_stack_split_by_the_dumps():
    rows = [_thread(r, ITEM_WAIT, state="active") for r in range(8)]
    for r in range(8):
        rows += _fr(r, enq=40 if r != 7 else 38, done=38)
    found = _run(rows).row(0, named=True)
    assert found["ranks"] == [7] and found["confidence"] >= 0.8
    assert found["summary"].startswith("ranks 0-6: global_mean <- main (active; waiting in ALLREDUCE #39 per Flight Recorder); rank 7: global_mean")
