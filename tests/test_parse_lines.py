"""The line layer on interleaved writers: where a line is cut into logical lines, and where it is not.

`split_interleaved` cuts a physical line where another process's record starts inside it. These
tests read its output directly (the `part` column, each part's text, payload and prefix columns);
tests/test_hostile_inputs.py checks the events a whole analysis makes of the same lines.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from analyzer.io import discover
from analyzer.parse.lines import lines_frame_many, peel_prefixes, split_interleaved
from analyzer.parse.logtext import iter_pieces
from tests import fuzz_strategies as fs
from tests.fuzz_strategies import FUZZ

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

HALF = "[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective "
STATUS = ("[E1130 14:57:47.100538635 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank 1] Received a "
          "dump signal due to a collective timeout from  rank 0. Last enqueued NCCL work: 1, last completed NCCL work: 1.")
WARN = ("kolyoz3:3071:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> "
        "with error 4, opcode 5327, len 5327, vendor err 81 (Send)")
INFO = "kolyoz2:25146:25146 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"


def layer(*lines: str) -> pl.DataFrame:
    """The line layer's output for one file holding `lines`."""
    return split_interleaved(peel_prefixes(lines_frame_many([("\n".join(lines) + "\n", "x.log", 1)])))


def parts(frame: pl.DataFrame, line: int = 1) -> list[tuple]:
    return frame.filter(pl.col("line") == line).select("part", "text", "pfx_rank", "pfx_local_rank").rows()


# --- cut -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "record", "rank", "local_rank"),
    [
        ("[rank0]:", "[rank1]:", STATUS, 1, None),
        ("[default0]:[rank0]:", "[default1]:[rank1]:", STATUS, 1, 1),
        ("[trainer0]:", "[trainer1]:", STATUS, None, 1),
        ("[trainer0|0]:", "[trainer1|0]:", STATUS, None, 1),
        ("0: [rank0]:", "1: [rank1]:", STATUS, 1, None),
        ("0: [rank0]:", "1: ", WARN, 1, None),
    ],
    ids=["torch", "torchrun-tee", "tee-role", "tee-role-replica", "srun-label-over-torch", "srun-label-over-nccl"],
)
def test_a_spliced_record_is_cut_at_its_outermost_wrapper(first, second, record, rank, local_rank):
    # In the srun cases the next line is labelled too: the file is a labelled one.
    frame = layer(first + HALF + second + record, "0: rest of rank 0's line" if first.startswith("0:") else "rest")
    own_local = 0 if first.startswith("[") and not first.startswith("[rank") else None
    own_rank = None if first.startswith("[trainer0") else 0
    assert parts(frame) == [(0, first + HALF, own_rank, own_local), (1, second + record, rank, local_rank)]
    assert frame.filter(pl.col("part") == 1).item(0, "body") == record


def test_an_nccl_header_is_cut_where_its_host_name_starts():
    frame = layer("[rank0]:" + HALF + WARN)
    assert parts(frame) == [(0, "[rank0]:" + HALF, 0, None), (1, WARN, None, None)]


def test_three_writers_make_three_parts_in_order():
    frame = layer("[rank0]:" + HALF + "[rank1]:" + HALF.replace("Rank 0", "Rank 1") + WARN)
    assert frame.select("line", "part", "pfx_rank").rows() == [(1, 0, 0), (1, 1, 1), (1, 2, None)]


def test_the_head_of_the_cut_word_stays_with_the_first_writer():
    """`NCCL I` + `kolyoz3:...`: the `I` is the first writer's INFO, not the start of a host `Ikolyoz3`."""
    frame = layer(INFO[:30] + WARN)
    assert frame.get_column("text").to_list() == [INFO[:30], WARN]


def test_a_host_the_file_names_settles_where_a_run_of_name_characters_splits():
    own = "kolyoz3:3071:3071 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"
    frame = layer(own, "[rank0]:" + HALF.rstrip() + "ti" + WARN)
    assert parts(frame, 2) == [(0, "[rank0]:" + HALF.rstrip() + "ti", 0, None), (1, WARN, None, None)]
    # Without it, the whole run is the name: nothing tells `collectivetikolyoz3` from `kolyoz3`.
    assert layer("[rank0]:" + HALF.rstrip() + "ti" + WARN).get_column("text").to_list()[1] == "collectiveti" + WARN


