"""The ways a verdict's culprit (rank, host, GPU) is found, each on made-up lines between ordinary ones:
a rank label opening a line (analyzer/facts/rank_labels.py), the first failure by time rather than by
file, the host of a kernel Xid line, and the physical GPU of an Xid line's PCI bus id (analyzer/facts/gpus.py)."""

from pathlib import Path

import polars as pl
import pytest

from analyzer.api import analyze
from analyzer.facts.rank_labels import ranks_from_labels

CUDA_FAULT = "RuntimeError: CUDA error: an illegal memory access was encountered"
SMI_TABLE = [
    "+-----------------------------------------------------------------------------+",
    "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |",
    "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
    "|   0  NVIDIA A100-SXM...  On   | 00000000:07:00.0 Off |                    0 |",
    "|   1  NVIDIA A100-SXM...  On   | 00000000:3B:00.0 Off |                    0 |",
    "+-------------------------------+----------------------+----------------------+",
]
XID = "NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, An uncorrectable double bit error (DBE) has been detected on GPU"


def write(root: Path, name: str, lines: list[str]) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text("\n".join(lines) + "\n")


def verdict(root: Path) -> dict:
    return analyze(str(root)).report["verdict"]


@pytest.mark.parametrize("label", ["Rank 3: ", "RANK 3 | ", "rank=3 | ", "[Rank 3]: ", "[global rank 3] ", "global_rank=3: "])
def test_a_rank_label_opening_the_line_names_its_writer(tmp_path, label):
    write(tmp_path, "console.log", ["starting", "Rank 0: epoch 1", label + CUDA_FAULT, "shutting down"])
    assert verdict(tmp_path)["culprit_ranks"] == [3]


def _labelled(message: str, kind: str = "traceback.exception") -> dict:
    frame = pl.DataFrame({"message": [message], "kind": [kind], "rank": [None], "local_rank": [None]},
                         schema={"message": pl.String, "kind": pl.String, "rank": pl.Int64, "local_rank": pl.Int64})
    return ranks_from_labels(frame).row(0, named=True)


@pytest.mark.parametrize("message", [
    "Rank 3 timed out in monitoredBarrier",  # written by another rank about rank 3
    "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=4, OpType=ALLREDUCE)",
    "[Rank 3] step=10",  # c10d's bare form: a rank inside a process group
    "  rank      : 1 (local_rank: 1)",  # torchrun's failure table field
    "the rank 3: label is not at the start",
    "Rank 99999999999: overflows",
])
def test_text_that_only_mentions_a_rank_names_no_writer(message):
    assert _labelled(message)["rank"] is None


def test_a_c10d_line_keeps_its_group_rank_to_correlate():
    assert _labelled("[Rank 2]: Rank 1 failed to pass monitoredBarrier in 1000 ms", kind="c10d.monitored_barrier")["rank"] is None


def test_a_local_rank_label_fills_the_local_rank_only():
    row = _labelled("local_rank=3: " + CUDA_FAULT)
    assert (row["rank"], row["local_rank"]) == (None, 3)


def test_the_first_failure_is_the_earliest_in_time_not_the_first_file(tmp_path):
    write(tmp_path, "rank0.log", ["[2024-05-01 10:00:00,000] step 1",
                                  "[2024-05-01 10:00:09,000] RuntimeError: NCCL communicator was aborted on rank 0"])
    write(tmp_path, "rank1.log", ["[2024-05-01 10:00:00,000] step 1", f"[2024-05-01 10:00:05,000] {CUDA_FAULT}",
                                  "[2024-05-01 10:00:06,000] worker exiting"])
    assert verdict(tmp_path)["culprit_ranks"] == [1]


def test_a_kernel_xid_line_names_its_host_by_the_syslog_header_or_the_prompt_above(tmp_path):
    write(tmp_path / "a", "kern.log", ["Jun  3 09:59:58 gpu-node-9 kernel: usb 1-1: new device", f"Jun  3 10:00:00 gpu-node-9 kernel: {XID}"])
    write(tmp_path / "b", "dmesg.txt", ["root@gpu-node-4:~# dmesg -T | grep -i nvrm", "[Mon Jun  3 09:00:00 2024] usb 1-1: new device",
                                        f"[Mon Jun  3 10:00:00 2024] {XID}"])
    assert verdict(tmp_path / "a")["culprit_hosts"] == ["gpu-node-9"]
    assert verdict(tmp_path / "b")["culprit_hosts"] == ["gpu-node-4"]


