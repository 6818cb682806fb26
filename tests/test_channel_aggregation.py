"""Parse (text logs): NCCL's per-channel connection lines become one event per writer, communicator
and connection, so the event count per rank grows with communicators, not with channels (issue 19).

Not timed: two synthetic jobs that differ only in how many `Channel NN/NN : a[b] -> c[d] via ...`
lines each rank prints must give the same events per rank and the same verdict.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyzer.api import analyze

RANKS = 4
COMMUNICATORS = ("0xa1", "0xb2")  # two communicators: each rank's connection events are per communicator


def _via(src: int, dst: int) -> str:
    return "P2P/IPC" if src // 2 == dst // 2 else "NET/IB/0/GDRDMA"  # two ranks a node


def _rank_log(rank: int, channels: int) -> str:
    """One rank's NCCL INFO set-up of two communicators (a ring to its neighbours, P2P inside a node and
    NET between nodes, `channels` channels each), a few steps, then rank 2 times out in the watchdog."""
    head = f"node{rank // 2}:{100 + rank}:{200 + rank} [{rank % 2}] NCCL INFO"
    nxt, prv = (rank + 1) % RANKS, (rank - 1) % RANKS
    lines = [f"step {s} loss 2.{s}" for s in range(3)]
    for comm in COMMUNICATORS:
        lines.append(f"{head} comm {comm}{rank} rank {rank} nranks {RANKS} cudaDev {rank % 2} nvmlDev {rank % 2} "
                     f"busId {rank % 2}0 commId 0x{comm[2:]}ff - Init START")
        lines.append(f"{head} comm {comm}{rank} rank {rank} nRanks {RANKS} nNodes 2 localRanks 2 localRank {rank % 2} MNNVL 0")
        for channel in range(channels):
            lines.append(f"{head} Channel {channel:02d}/0 : {rank}[{rank % 2}0] -> {nxt}[{nxt % 2}0] via {_via(rank, nxt)}")
            lines.append(f"{head} Channel {channel:02d}/0 : {prv}[{prv % 2}0] -> {rank}[{rank % 2}0] [receive] via {_via(prv, rank)}")
        lines.append(f"{head} comm {comm}{rank} rank {rank} nranks {RANKS} cudaDev {rank % 2} nvmlDev {rank % 2} "
                     f"busId {rank % 2}0 commId 0x{comm[2:]}ff - Init COMPLETE")
    lines += [f"step {s} loss 1.{s}" for s in range(3, 6)]
    if rank == 2:
        lines.append(f"[rank{rank}]:[E1202 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
                     "collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                     "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.")
    return "\n".join(lines) + "\n"


def _job(path, channels: int):
    path.mkdir()
    for rank in range(RANKS):
        (path / f"rank-{rank}.log").write_text(_rank_log(rank, channels))
    return analyze(path)


@pytest.fixture(scope="module")
def few_and_many(tmp_path_factory):
    root = tmp_path_factory.mktemp("channels")
    return _job(root / "two", 2), _job(root / "many", 32)


def _per_rank(events: pl.DataFrame) -> dict[int, int]:
    counts = events.filter(pl.col("rank").is_not_null()).group_by("rank").len()
    return dict(counts.sort("rank").iter_rows())


def test_event_count_per_rank_does_not_grow_with_channel_lines(few_and_many):
    few, many = few_and_many
    assert sum(i.lines for i in many.inputs) - sum(i.lines for i in few.inputs) == RANKS * len(COMMUNICATORS) * 30 * 2
    assert _per_rank(few.events) == _per_rank(many.events)
    assert set(_per_rank(many.events)) == set(range(RANKS))


def test_one_connection_event_per_communicator_and_direction_counts_its_channels(few_and_many):
    _, many = few_and_many
    connections = many.events.filter(pl.col("kind") == "nccl.transport")
    # Per rank: two communicators x (send to the next rank, receive from the previous one).
    assert connections.group_by("rank").len().get_column("len").to_list() == [len(COMMUNICATORS) * 2] * RANKS
    assert connections.get_column("repeat").to_list() == [32] * connections.height


def test_the_verdict_does_not_depend_on_the_channel_count(few_and_many):
    few, many = few_and_many
    keys = ("category", "rule_id", "culprit_ranks", "culprit_hosts")
    assert [few.report["verdict"][k] for k in keys] == [many.report["verdict"][k] for k in keys]
    assert few.report["verdict"]["rule_id"] is not None
