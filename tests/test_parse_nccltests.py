"""nccl-tests / rccl-tests reader: every layout's header, device, row, summary and failure lines."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analyzer.io import discover
from analyzer.parse import parse_inputs
from analyzer.parse.nccltests import results_frame, runs_frame

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl-tests"


def _events(tmp_path: Path, text: str, name: str = "out.log") -> pl.DataFrame:
    (tmp_path / name).write_text(text)
    items = discover(tmp_path)
    events = parse_inputs(items)
    return events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


NEWEST = """# nccl-tests version 2.20.0 (b4d5bee) nccl-headers=23102 nccl-library=23102
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8192 maxBytes 8589934592 step: 2(factor) warmup iters: 10 iters: 100 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid 1666603 on spark-d708 device  0 [000f:01:00] NVIDIA GB10
#  Rank  1 Group  0 Pid 1669515 on spark-dbf4 device  0 [000f:01:00] NVIDIA GB10
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
        8192          2048     float     sum      -1    35.15    0.23    0.23       0    30.33    0.27    0.27       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.25
"""


def test_newest_layout_header_devices_row_and_summary(tmp_path):
    events = _events(tmp_path, NEWEST)
    assert discover(tmp_path)[0].format == "nccl_tests"
    run = runs_frame(events).row(0, named=True)
    assert (run["test"], run["nthread"], run["ngpus"], run["min_bytes"], run["max_bytes"], run["iters"], run["validation"]) == (
        "all_reduce", 1, 1, 8192, 8589934592, 100, 1)
    assert run["avg_busbw"] == 0.25 and run["out_of_bounds"] == 0
    assert run["hosts"] == ["spark-d708", "spark-dbf4"] and run["nranks"] == 2 and run["gpus"] == ["NVIDIA GB10"]
    row = results_frame(events).row(0, named=True)
    assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == (8192, 2048, "float", "sum", -1)
    assert (row["oop_time"], row["oop_algbw"], row["oop_busbw"], row["oop_wrong"]) == (35.15, 0.23, 0.23, 0)
    assert (row["ip_time"], row["ip_busbw"], row["ip_wrong"]) == (30.33, 0.27, 0)
    devices = events.filter(pl.col("kind") == "nccltests.device")
    assert devices.get_column("pid").to_list() == [1666603, 1669515] and devices.get_column("rank").to_list() == [0, 1]


def test_old_layouts_without_redop_root_and_with_the_error_column(tmp_path):
    old = (FIXTURES / "rtx2080ti-nvlink-old-layout" / "job" / "all_gather.log").read_text()
    rows = results_frame(_events(tmp_path, old))
    assert rows.height == 12
    first = rows.row(0, named=True)
    assert (first["size"], first["type"], first["redop"], first["root"], first["oop_busbw"], first["ip_busbw"]) == (
        65536, "float", None, None, 1.98, 2.37)
    assert first["oop_error"] == 0.0 and first["oop_wrong"] is None  # the float error column is not a count


def test_broadcast_root_without_redop_and_na_and_nccl_lines_still_read(tmp_path):
    text = (FIXTURES / "v100-pcie-broadcast-sockets" / "job" / "broadcast.log").read_text()
    events = _events(tmp_path, text)
    row = results_frame(events).row(0, named=True)
    assert (row["redop"], row["root"], row["oop_time"], row["oop_error"], row["oop_wrong"]) == (None, 0, 45.82, None, None)
    assert events.filter(pl.col("kind") == "nccl.warn").height == 2  # NCCL_DEBUG lines read by the text parser too
    assert runs_frame(events).row(0, named=True)["validation"] == 0


def test_2017_layout(tmp_path):
    text = """nThread 1 nGpus 8 minBytes 9 maxBytes 33554432 step: 1048576(bytes) warmup iters: 5 iters: 20 validation: 1
# Using devices
#   Rank  0 on clx-mld-45 device  0 [0x04] Tesla P100-PCIE-16GB
     1048585        262146   float     sum    0.452   2.32   4.06  1e+00    0.446   2.35   4.11  1e+00
 Out of bounds values : 248 FAILED
 Avg bus bandwidth    : 1.53