def test_an_xid_bus_id_is_the_gpu_nvidia_smi_lists_at_that_bus_id(tmp_path):
    write(tmp_path, "node-a7/kern.log", [f"Jun  3 10:00:00 node-a7 kernel: {XID}"])
    write(tmp_path, "node-a7/nvidia-smi.txt", SMI_TABLE)
    gpus = verdict(tmp_path)["culprit_gpus"]
    assert [(g["host"], g["gpu"], g["bus_id"]) for g in gpus] == [("node-a7", "1", "0000:3b:00")]
    assert "nvidia-smi (node-a7/nvidia-smi.txt:5)" in gpus[0]["source"]


def test_an_xid_bus_id_is_the_gpu_of_the_rank_nccl_saw_there(tmp_path):
    write(tmp_path, "node-a7/dmesg.txt", [f"[Mon Jun  3 10:00:00 2024] {XID}"])
    write(tmp_path, "train.log", [
        "node-a7:1234:1300 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 1 busId 3b000 commId 0x5 - Init COMPLETE",
        "node-b2:1234:1300 [0] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId 7000 commId 0x5 - Init COMPLETE",
        "step 10 loss 0.5",
    ])
    gpus = verdict(tmp_path)["culprit_gpus"]
    assert [(g["host"], g["gpu"], g["rank"]) for g in gpus] == [("node-a7", "1", 0)]


def test_an_xid_bus_id_nothing_else_names_stays_the_bus_id(tmp_path):
    write(tmp_path, "kern.log", [f"Jun  3 10:00:00 node-a7 kernel: {XID}"])
    gpus = verdict(tmp_path)["culprit_gpus"]
    assert [(g["host"], g["gpu"]) for g in gpus] == [("node-a7", "0000:3b:00")]


def _mismatch(me: int, my_op: str, other: int, other_op: str) -> str:
    def fingerprint(op: str) -> str:
        shape = "[1]" if op == "BROADCAST" else "[25]"
        return f"CollectiveFingerPrint(SequenceNumber=21, OpType={op}, TensorShape={shape}, TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda))"
    return (f"[rank{me}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {me} is running collective: "
            f"{fingerprint(my_op)}, but Rank {other} is running collective: {fingerprint(other_op)}.")


def test_a_mismatch_culprit_is_the_odd_rank_not_the_ranks_that_reported_it(tmp_path):
    lines = [_mismatch(r, "ALLREDUCE", 5, "BROADCAST") for r in range(8) if r != 5] + [_mismatch(5, "BROADCAST", 0, "ALLREDUCE")]
    write(tmp_path, "console.log", ["[rank0]: epoch 3", *lines, "[rank0]: shutting down"])
    result = verdict(tmp_path)
    assert (result["category"], result["culprit_ranks"]) == ("collective_mismatch", [5])


def test_between_two_ranks_the_smaller_stray_collective_is_the_odd_one(tmp_path):
    # Two camps of one: the fingerprint analysis's tie rule (a barrier, else the smaller op) names rank 0's
    # one-element broadcast, not rank 1, which wrote the report.
    write(tmp_path, "console.log", ["[rank1]: epoch 3", _mismatch(1, "ALLREDUCE", 0, "BROADCAST"), "[rank1]: shutting down"])
    assert verdict(tmp_path)["culprit_ranks"] == [0]


def test_a_raised_remote_error_with_no_writer_names_the_peer_that_closed(tmp_path):
    # The raised error names no rank or host of its writer; its `Last error:` names the peer that went away.
    write(tmp_path, "console.log", [
        "epoch 3 step 100",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "Last error:",
        "socketProgress: Connection closed by remote peer node-b2.cluster.internal<59116>",
        "shutting down",
    ])
    assert verdict(tmp_path)["culprit_hosts"] == ["node-b2.cluster.internal"]


def test_a_remote_error_written_by_a_known_rank_keeps_its_writer(tmp_path):
    write(tmp_path, "console.log", [
        "[rank1]: epoch 3 step 100",
        "[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "[rank1]: Last error:",
        "[rank1]: socketProgress: Connection closed by remote peer node-b2<59116>",
        "[rank1]: shutting down",
    ])
    assert verdict(tmp_path)["culprit_ranks"] == [1]


def test_a_duplicate_gpu_report_names_the_machine_that_wrote_it(tmp_path):
    # No line says which host ranks 4 and 6 run on, but two ranks on one GPU share the writer's machine.
    write(tmp_path, "nccl.log", [
        "gpu-b7:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>",
        "gpu-b7:100:200 [0] init.cc:795 NCCL WARN Duplicate GPU detected : rank 6 and rank 4 both on CUDA device 31000",
        "gpu-b7:100:200 [0] NCCL INFO init.cc:1358 -> 5",
    ])
    found = verdict(tmp_path)
    assert found["culprit_ranks"] == [4, 6] and found["culprit_hosts"] == ["gpu-b7"]
