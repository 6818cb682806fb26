"""parse/textpool.py: a large text input's batches parsed in a worker give the sequential parse's events."""

from __future__ import annotations

import polars as pl

from analyzer.io.walk import discover
from analyzer.parse import BATCH_BYTES, parse_inputs, textpool

HEAD = "node1:10:20 [0] NCCL INFO "


def _job(tmp_path):
    for rank in range(4):
        lines = [f"[rank{rank}]: step {i} loss 1.{i} step_time 0.5s" for i in range(2000)]
        lines += [HEAD + f"Channel {c:02d}/0 : {rank}[{rank}] -> 1[1] via P2P/IPC" for c in range(32)]
        lines += [f"[rank{rank}]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] Watchdog caught collective operation timeout"]
        (tmp_path / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    return tmp_path


def _parsed(job, monkeypatch, pooled: bool):
    monkeypatch.setattr(textpool, "POOL_MIN_TEXT_BYTES", 0 if pooled else 1 << 60)
    items = discover(job)
    events = parse_inputs(items)
    return events, [(i.path, i.status, i.reason, i.lines, i.unparsed_lines) for i in items]


def test_worker_batches_give_the_sequential_events(tmp_path, monkeypatch):
    job = _job(tmp_path)
    monkeypatch.setattr("analyzer.parse.BATCH_BYTES", 64 << 10)  # many small batches: both sides parse some
    alone, alone_items = _parsed(job, monkeypatch, pooled=False)
    pooled, pooled_items = _parsed(job, monkeypatch, pooled=True)
    assert alone.height > 0 and BATCH_BYTES > 64 << 10
    assert pooled_items == alone_items
    assert pooled.equals(alone, null_equal=True)


def test_no_worker_for_small_inputs():
    assert not textpool.worker_wanted(1 << 20)
