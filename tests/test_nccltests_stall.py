"""A collective test on one machine that printed its column header and nothing after it (analysis
"nccltests_stalled_on_one_host"), and NCCL 1's test-program layout that nccl-tests' parser now reads
(`Rank N uses device D`, `bytes N type op ... res`): tables written between ordinary lines, each with
a counterpart that must stay silent. Made-up tables in the programs' printf formats."""

from pathlib import Path

from analyzer.api import analyze

BEFORE = ["$ ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 4", "on gpu-ws-2, after the driver update"]
AFTER = ["^C"]

NCCL1_DEVICES = ["# Using devices", *[f"#   Rank  {r} uses device  {r} [0x{r + 4:02x}] Tesla P40" for r in range(4)], ""]
NCCL1_COLUMNS = [
    "#                                                 out-of-place                    in-place",
    "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res",
]
NCCL1_ROW = "    33554432       8388608   float     sum   12.345   2.72   4.08    0e+00   12.301   2.73   4.09    0e+00"

HEADER = "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0"
COLUMNS = [
    "#                                                              out-of-place                       in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
]


def _devices(hosts: list[str]) -> list[str]:
    return ["# Using devices", *[f"#  Rank  {r} Group  0 Pid  {4100 + r} on {h} device  {r % 2} [0x{r + 1:02x}] NVIDIA RTX A6000"
                                 for r, h in enumerate(hosts)]]


def report(tmp_path: Path, lines: list[str], after: list[str] = AFTER) -> dict:
    (tmp_path / "all_reduce.log").write_text("\n".join([*BEFORE, *lines, *after]) + "\n")
    return analyze(str(tmp_path)).report


def rules_of(rep: dict) -> set[str]:
    return {f["rule_id"] for f in rep["findings"]}


def test_nccl1_test_stalled_after_its_column_header(tmp_path):
    rep = report(tmp_path, [*NCCL1_DEVICES, *NCCL1_COLUMNS])
    assert rep["verdict"]["rule_id"] == "nccltests-stalled-on-one-host"
    assert rep["verdict"]["category"] == "p2p_nvlink_or_pcie_error"
    assert "4 ranks in one process (Tesla P40)" in rep["verdict"]["summary"]


def test_nccl1_test_with_a_result_row_is_read_and_clean(tmp_path):
    rep = report(tmp_path, [*NCCL1_DEVICES, *NCCL1_COLUMNS, NCCL1_ROW, "", " Out of bounds values : 0 OK",
                            " Avg bus bandwidth    : 4.085 "])
    assert rep["verdict"]["category"] == "none"
    assert rep["inputs"][0]["format"] == "nccl_tests"


def test_nccl_tests_on_one_host_stalled_after_its_column_header(tmp_path):
    rep = report(tmp_path, [HEADER, *_devices(["gpu-ws-2", "gpu-ws-2"]), "#", *COLUMNS])
    assert rep["verdict"]["rule_id"] == "nccltests-stalled-on-one-host"
    assert rep["verdict"]["culprit_hosts"] == ["gpu-ws-2"]


def test_nccl_tests_across_hosts_is_not_judged(tmp_path):
    rep = report(tmp_path, [HEADER, *_devices(["gpu-a", "gpu-b"]), "#", *COLUMNS])
    assert "nccltests-stalled-on-one-host" not in rules_of(rep)


def test_a_stall_before_the_column_header_is_not_this(tmp_path):
    rep = report(tmp_path, [HEADER, *_devices(["gpu-ws-2", "gpu-ws-2"])])
    assert "nccltests-stalled-on-one-host" not in rules_of(rep)


def test_a_failure_line_after_the_header_is_the_failure(tmp_path):
    rep = report(tmp_path, [HEADER, *_devices(["gpu-ws-2", "gpu-ws-2"]), "#", *COLUMNS,
                            "gpu-ws-2: Test NCCL failure common.cu:1279 'unhandled cuda error'"])
    assert "nccltests-stalled-on-one-host" not in rules_of(rep)
    assert rep["verdict"]["category"] != "none"
