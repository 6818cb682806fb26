"""The general changes made for the whole-corpus misses (docs/heldout/corpus-misses.md): each tested on
made-up lines between ordinary ones, never on a case's text."""

from pathlib import Path

import pytest

from analyzer.api import analyze

# nccl-tests' run header (how its device table is recognised)
RUN = "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0"
VETH = "NET/Socket : Using [0]enp3s0:10.1.2.3<0> [1]veth1a2b3c4:fe80::a0b1:c2ff:fed3:e4f5%veth1a2b3c4<0>"


def job(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> dict:
    (tmp_path / name).write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


def rules_of(report: dict) -> list[str]:
    return [f["rule_id"] for f in report["findings"]]


def nccl(host: str, text: str, rank: int = 0) -> str:
    return f"{host}:2201:2201 [{rank}] NCCL INFO {text}"


@pytest.mark.parametrize("listing", [
    VETH,
    "Bootstrap : Using [0]docker0:172.17.0.1<0>",
    "NET/Socket : Using [0]eth0:10.0.0.5<0> [1]br-4f2a9c1d7e3b:172.18.0.1<0>",
    "NET/Socket : Using [0]cni0:10.244.1.1<0>",
    "Bootstrap : Using [0]flannel.1:10.244.0.0<0>",
    "NET/Socket : Using [0]lo:127.0.0.1<0>",
])
def test_a_virtual_interface_in_the_list_is_named_when_the_job_may_span_hosts(tmp_path, listing):
    report = job(tmp_path, [nccl("node-a", "Bootstrap : Using [0]enp3s0:10.1.2.3<0>"), nccl("node-a", listing),
                            nccl("node-a", "Using network Socket")])
    assert report["verdict"]["category"] == "wrong_network_interface"
    assert report["verdict"]["culprit_hosts"] == ["node-a"]


@pytest.mark.parametrize("listing", [
    "NET/Socket : Using [0]eth0:10.0.0.5<0>",
    "NET/Socket : Using [0]enp3s0:10.1.2.3<0> [1]ib0:10.9.0.3<0>",
    "Bootstrap : Using [0]eth0:10.0.0.5<0>  (veth pairs are excluded by NCCL_SOCKET_IFNAME)",
])
def test_a_list_of_real_interfaces_is_not_named(tmp_path, listing):
    report = job(tmp_path, [nccl("node-a", listing), nccl("node-a", "Using network Socket")])
    assert "nccl-virtual-interface-selected" not in rules_of(report)


def test_one_host_stated_by_nccl_makes_the_interface_list_harmless(tmp_path):
    report = job(tmp_path, [nccl("node-a", VETH),
                            nccl("node-a", "comm 0x55d0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
                            nccl("node-a", "comm 0x56e0 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0", rank=1)])
    assert "nccl-virtual-interface-selected" not in rules_of(report)


def test_one_host_in_the_nccl_tests_device_table_makes_the_interface_list_harmless(tmp_path):
    report = job(tmp_path, [RUN, "#", "# Using devices",
                            "#   Rank  0 Pid  28001 on   node-a device  0 [0x01] NVIDIA RTX A6000",
                            "#   Rank  1 Pid  28002 on   node-a device  1 [0x41] NVIDIA RTX A6000",
                            nccl("node-a", VETH), nccl("node-a", "Using network Socket")], name="all_reduce_perf.log")
    assert "nccl-virtual-interface-selected" not in rules_of(report)


@pytest.mark.parametrize("contrary", [
    "comm 0x55d0 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
    "Channel 00/0 : 1[1e0] -> 0[1e0] [receive] via NET/Socket/0",
])
def test_a_line_showing_several_hosts_keeps_the_interface_finding(tmp_path, contrary):
    report = job(tmp_path, [RUN, "#", "# Using devices",
                            "#   Rank  0 Pid  28001 on   node-a device  0 [0x01] NVIDIA RTX A6000",
                            nccl("node-a", VETH), nccl("node-a", contrary)], name="all_reduce_perf.log")
    assert "nccl-virtual-interface-selected" in rules_of(report)


def test_two_hosts_in_the_logs_keep_the_interface_finding(tmp_path):
    report = job(tmp_path, [nccl("node-a", VETH), nccl("node-b", "NET/Socket : Using [0]enp3s0:10.1.2.4<0>", rank=1),
                            nccl("node-a", "comm 0x55d0 rank 0 nRanks 2 nNodes 1 localRanks 1 localRank 0 MNNVL 0")])
    assert "nccl-virtual-interface-selected" in rules_of(report)


@pytest.mark.parametrize(("signal", "category"), [
    ("Terminated", "host_oom_or_killed"),  # a SIGTERM from the loader itself is a clean exit (DataLoader.cpp)
    ("Killed", "host_oom_or_killed"),
    ("Bus error", "shm_too_small"),
    ("Segmentation fault", "other"),
])
def test_a_dataloader_worker_killed_by_a_signal_is_that_signal_not_the_exception(tmp_path, signal, category):
    report = job(tmp_path, ["epoch 3 iter 1200 loss 0.41", "Traceback (most recent call last):",
                            '  File "train.py", line 88, in <module>',
                            f"RuntimeError: DataLoader worker (pid 7311) is killed by signal: {signal}. ", "closing"])
    assert report["verdict"]["category"] == category
    if category != "other":
        generic = next(f for f in report["findings"] if f["rule_id"] == "python-uncaught-exception")
        assert generic["caused_by"]
