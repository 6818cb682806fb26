"""The general changes made for the misses of held-out round 16 (docs/heldout/round16-misses.md): each
tested on made-up lines between ordinary ones, with a silent counterpart, never on a case's text.
The new vocabulary rows (pytorch_core.csv, open_mpi.csv's btl/tcp connect rows, nvidia_container.csv's
driver timeout) are tested by tests/test_vocabulary.py on their test lines mid-file."""

from pathlib import Path

from analyzer.api import analyze

ORDINARY_BEFORE = ["starting the training loop", "step 10 loss 0.51"]
ORDINARY_AFTER = ["step 11 loss 0.50"]


def job(tmp_path: Path, lines: list[str], name: str = "rank0.log", before=ORDINARY_BEFORE, after=ORDINARY_AFTER) -> dict:
    (tmp_path / name).write_text("\n".join([*before, *lines, *after]) + "\n")
    return analyze(str(tmp_path)).report


# --- an nccl-tests device table listing one rank on several hosts -----------------------------------

HEADER = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
          "#", "# Using devices"]
TABLE_END = ["#", "#                                                       out-of-place                       in-place"]


def test_the_same_rank_on_two_hosts_is_independent_tests(tmp_path):
    lines = [*HEADER, *HEADER,
             "#  Rank  0 Group  0 Pid  40112 on gpu-b-07 device  0 [0x07] NVIDIA A100-SXM4-80GB",
             "#  Rank  0 Group  0 Pid  51877 on gpu-b-09 device  0 [0x07] NVIDIA A100-SXM4-80GB"]
    verdict = job(tmp_path, lines, "all_reduce_perf.log", before=[], after=TABLE_END)["verdict"]
    assert verdict["rule_id"] == "nccltests-rank-on-several-hosts"
    assert verdict["category"] == "other"
    assert "rank 0 on 2 hosts" in verdict["summary"]


def test_one_test_across_two_hosts_is_not(tmp_path):
    lines = [*HEADER,
             "#  Rank  0 Group  0 Pid  40112 on gpu-b-07 device  0 [0x07] NVIDIA A100-SXM4-80GB",
             "#  Rank  1 Group  0 Pid  51877 on gpu-b-09 device  0 [0x07] NVIDIA A100-SXM4-80GB"]
    report = job(tmp_path, lines, "all_reduce_perf.log", before=[], after=TABLE_END)
    assert all(f["rule_id"] != "nccltests-rank-on-several-hosts" for f in report["findings"])


# --- NCCL 2.2-2.3's one-interface-a-line list naming loopback, with a refused connect ------------------

def _socket_job(interface: str) -> list[str]:
    return [
        "node-a:4289:4343 [0] NCCL INFO comm 0x7fc8e824c640 rank 0 nranks 4",
        f"node-b:4152:4206 [0] NCCL INFO NET : Using interface {interface}",
        "node-b:4152:4206 [0] NCCL INFO NET : Using interface eth0:10.151.40.240<0>",
        "node-b:4152:4206 [0] NCCL INFO NET/Socket : 2 interfaces found",
        "node-b:4153:4209 [1] include/socket.h:361 NCCL WARN Call to connect timeout : Connection refused",
        "node-b:4153:4209 [1] NCCL INFO bootstrap.cu:19 -> 2",
    ]


def test_a_loopback_interface_in_the_old_list_is_the_cause_of_the_refused_connect(tmp_path):
    verdict = job(tmp_path, _socket_job("lo:127.0.0.1<0>"))["verdict"]
    assert verdict["category"] == "wrong_network_interface"
    assert verdict["rule_id"] == "nccl-virtual-interface-selected"
    assert "node-b" in verdict["culprit_hosts"]


def test_a_routable_interface_leaves_the_connect_failure(tmp_path):
    verdict = job(tmp_path, _socket_job("eth1:10.152.0.7<0>"))["verdict"]
    assert verdict["category"] == "network_unreachable_or_firewall"


# --- a store get of the NCCL unique id that timed out ---------------------------------------------------

def _unique_id(error: str) -> list[str]:
    return ["Traceback (most recent call last):",
            '  File "/opt/app/train.py", line 40, in <module>',
            "    dist.barrier()",
            f"RuntimeError: [5] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store "
            f"by key '0', but store->get('0') got error: {error}"]


def test_a_unique_id_get_timeout_is_a_timeout(tmp_path):
    verdict = job(tmp_path, _unique_id("Socket Timeout"))["verdict"]
    assert verdict["category"] == "nccl_timeout"
    assert verdict["rule_id"] == "nccl-unique-id-store-get-timeout"
    assert verdict["culprit_ranks"] == [0]  # the rank the waiting rank 5 names, not the writer


def test_a_unique_id_get_reset_is_not_a_timeout(tmp_path):
    verdict = job(tmp_path, _unique_id("Connection reset by peer"))["verdict"]
    assert verdict["rule_id"] != "nccl-unique-id-store-get-timeout"


# --- CUDA IPC / SHM setup failing between processes of "one" host that claim the same GPU ----------------

def _ipc_job(second_device: int) -> list[str]:
    return [
        "gpu:95772:95782 [0] INFO NET : Using interface em1:10.7.7.23<0>",
        "gpu:95773:95785 [1] INFO NET : Using interface em1:10.7.7.23<0>",
        f"gpu:27895:27932 [{second_device}] INFO Using internal Network Socket",
        "gpu:95772:95782 [0] transport/p2p.cu:526 WARN failed to open CUDA IPC handle : 11 invalid argument",
        "gpu:95772:95782 [0] INFO init.cu:475 -> 1",
        f"gpu:27895:27932 [{second_device}] include/shm.h:46 WARN failed to register host buffer 0x7f685140d000 : invalid argument",
    ]


def test_ipc_failures_between_processes_on_one_gpu_are_two_machines_of_one_name(tmp_path):
    verdict = job(tmp_path, _ipc_job(0))["verdict"]
    assert verdict["rule_id"] == "drift-identical-hostnames"
    assert verdict["culprit_hosts"] == ["gpu"]


def test_ipc_failures_between_processes_on_distinct_gpus_stay_a_transport_failure(tmp_path):
    verdict = job(tmp_path, _ipc_job(2))["verdict"]
    assert verdict["rule_id"] != "drift-identical-hostnames"
    assert verdict["category"] == "p2p_nvlink_or_pcie_error"
