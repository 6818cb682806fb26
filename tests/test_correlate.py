"""Correlate: ranks and hosts attributed from the strongest source, deterministically."""

from __future__ import annotations

from pathlib import Path

from analyzer.api import analyze
from analyzer.correlate import correlate
from analyzer.events import events_from_records

ROOT = Path(__file__).resolve().parent.parent


def _event(line, **fields):
    return {"file": "console.log", "line": line, "source": "text", "kind": "log.line", "message": "", "text": "", **fields}


def test_torchrun_loopback_host_is_the_ranks_machine():
    events = events_from_records([
        _event(1, host="gpu-node-7", pid=995, rank=0),
        _event(2, host="gpu-node-7", pid=996, rank=1),
        _event(3, host="localhost", pid=996, rank=1, source="torchrun", kind="torchrun.failure"),
    ])
    attributed, facts = correlate(events, [])
    assert facts.hosts == ["gpu-node-7"]
    assert attributed.filter(attributed["line"] == 3).get_column("host").to_list() == ["gpu-node-7"]


def test_loopback_is_kept_when_nothing_else_names_the_machine():
    events = events_from_records([_event(1, host="localhost", rank=0, source="torchrun", kind="torchrun.failure")])
    assert correlate(events, [])[1].hosts == ["localhost"]


def test_recorded_single_host_crash_has_one_host():
    """torchrun's table says `host : localhost`, NCCL says `vm`: one machine."""
    report = analyze(ROOT / "fixtures" / "recorded" / "rank_raises").report
    assert report["job"]["hosts"] == ["vm"]
    assert report["verdict"]["culprit_hosts"] == ["vm"]


def test_a_tie_between_hosts_of_one_rank_is_broken_by_name():
    rows = [_event(1, host="b-node", rank=0), _event(2, host="a-node", rank=0), _event(3, rank=0)]
    for order in (rows, rows[::-1]):
        attributed, facts = correlate(events_from_records(order), [])
        assert facts.rank_hosts == {0: "a-node"}
        assert attributed.filter(attributed["line"] == 3).get_column("host").to_list() == ["a-node"]


def _two_node_job(tmp_path):
    from tests.driftgen import build

    return build("healthy", tmp_path)


def test_a_node_read_out_takes_its_directorys_host(tmp_path):
    """nvidia-smi -q and dmesg print no host name: the node directory beside the console names it."""
    job = _two_node_job(tmp_path)
    smi = (ROOT / "fixtures" / "node-state" / "healthy-nvidia-smi-q.txt").read_text()
    smi = smi.replace("DRAM Uncorrectable                         : 0", "DRAM Uncorrectable                         : 3", 1)
    (job / "node-b" / "node.nvidia-smi-q.txt").write_text(smi)
    report = analyze(job).report
    assert report["verdict"]["category"] == "gpu_hardware_xid"
    assert report["verdict"]["culprit_hosts"] == ["node-b"]
    assert report["verdict"]["evidence"][0]["file"] == "node-b/node.nvidia-smi-q.txt"
    assert [f["rule_id"] for f in report["findings"] if f["category"] == "gpu_hardware_xid"] == ["gpu-memory-errors-reported"]


def test_an_xid_in_a_nodes_kernel_log_names_that_node(tmp_path):
    job = _two_node_job(tmp_path)
    (job / "node-a" / "dmesg.txt").write_text(
        "[Mon Nov 30 15:02:11 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    report = analyze(job).report
    assert (report["verdict"]["category"], report["verdict"]["culprit_hosts"]) == ("gpu_hardware_xid", ["node-a"])


def test_healthy_read_outs_beside_a_healthy_job_add_nothing(tmp_path):
    job = _two_node_job(tmp_path)
    before = [f["rule_id"] for f in analyze(job).report["findings"]]
    for node in ("node-a", "node-b"):
        for name in ("healthy-nvidia-smi-q.txt", "healthy-nvlink-s.txt"):
            (job / node / name).write_text((ROOT / "fixtures" / "node-state" / name).read_text())
    assert [f["rule_id"] for f in analyze(job).report["findings"]] == before