def test_another_thread_of_the_same_process_is_another_writer():
    other_thread = WARN.replace(":25854 ", ":25855 ")
    frame = layer(WARN + " " + other_thread)
    assert frame.get_column("text").to_list() == [WARN + " ", other_thread]


def test_a_spliced_nccl_timestamp_goes_with_its_header_and_the_collector_stamp_with_every_part():
    stamped = "[2025-03-12 10:11:12.123] " + WARN
    frame = layer("2025-03-12T10:11:12.000Z [rank0]:" + HALF + stamped)
    assert frame.select("part", "text", "pfx_rank", "collector_ts").rows() == [
        (0, "2025-03-12T10:11:12.000Z [rank0]:" + HALF, 0, "2025-03-12T10:11:12.000Z"),
        (1, stamped, None, "2025-03-12T10:11:12.000Z"),
    ]


def test_a_colour_coded_line_keeps_its_cleaned_parts():
    frame = layer("\x1b[31m[rank0]:" + HALF + "\x1b[0m[rank1]:" + STATUS)
    assert frame.select("part", "body", "pfx_rank").rows() == [(0, HALF, 0), (1, STATUS, 1)]


def test_parts_keep_the_physical_line_number_and_the_frame_order():
    frame = layer("a", "[rank0]:" + HALF + "[rank1]:" + STATUS, "b", "[rank2]:" + HALF + WARN, "c")
    assert frame.select("line", "part").rows() == [(1, 0), (2, 0), (2, 1), (3, 0), (4, 0), (4, 1), (5, 0)]


# --- not cut ---------------------------------------------------------------------------------------

NOT_SPLICES = [
    "[rank0]:" + HALF + "operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=20000)",
    "[default0]:[rank0]:" + STATUS,  # torchrun's tee over torch's prefix: one chain of wrappers
    "0: [rank0]:" + STATUS,
    "[E1130 14:57:41.704 ProcessGroupNCCL.cpp:689] [Rank 3] Watchdog caught collective operation timeout",  # c10d's own words
    "[PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at NCCL work: 5, last enqueued NCCL work: 5",
    "[2024-05-01 10:00:00,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001]",
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/work/rank0_utils.py", line 3, in <module>',
    '[rank1]:     assert same, "[rank1]: parameters differ"',  # a quoted prefix in a source line
    "[rank1]: KeyError: 'rank0'",
    "[rank1]: ValueError: expected [rank0] got [Rank 1]: shapes differ",
    "[rank1]: RuntimeError: [1]: params[0] in this process with sizes [10] appears not to match sizes in process 0.",
    "[rank1]: RuntimeError: '[rank3]:[E1130 14:57:41.7 ProcessGroupNCCL.cpp:1] quoted'",
    "OSError: [Errno 28] No space left on device",
    "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. [::1]:29500 2/4 clients joined.",
    "See `[rank0]:[E1130 16:56:11.830 ProcessGroupNCCL.cpp:750]` in the README",
    "[2025-03-12 10:11:12.123] " + WARN,  # NCCL's own timestamp opens its header
    "   " + WARN,
    INFO,  # `NCCL ` twice: `NCCL INFO NCCL version`
    WARN + " " + WARN,  # one thread's own header again: no second writer
    "node1:100:200 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.60<0> peers node2:4242:4243 [1] node3:11:12 [2] ready",
    "node1:100:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "node1:100:200 [0] NCCL INFO comm 0x55d8 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
    "node1:100:200 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ib0:1 [mlx5_0]",
    "node1:100:200 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<53641> failed",
    "[w.py rank0] done",
    "step 12: [rank]: loss 1.25",
]


@pytest.mark.parametrize("line", NOT_SPLICES, ids=range(len(NOT_SPLICES)))
def test_a_line_with_one_writer_is_not_cut(line):
    peeled = peel_prefixes(lines_frame_many([(line + "\n", "x.log", 1)]))
    split = split_interleaved(peeled)
    assert split.drop("part").equals(peeled) and split.get_column("part").to_list() == [0]


