"""Correlate: the world size is what independent sources agree on; one source's outlier is a contradiction.

Issue 18: a single line claiming an absurd or outlier size (`nranks 1000000`, one `[Rank 999999]`
line) must not change the reported world size or the verdict when other sources disagree. Each
mechanism is tested with the outlier among ordinary lines (before and after it), with the same lines
without it, and with the cases that must keep today's answer (one source only, ranks that reach the
larger size, a rank file of its own).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from rich.console import Console

from analyzer.api import analyze
from analyzer.facts.correlate import correlate
from analyzer.events import events_from_records
from analyzer.render.text import render_text

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"


def _event(line, **fields):
    return {"file": "console.log", "line": line, "source": "text", "kind": "log.line", "message": "", "text": "", **fields}


def _init(line, pid, rank, nranks, host="vm", **fields):
    return _event(line, kind="nccl.comm_init", source="nccl", host=host, pid=pid, pg_rank=rank, nranks=nranks, **fields)


def _two_ranks(*middle):
    """Ranks 0 and 1 state nranks 2 (and rank-prefixed lines), with `middle` between them."""
    return [_init(1, 101, 0, 2), _event(2, host="vm", pid=101, rank=0), *middle,
            _init(8, 102, 1, 2), _event(9, host="vm", pid=102, rank=1)]


def test_one_source_stating_an_outlier_size_is_a_contradiction_not_the_size():
    facts = correlate(events_from_records(_two_ranks(_init(5, 103, 0, 1_000_000))), [])[1]
    assert facts.world_size == 2
    assert facts.world_size_source == "NCCL comm init nranks 2 (console.log:1)"
    assert facts.conflicts == ["uncorroborated size: nranks 1000000 is stated by one source only (console.log:5) against "
                               "nranks 2 stated by 2 sources (console.log:1); not used"]
    assert correlate(events_from_records(_two_ranks()), [])[1].conflicts == []


def test_the_outlier_does_not_pick_the_world_communicator():
    """The line's process is not attributed rank 0 of a communicator of a million."""
    events, facts = correlate(events_from_records(_two_ranks(_init(5, 103, 7, 1_000_000), _event(6, host="vm", pid=103))), [])
    assert facts.ranks == [0, 1]
    assert events.filter(events["line"] == 6).get_column("rank").to_list() == [None]


def test_a_size_one_source_states_alone_is_kept():
    """Rank 0's log only: its world communicator and a sub-communicator; nothing disagrees."""
    facts = correlate(events_from_records([_init(1, 101, 0, 16), _init(2, 101, 0, 8)]), [])[1]
    assert (facts.world_size, facts.world_size_stated, facts.conflicts) == (16, True, [])


def test_a_larger_size_the_ranks_reach_is_kept():
    """Two processes state only a sub-communicator of 8; rank 12 is seen, so the world of 16 stands."""
    events = [_init(1, 101, 0, 8), _init(2, 102, 1, 8), _init(3, 112, 0, 16), _event(4, host="vm", pid=112, rank=12),
              _event(5, file="rank13.log", rank=13)]
    facts = correlate(events_from_records(events), [])[1]
    assert facts.world_size == 16
    assert not [c for c in facts.conflicts if "not used" in c]


def test_two_sources_stating_the_larger_size_are_believed():
    events = [_init(1, 101, 0, 2), _init(2, 102, 1, 2), _init(3, 103, 0, 4), _init(4, 104, 3, 4)]
    assert correlate(events_from_records(events), [])[1].world_size == 4


def test_one_rank_line_past_an_agreed_size_is_a_contradiction():
    events = _two_ranks(_event(5, file="other.log", rank=999_999))
    attributed, facts = correlate(events_from_records(events), [])
    assert (facts.world_size, facts.ranks) == (2, [0, 1])
    assert facts.conflicts == ["uncorroborated rank: rank 999999 is named in one file only (other.log:5), past nranks 2 stated "
                               "by 2 sources (console.log:1); not used"]
    assert attributed.filter(attributed["file"] == "other.log").get_column("rank").to_list() == [None]


def test_ranks_past_a_size_one_source_states_are_kept_and_named():
    """One statement is no agreement: rank 5 is seen, the world is at least 6 and the conflict is listed."""
    events = [_init(1, 101, 0, 2), _event(3, file="rank5.log", rank=5)]
    facts = correlate(events_from_records(events), [])[1]
    assert facts.world_size == 6
    assert facts.conflicts == ["world size: rank 5 is seen (rank5.log:3) but the largest size stated is 2"]


def test_several_ranks_past_the_agreed_size_are_kept():
    events = _two_ranks(_event(5, file="rank2.log", rank=2), _event(6, file="rank3.log", rank=3))
    facts = correlate(events_from_records(events), [])[1]
    assert (facts.world_size, facts.ranks) == (4, [0, 1, 2, 3])


def _job_with(tmp_path: Path, lines: list[str]) -> Path:
    job = tmp_path / "job"
    shutil.copytree(CASE, job)
    (job / "extra.log").write_text("\n".join(lines) + "\n")
    return job


def test_an_outlier_line_changes_neither_the_verdict_nor_the_world_size(tmp_path):
    """The recorded watchdog case with an `nranks 1000000` init line and a `[Rank 999999]` watchdog line added."""
    plain = analyze(CASE).report
    job = _job_with(tmp_path, [
        "vm:4242:4242 [0] NCCL INFO comm 0x55d0 rank 0 nranks 1000000 cudaDev 0 busId 1000 - Init COMPLETE",
        "[rank999999]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 999999] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600011 milliseconds before timing out.",
    ])
    report = analyze(job).report
    assert report["job"]["world_size"] == plain["job"]["world_size"] == 2
    assert report["job"]["ranks"] == plain["job"]["ranks"]
    for key in ("category", "culprit_ranks", "rule_id"):
        assert report["verdict"][key] == plain["verdict"][key], key
    conflicts = report["job"]["facts_conflicts"]
    assert any("nranks 1000000 is stated by one source only" in c for c in conflicts), conflicts
    assert any("rank 999999 is named in one file only" in c for c in conflicts), conflicts
    header = _text(report).splitlines()[0]
    assert "world size: 2" in header and "conflicting" not in header, header


def _text(report: dict) -> str:
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=200, no_color=True, emoji=False, highlight=False))
    return buffer.getvalue()
