"""The cross-host NCCL_SOCKET_IFNAME analysis (analyzer/analyses/ifname.py), on jobs written into tmp_path:
one interface name set for every host, and NCCL failing at init on only some of them."""

from __future__ import annotations

from pathlib import Path

from analyzer.api import analyze

_RULE = "nccl-socket-ifname-differs-across-hosts"
_OK = [
    "nodea:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "nodea:100:100 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using internal implementation",
    "nodea:100:100 [0] NCCL INFO comm 0x5581 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
]
_FAILED = [
    "nodeb:200:200 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so), using internal implementation",
    "nodeb: Test NCCL failure common.cu:959 'internal error - please report this issue to the NCCL developers / '",
    " .. nodeb pid 200: Test failure common.cu:844",
]


def _job(tmp_path: Path, command: str, a: list[str], b: list[str]) -> dict:
    (tmp_path / "command.txt").write_text(f"# launched with\n{command}\n# end\n")
    (tmp_path / "nodea.log").write_text("\n".join(a) + "\n")
    (tmp_path / "nodeb.log").write_text("\n".join(b) + "\n")
    return analyze(tmp_path).report


def _found(report: dict) -> dict[str, dict]:
    return {f["rule_id"]: f for f in report["findings"]}


def test_one_ifname_and_init_failing_on_one_host_names_that_host(tmp_path):
    report = _job(tmp_path, "mpirun -np 2 -pernode -x NCCL_SOCKET_IFNAME=eth0 ./all_reduce_perf -b 8 -e 128M", _OK, _FAILED)
    assert report["verdict"]["category"] == "wrong_network_interface"
    assert report["verdict"]["culprit_hosts"] == ["nodeb"]
    explained = [f["rule_id"] for f in report["findings"] if _RULE in f["caused_by"]]
    assert "vocabulary-nccl-init-failure" in explained


def test_an_exported_exact_name_counts_as_one_interface(tmp_path):
    report = _job(tmp_path, "export NCCL_SOCKET_IFNAME==eth0", _OK, _FAILED)
    assert _RULE in _found(report)


def test_a_list_of_interfaces_is_not_one_name(tmp_path):
    report = _job(tmp_path, "mpirun -np 2 -x NCCL_SOCKET_IFNAME=eth0,enp4s0 ./all_reduce_perf", _OK, _FAILED)
    assert _RULE not in _found(report)


def test_init_failing_on_every_host_is_not_a_host_difference(tmp_path):
    failed_a = [line.replace("nodeb", "nodea") for line in _FAILED]
    report = _job(tmp_path, "mpirun -np 2 -x NCCL_SOCKET_IFNAME=eth0 ./all_reduce_perf", failed_a, _FAILED)
    assert _RULE not in _found(report)


def test_without_the_setting_the_failure_stays_an_init_failure(tmp_path):
    report = _job(tmp_path, "mpirun -np 2 -x NCCL_DEBUG=INFO ./all_reduce_perf", _OK, _FAILED)
    assert _RULE not in _found(report)
    assert report["verdict"]["category"] == "nccl_init_failure"
