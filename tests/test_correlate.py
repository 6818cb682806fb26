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


# --- c10d's `[Rank N]`: the default process group's rank is the global rank ----------------------


def _c10d(line, pg_rank, pg=None, kind="watchdog.timeout", **fields):
    return _event(line, source="c10d", kind=kind, pg=pg, pg_rank=pg_rank, message=f"[Rank {pg_rank}] Watchdog caught", **fields)


def _ranks_by_line(events):
    attributed, _ = correlate(events_from_records(events), [])
    return dict(attributed.select("line", "rank").iter_rows())


def test_an_unprefixed_default_group_rank_is_the_global_rank():
    """`[Rank 3]` (before 2.2, no group named), `[PG 0 Rank 1]` and `[PG ID 0 PG GUID 0(default_pg) Rank 2]`."""
    events = [_c10d(1, 3), _c10d(2, 1, pg="0"), _c10d(3, 2, pg="0", kind="watchdog.pg_status")]
    assert _ranks_by_line(events) == {1: 3, 2: 1, 3: 2}
    assert correlate(events_from_records(events), [])[1].ranks == [1, 2, 3]


def test_a_sub_group_rank_is_not_a_global_rank():
    """`[PG 3 Rank 1]` is rank 1 of group 3; and once a job shows a sub-group, a bare `[Rank 1]` may be one too."""
    assert _ranks_by_line([_c10d(1, 1, pg="3"), _c10d(2, 1), _c10d(3, 2, pg="0")]) == {1: None, 2: None, 3: 2}


def test_a_bare_rank_stays_unknown_beside_communicators_of_several_sizes():
    def comm(line, nranks):
        return _event(line, file="nccl.log", kind="nccl.comm_init", source="nccl", host="n1", pid=10 + line, pg_rank=0, nranks=nranks)

    assert _ranks_by_line([comm(1, 8), comm(2, 2), _c10d(3, 1)])[3] is None
    assert _ranks_by_line([comm(1, 8), comm(2, 8), _c10d(3, 1)])[3] == 1


def test_a_prefix_or_file_rank_wins_over_the_group_rank():
    """`[rank5]:[E...] [PG 3 Rank 1]`: the prefix gives the global rank, the group's rank is not used."""
    assert _ranks_by_line([_c10d(1, 1, pg="3", rank=5), _c10d(2, 1, pg="0", rank=6)]) == {1: 5, 2: 6}


def test_one_ranks_c10d_line_does_not_claim_a_shared_console():
    """A console whose only rank-naming line is rank 2's timeout: rank 0's progress bar above it stays unattributed."""
    events = [_event(1, kind="progress", message="Preparing data: 50%|#####     | 5/10 [00:01<00:01]"), _c10d(2, 2)]
    assert _ranks_by_line(events) == {1: None, 2: 2}


def test_only_c10d_lines_take_the_group_rank():
    """NCCL's `comm ... rank R nranks N` is attributed through its host:pid, not here; other text keeps its rank."""
    events = [_event(1, kind="log.line", pg_rank=3, message="[Rank 3] step=10"), _c10d(2, 1)]
    assert _ranks_by_line(events) == {1: None, 2: 1}
