"""Correlate: ranks and hosts attributed from the strongest source, deterministically."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
from rich.console import Console

from analyzer.api import analyze
from analyzer.facts.correlate import correlate
from analyzer.events import events_from_records
from analyzer.render.text import render_text

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



def test_a_host_named_whole_in_a_file_name_is_that_files_host():
    """`ps` and nvidia-smi print no host: a file name that holds a known host between separators names it."""
    known = [_event(1, host=h, file="srun.out") for h in ("node-1", "node-10", "ip-10-0-0-7", "gpu_a")]
    paths = ["node-10-ps.txt", "dumps/node-1.nvidia-smi.txt", "ip-10-0-0-7/top.log", "gpu_a_ps.txt", "node-100-ps.txt", "node-1-node-10.txt"]
    attributed, _ = correlate(events_from_records([*known, *[_event(1, file=p) for p in paths]]), [])
    hosts = dict(attributed.filter(pl.col("file") != "srun.out").select("file", "host").rows())
    assert hosts == {
        "node-10-ps.txt": "node-10", "dumps/node-1.nvidia-smi.txt": "node-1", "ip-10-0-0-7/top.log": "ip-10-0-0-7",
        "gpu_a_ps.txt": "gpu_a", "node-100-ps.txt": None, "node-1-node-10.txt": None,
    }

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


# --- job facts and their sources ---------------------------------------------------------------


def test_world_size_names_the_line_that_states_it():
    events = events_from_records([
        _event(1, kind="nccl.comm_init", source="nccl", host="vm", pid=1, pg_rank=0, nranks=2),
        _event(2, kind="nccl.comm_init", source="nccl", host="vm", pid=2, pg_rank=1, nranks=2),
    ])
    facts = correlate(events, [])[1]
    assert (facts.world_size, facts.world_size_stated, facts.conflicts) == (2, True, [])
    assert facts.world_size_source == "NCCL comm init nranks 2 (console.log:1)"


def test_a_size_no_line_states_is_inferred_and_shown_as_a_lower_bound():
    """Case 024: rank 0 alone; the header must not print `world size: 1` as a fact."""
    report = analyze(ROOT / "fixtures" / "cases" / "024-autocast-rank0-only-save-checkpoint-barrier" / "job").report
    job = report["job"]
    assert (job["world_size"], job["world_size_stated"]) == (1, False)
    assert job["world_size_source"].startswith("inferred from the ranks seen")
    header = _text(report).splitlines()[0]
    assert "world size: >=1 (inferred from the ranks seen)" in header


def test_contradicting_sources_are_listed_not_printed_as_a_fact():
    """A trace says world_size 4, NCCL's world communicator says 2, and rank 5 is seen: all named."""
    events = events_from_records([
        _event(1, kind="nccl.comm_init", source="nccl", host="vm", pid=1, pg_rank=0, nranks=2),
        _event(0, file="traces/rank0.json", kind="trace.rank", source="kineto", rank=0, nranks=4),
        _event(3, file="rank5.log", rank=5),
    ])
    facts = correlate(events, [])[1]
    assert facts.conflicts == [
        "world size: NCCL comm init nranks 2 (console.log:1); trace distributedInfo world_size 4 (traces/rank0.json:0) disagree",
        "world size: rank 5 is seen (rank5.log:3) but the largest size stated is 4",
    ]
    report = analyze(ROOT / "fixtures" / "recorded" / "healthy" / "job").report
    report["job"]["facts_conflicts"] = facts.conflicts
    out = _text(report)
    assert "world size: conflicting (see below)" in out.splitlines()[0]
    assert "conflicting sources: world size: rank 5 is seen (rank5.log:3)" in out


def test_the_time_span_covers_every_timestamped_source(tmp_path):
    """The console's NCCL lines start 8 s before the trace: the span starts there and says so."""
    job = tmp_path / "job"
    (job / "traces").mkdir(parents=True)
    (job / "console.log").write_text(
        "2026-11-30 16:52:46.023 vm:1811:1811 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "2026-11-30 16:52:54.500 vm:1811:1811 [0] NCCL INFO comm 0x1 rank 0 nranks 1 cudaDev 0 busId 60 - Destroy COMPLETE\n")
    trace = {"distributedInfo": {"rank": 0, "world_size": 1}, "baseTimeNanoseconds": 1795971174000000000,
             "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 177000, "dur": 20000}]}
    (job / "traces" / "rank0.json").write_text(json.dumps(trace))
    span = analyze(job).report["job"]["time_span"]
    assert span["start"].startswith("2026-11-30T16:52:46.023")
    assert span["start_source"] == "console.log:1 (collector)"  # a timestamp the log collector prefixed
    assert span["end"].startswith("2026-11-30T16:52:54.5") and span["end_source"] == "console.log:2 (collector)"


def test_timestamped_lines_of_no_kind_bound_the_time_span_and_are_no_findings(tmp_path):
    """torchrun's glog header lines open the console 8 s before any line of a kind; a collector-
    stamped line that no kind knows closes it: both bound the span, with their line, and stay
    out of every finding."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "console.log").write_text(
        "W1130 16:52:46.023000 1771 torch/distributed/run.py:851] *****************************************\n"
        "W1130 16:52:46.023000 1771 torch/distributed/run.py:851] Setting OMP_NUM_THREADS environment variable for each process\n"
        "[default0]:[train.py rank0] init done backend=nccl world=1\n"
        "vm:1811:1811 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "2026-11-30 16:52:54.100 vm:1811:1811 [0] NCCL INFO comm 0x1 rank 0 nranks 1 cudaDev 0 busId 60 - Init COMPLETE\n"
        "2026-11-30 16:53:01.750 [default0]:epoch 1 done\n"
        "plain text without a clock\n")
    result = analyze(job)
    span = result.report["job"]["time_span"]
    assert span["start"].startswith("2026-11-30T16:52:46.023") and span["start_source"] == "console.log:1 (c10d-year-inferred)"
    assert span["end"].startswith("2026-11-30T16:53:01.75") and span["end_source"] == "console.log:6 (collector)"
    assert result.report["findings"] == [] and result.report["verdict"]["category"] == "none"
    timed = result.events.filter(pl.col("kind") == "log.timed")
    assert timed.get_column("line").to_list() == [1, 6] and timed.get_column("message").null_count() == 2


def test_recorded_healthy_traced_span_starts_at_the_consoles_first_line():
    job = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "healthy_traced" / "job"
    first = (job / "console.log").read_text().splitlines()[0]
    report = analyze(job).report
    span = report["job"]["time_span"]
    assert first.startswith("W1130 16:52:46.023") and span["start"].startswith("2026-11-30T16:52:46.023")
    assert span["start_source"] == "console.log:1 (c10d-year-inferred)"
    assert report["findings"] == []


def _text(report: dict) -> str:
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=200, no_color=True, emoji=False, highlight=False))
    return buffer.getvalue()


def test_a_vocabulary_event_takes_the_rank_its_line_was_given():
    """`[Rank 0] Watchdog caught ...` is a watchdog.timeout of rank 0 (default group) and a vocab.nccl_timeout:
    one line, one writer. A vocabulary event on a line of another rank's, or of none, stays as it is."""
    events = [
        _c10d(1, 0),
        _event(1, kind="vocab.nccl_timeout", source="c10d", message="[Rank 0] Watchdog caught"),
        _event(2, kind="vocab.other", message="no rank anywhere"),
    ]
    attributed, _ = correlate(events_from_records(events), [])
    assert attributed.filter(pl.col("kind").str.starts_with("vocab.")).select("line", "rank").rows() == [(1, 0), (2, None)]