"""
    events = _events(tmp_path, text)
    run = runs_frame(events).row(0, named=True)
    assert run["ngpus"] == 8 and run["out_of_bounds"] == 248 and run["hosts"] == ["clx-mld-45"]
    assert events.filter(pl.col("kind") == "nccltests.out_of_bounds").height == 1
    assert results_frame(events).row(0, named=True)["oop_busbw"] == 4.06


def test_per_iteration_columns_and_nonzero_wrong(tmp_path):
    header = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
              "     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n")
    row = "     1048576        262144     float     sum      -1    40.10   26.15   45.76       3    39.00    41.00    41.00     1.20    40.00   26.21   45.87       0    39.10    40.90    40.90     1.10\n"
    events = _events(tmp_path, "# nThread 1 nGpus 8 minBytes 1 maxBytes 2 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n" + header + row)
    r = results_frame(events).row(0, named=True)
    assert (r["oop_busbw"], r["oop_wrong"], r["ip_time"], r["ip_busbw"], r["ip_wrong"]) == (45.76, 3, 40.00, 45.87, 0)
    assert events.filter(pl.col("kind") == "nccltests.result").get_column("severity").to_list() == ["error"]


def test_mpirun_tags_between_partial_prints(tmp_path):
    text = (FIXTURES / "h100-three-node-busbw-collapse" / "job" / "all_reduce_3nodes.log").read_text()
    rows = results_frame(_events(tmp_path, text))
    assert rows.height == 10
    assert rows.filter(pl.col("size") == 67108864).row(0, named=True)["oop_busbw"] == 5.27


def test_failure_lines_become_error_events_of_the_catalogue(tmp_path):
    text = (FIXTURES / "hca-nodes-test-nccl-failure" / "job" / "all_reduce.log").read_text()
    text += "gpu7: Test CUDA failure common.cu:891 'out of memory'\nNCCL failure all_reduce.cu:61 'unhandled system error'\n"
    events = _events(tmp_path, text)
    raised = events.filter(pl.col("kind") == "nccl.error_raised")
    assert raised.height == 5 and set(raised.get_column("host").drop_nulls()) == {"HCA-107", "HCA-108", "HCA-128"}
    assert raised.filter(pl.col("host") == "HCA-128").get_column("pid").to_list() == [757466]  # from its trace line
    assert raised.get_column("message")[0] == "Test NCCL failure common.cu:1204: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
    cuda = events.filter(pl.col("kind") == "cuda.error")
    assert cuda.get_column("host").to_list() == ["gpu7"] and "out of memory" in cuda.get_column("message")[0]


def test_several_runs_in_one_file_are_several_runs(tmp_path):
    one = (FIXTURES / "gb10-spark-two-node-small-sizes" / "job" / "all_reduce.log").read_text()
    events = _events(tmp_path, one + one.replace("all_reduce_perf", "all_gather_perf"))
    runs = runs_frame(events)
    assert runs.get_column("test").to_list() == ["all_reduce", "all_gather"]
    assert results_frame(events).group_by("run").len().get_column("len").to_list() == [4, 4]


@pytest.mark.parametrize("line", [
    "    33554432       8388608     float    none      -1    19.56  1715.44    0.00      0     0.78  43046.10    0.00    N/A",
])
def test_in_place_na_wrong_is_no_count(tmp_path, line):
    events = _events(tmp_path, "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" + line + "\n")
    r = results_frame(events).row(0, named=True)
    assert (r["oop_wrong"], r["ip_wrong"], r["ip_algbw"]) == (0, None, 43046.10)


def test_not_nccl_tests_output_is_plain_text(tmp_path):
    (tmp_path / "train.log").write_text("epoch 1 loss 0.5\nsize 12 count 3\n")
    assert discover(tmp_path)[0].format == "text"


def test_every_line_of_a_table_is_counted_as_read(tmp_path):
    _events(tmp_path, NEWEST)
    item = discover(tmp_path)[0]
    parse_inputs([item])
    assert item.status == "parsed" and item.unparsed_lines == 0


def test_result_detail_is_json(tmp_path):
    events = _events(tmp_path, NEWEST)
    detail = json.loads(events.filter(pl.col("kind") == "nccltests.result").get_column("detail")[0])
    assert detail["oop_busbw"] == 0.23


def test_hostile_values_are_no_figures_and_never_lose_the_file(tmp_path):
    text = NEWEST + "\n".join([
        "  99999999999999999999999 1 float sum -1 1 2 3 4 5 6 7 8",
        "    33554432       8388608     float    none      -1    19.56  1715.44    inf      0     0.78  43046.10    nan    N/A",
        "#  Rank  9 Group  0 Pid 99999999999999999999 on  h device  0 [0x01] X",
        "h: Test NCCL failure a.cu:1 ''",
        " .. h pid 99999999999999999999: Test failure a:1",
    ]) + "\n"
    events = _events(tmp_path, text)
    rows = results_frame(events)
    assert rows.get_column("size").to_list() == [8192]  # the overflowing size and the inf/nan busbw row are no result
    item = discover(tmp_path)[0]
    parse_inputs([item])
    assert item.status == "parsed"