def test_an_unlabelled_file_keeps_a_number_before_a_spliced_record_as_text():
    frame = layer("listening on port 3: " + WARN, "plain text")
    assert frame.get_column("text").to_list() == ["listening on port 3: ", WARN, "plain text"]
    assert frame.get_column("pfx_rank").to_list() == [None, None, None]


def test_real_runs_have_no_line_cut():
    """The healthy and recorded runs (real processes, one file each) never interleave mid-line."""
    jobs = [*FIXTURES.glob("healthy/*/job"), *FIXTURES.glob("recorded/*/job")]
    assert len(jobs) >= 10
    cut = []
    for job in jobs:
        for item in discover(job):
            pieces = list(iter_pieces(item)) if item.format.startswith("text") else []
            if pieces:
                frame = split_interleaved(peel_prefixes(lines_frame_many([(p.text, item.path, p.first_line) for p in pieces])))
                cut += [(job.parent.name, item.path, line) for line in frame.filter(pl.col("part") > 0).get_column("line")]
    assert cut == []


# --- properties ------------------------------------------------------------------------------------


def spliced_document() -> st.SearchStrategy[str]:
    """A line cut anywhere with another writer's line inside it, among ordinary lines."""
    records = st.sampled_from(
        ["[rank1]:" + STATUS, "[default1]:[rank1]:" + STATUS, WARN, "[2025-03-12 10:11:12] " + WARN, "1: " + WARN, '"' + WARN]
    )
    hosts = st.sampled_from(["[rank0]:" + HALF, INFO, "[default0]:" + HALF, "0: [rank0]:" + HALF, WARN])
    return st.builds(
        lambda host, at, record, after: "\n".join([INFO, host[:at] + record, host[at:], *after]),
        hosts, st.integers(0, 80), records, st.lists(fs.log_line(), max_size=3),
    )


@FUZZ
@given(st.one_of(fs.log_document(), spliced_document()))
@example("[rank0]:" + HALF + "[rank1]:" + STATUS + "\n")
def test_cutting_loses_no_character_and_keeps_physical_lines(text):
    peeled = peel_prefixes(lines_frame_many([(text, "x.log", 1)]))
    split = split_interleaved(peeled)
    assert split.select("line").unique(maintain_order=True).equals(peeled.select("line"))
    numbered = split.with_columns(pl.int_range(pl.len()).over("line").cast(pl.UInt32).alias("expected"))
    assert (numbered.get_column("part") == numbered.get_column("expected")).all()  # 0, 1, ... in order
    # The first part's payload and every later part's text, joined, are the line's payload.
    joined = split.group_by("line", maintain_order=True).agg(
        (pl.col("body").first() + pl.col("text").slice(1).str.join("")).alias("joined")
    )
    assert joined.get_column("joined").to_list() == peeled.get_column("body").to_list()
    whole = split.filter(pl.col("part") == 0).drop("part", "text", "body")
    assert whole.equals(peeled.drop("text", "body"))  # the first part keeps the line's own prefixes


def test_an_open_mpi_process_tag_names_the_host_and_stays_in_the_body():
    lines = peel_prefixes(lines_frame_many([(
        "[gpu-node-3:40721] *** Process received signal ***\n[socket.cpp:464] [c10d] a source location\nplain line\n"
        "[worker-0:4682 :0:4682] Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))\n", "x.log", 1)]))
    assert lines.get_column("pfx_host").to_list() == ["gpu-node-3", None, None, "worker-0"]
    assert lines.get_column("body").to_list()[0] == "[gpu-node-3:40721] *** Process received signal ***"


def test_a_per_host_collector_stream_names_the_host_and_peels_it():
    lines = peel_prefixes(lines_frame_many([(
        "2025-08-12 09:37:02.216313 node-a7 >> :168:1228 [2] NCCL INFO Connected all trees\n"
        "2025-08-12 09:37:03 step 3 >> next\n"  # prose after a clock: no host
        "2025-08-12 09:37:04.1 loss >> 0.3\n", "x.log", 1)]))
    assert lines.select("pfx_host", "collector_ts", "body").rows() == [
        ("node-a7", "2025-08-12 09:37:02.216313", ":168:1228 [2] NCCL INFO Connected all trees"),
        (None, "2025-08-12 09:37:03", "step 3 >> next"),
        (None, "2025-08-12 09:37:04.1", "loss >> 0.3"),
    ]
