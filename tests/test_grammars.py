"""Golden tests for every Lark grammar and start symbol, plus the guard that each start is exercised."""

import pytest
from lark import Lark

from analyzer.parse.grammars import GRAMMAR_STARTS, grammar, parse_body

GOLDEN = [
    ("c10d", "work", "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)",
     {"seq": 5, "op": "ALLREDUCE", "numel_in": 1, "numel_out": 1, "timeout_ms": 600000}),
    ("c10d", "work", "WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000)",
     {"seq": 96120, "op": "ALLREDUCE", "timeout_ms": 1800000}),
    ("c10d", "work", "WorkNCCL(..., OpType=_ALLGATHER_BASE, NumelIn=8388608, NumelOut=67108864, Timeout(ms)=1800000)",
     {"op": "_ALLGATHER_BASE", "numel_in": 8388608, "numel_out": 67108864, "timeout_ms": 1800000}),
    ("c10d", "pg_status", "failure detected by watchdog at work sequence id: 2 PG status: last enqueued work: 2, last completed work: 1",
     {"seq": 2, "last_enqueued": 2, "last_completed": 1}),
    ("c10d", "pg_status", "Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed NCCL work: -1.",
     {"seq": 1, "last_enqueued": 1, "last_completed": -1}),
    ("c10d", "pg_status", "Exception (either an error or timeout) detected by watchdog at work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.",
     {"seq": 6463, "last_enqueued": 6463, "last_completed": 6462}),
    ("c10d", "pg_status", "Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. Last enqueued NCCL work: 1, last completed NCCL work: 1.This is most likely",
     {"dump_from": 0, "last_enqueued": 1, "last_completed": 1}),
    ("nccl", "ib_completion", "NET/IB : Got completion from peer 10.0.35.1<49189> with error 4, opcode 5327, len 5327, vendor err 81 (Send)",
     {"status": 4, "peer": "10.0.35.1<49189>"}),
    ("nccl", "ib_completion", "NET/IB: Got completion from peer 10.1.1.1<5000> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=0",
     {"status": 12, "status_name": "IBV_WC_RETRY_EXC_ERR", "peer": "10.1.1.1<5000>"}),
    ("nccl", "ib_async", "NET/IB : mlx5_0:1 Got async event : port error", {"event": "port error", "device": "mlx5_0:1"}),
    ("nccl", "connect_failed", "socketStartConnect: Connect to 10.0.0.2<45763> failed : Software caused connection abort",
     {"peer": "10.0.0.2<45763>", "reason": "Software caused connection abort"}),
    ("nccl", "peer_closed", "socketProgress: Connection closed by remote peer node1<57557>", {"peer": "node1<57557>"}),
    ("nccl", "duplicate_gpu", "Duplicate GPU detected : rank 7 and rank 0 both on CUDA device f000",
     {"ranks": [7, 0], "bus_id": "f000"}),
    ("nccl", "cuda_failure", "Cuda failure 'out of memory'", {"cuda_error": "out of memory"}),
    ("torchrun", "entry", "time      : 2026-11-30_14:58:48\nhost      : localhost\nrank      : 0 (local_rank: 0)\nexitcode  : -6 (pid: 2179)\nerror_file: <N/A>\ntraceback : Signal 6 (SIGABRT) received by PID 2179",
     {"time": "2026-11-30_14:58:48", "host": "localhost", "rank": 0, "local_rank": 0, "exitcode": -6, "pid": 2179,
      "error_file": "<N/A>", "traceback": "Signal 6 (SIGABRT) received by PID 2179"}),
]


@pytest.mark.parametrize("grammar_name,start,body,expected", GOLDEN, ids=[f"{g}-{s}-{i}" for i, (g, s, _, _) in enumerate(GOLDEN)])
def test_golden(grammar_name, start, body, expected):
    assert parse_body(grammar_name, start, body) == expected


def test_every_start_symbol_has_a_golden_case():
    covered = {(g, s) for g, s, _, _ in GOLDEN}
    for name, starts in GRAMMAR_STARTS.items():
        for start in starts:
            assert (name, start) in covered, f"{name}.{start} has no golden test"


@pytest.mark.parametrize("name", sorted(GRAMMAR_STARTS))
def test_grammar_is_lalr_and_built_once(name):
    assert isinstance(grammar(name), Lark)
    assert grammar(name) is grammar(name)
    assert grammar(name).options.parser == "lalr"


def test_non_matching_body_returns_none():
    assert parse_body("c10d", "work", "WorkNCCL(garbage") is None


def test_a_number_too_long_for_int_is_no_number():
    """A corrupted line's 5,000-digit sequence number must not raise (int() refuses > 4,300 digits)."""
    fields = parse_body("c10d", "work", "WorkNCCL(SeqNum=" + "9" * 5000 + ", OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)")
    assert fields == {"seq": None, "op": "ALLREDUCE", "numel_in": 1, "numel_out": 1, "timeout_ms": 600000}
