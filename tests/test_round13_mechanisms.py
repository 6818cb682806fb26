"""The general changes made for the misses of held-out round 13 (docs/heldout/round13-misses.md): each
tested on made-up lines between ordinary ones, never on a case's text."""

from pathlib import Path

import pytest

from analyzer.api import analyze


def job(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> dict:
    (tmp_path / name).write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


@pytest.mark.parametrize("line", [
    # libcudart's text behind a `CUDART` prefix, and a CUDACHECK macro's `Cuda error <file>:<line> '<text>'`
    "RuntimeError: CUDART error: peer access is not supported between these two devices",
    "Failed: Cuda error /opt/build/src/kernels/csrc/custom_reduce_kernels.cuh:118 'peer access is not supported between these two devices'",
])
def test_cuda_peer_access_unsupported_in_other_wrappers_is_p2p(tmp_path, line):
    report = job(tmp_path, [line, "worker exiting"])
    assert report["verdict"]["category"] == "p2p_nvlink_or_pcie_error"


def test_nccl_kernels_asking_more_shared_memory_than_the_device_is_a_failure(tmp_path):
    report = job(tmp_path, ["gpu7:100:100 [0] NCCL INFO cudaDriverVersion 12080",
                            "gpu7:100:100 [0] NCCL INFO ncclMaxSharedMem 99000 exceeds device/fn maxSharedMem 65536",
                            "gpu7:100:100 [0] NCCL INFO Using network Socket"])
    assert report["verdict"]["category"] == "other"
    assert "ncclMaxSharedMem" in report["verdict"]["evidence"][0]["text"]


def test_header_less_gdr_disabled_lines_are_read_and_name_degraded_transport(tmp_path):
    report = job(tmp_path, ["INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_4'",
                            "NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_5'"])
    assert report["verdict"]["category"] == "degraded_transport"
    assert "mlx5_4" in report["verdict"]["summary"]


def test_gdr_disabled_on_a_single_node_job_is_no_finding(tmp_path):
    report = job(tmp_path, ["n1:10:11 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'",
                            "n1:10:11 [0] NCCL INFO comm 0x55 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"])
    assert report["verdict"]["category"] == "none"


def test_a_link_with_gdr_on_its_send_side_only_names_the_receiving_side(tmp_path):
    report = job(tmp_path, ["12[3d000] -> 5[1c000] [send] via NET/IB/2/GDRDMA",
                            "12[3d000] -> 5[1c000] [receive] via NET/IB/0"])
    assert report["verdict"]["category"] == "degraded_transport"
    assert report["verdict"]["rule_id"] == "transport-gdr-one-side"
    assert report["verdict"]["culprit_ranks"] == [5]  # the receiving rank's node lacks GPUDirect RDMA


def test_gdr_on_the_receive_side_only_is_no_finding(tmp_path):
    # GDR read (send) is off by default on older GPUs far from the NIC while GDR write stays on: healthy
    report = job(tmp_path, ["12[3d000] -> 5[1c000] [send] via NET/IB/2",
                            "12[3d000] -> 5[1c000] [receive] via NET/IB/0/GDRDMA"])
    assert report["verdict"]["category"] == "none"


def test_an_interface_list_pasted_one_entry_a_line_is_read_as_the_list(tmp_path):
    report = job(tmp_path, ["INFO NET/Socket : Using", "[0]ens3:10.20.0.4<0>", "[1]docker0:172.17.0.1<0>",
                            "[2]veth9f3e1aa:fe80::a0c1:2ff:fe33:4455%veth9f3e1aa<0>"])
    assert report["verdict"]["category"] == "wrong_network_interface"


def test_interface_entries_without_their_list_head_are_no_finding(tmp_path):
    report = job(tmp_path, ["[0]ens3:10.20.0.4<0>", "[1]docker0:172.17.0.1<0>"])
    assert report["verdict"]["category"] == "none"


def test_a_global_rank_announced_twice_with_ranks_missing_names_the_missing_ranks(tmp_path):
    lines = [f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/4" for r in (0, 1, 0, 1)]
    report = job(tmp_path, lines + ["Traceback (most recent call last):", "KeyboardInterrupt"])
    assert report["verdict"]["category"] == "rank_absent_from_collective"
    assert report["verdict"]["culprit_ranks"] == [2, 3]


def test_every_global_rank_announced_once_is_no_finding(tmp_path):
    report = job(tmp_path, [f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/4" for r in (2, 0, 3, 1)])
    assert report["verdict"]["category"] == "none"


def test_one_node_of_a_larger_world_announcing_its_own_ranks_is_no_finding(tmp_path):
    report = job(tmp_path, [f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8" for r in (4, 5, 6, 7)])
    assert report["verdict"]["category"] == "none"
