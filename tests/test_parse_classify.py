"""parse.classify: a line's kind, hit and header fields; each distinct message classified once, each line keeping its writer."""

from __future__ import annotations

import polars as pl

from analyzer.parse.classify import _classify_bodies, classify

BODIES = [
    "node-1:123:456 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",
    "node-2:9:10 [1] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC",  # same message, another writer
    "gpu-a.example.com:77:78 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129",
    "gpu-b:1:2 [7] misc/ibvwrap.cc:183 NCCL WARN Call to ibv_reg_dmabuf_mr failed with error Cannot allocate memory",
    "[2024-05-01 10:00:00] host9:5:6 [2] NCCL INFO Init COMPLETE",
    "[rank0]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation timeout",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "step 10 loss 2.31",
    "",
]


def test_classifying_each_distinct_message_once_gives_what_classifying_every_line_gives():
    lines = pl.DataFrame({"body": BODIES})
    assert classify(lines).equals(_classify_bodies(lines))


def test_every_line_keeps_its_own_writer():
    frame = classify(pl.DataFrame({"body": BODIES[:3]}))
    assert frame.select("nccl_host", "nccl_pid", "nccl_tid", "nccl_dev").rows() == [
        ("node-1", "123", "456", "3"), ("node-2", "9", "10", "1"), ("gpu-a.example.com", "77", "78", "0")]
    assert frame.get_column("kind").to_list()[:2] == ["nccl.transport"] * 2


def test_a_frame_without_nccl_lines_and_an_empty_frame():
    assert classify(pl.DataFrame({"body": BODIES[5:]})).equals(_classify_bodies(pl.DataFrame({"body": BODIES[5:]})))
    empty = pl.DataFrame({"body": []}, schema={"body": pl.String})
    assert classify(empty).columns == _classify_bodies(empty).columns
