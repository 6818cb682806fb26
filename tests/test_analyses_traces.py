"""Slow-job analyses: straggler ranking, idle gaps, unoverlapped communication, allocator churn,
fragmentation (memory snapshots and OOM messages)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analyzer.api import analyze
from tests.test_parse_kineto import step_events, write_job

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
TRACE_RULES = ("trace-", "memory-")


def findings(report: dict, prefix: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule_id"].startswith(prefix)]


def lag_ms(summary: str) -> float:
    return float(re.search(r"wait ([\d.]+) ms per step", summary).group(1))


def test_recorded_slow_rank_is_the_straggler_with_its_lag():
    report = analyze(RECORDED / "slow_rank_traced" / "job").report
    verdict = report["verdict"]
    assert verdict["category"] == "straggler" and verdict["culprit_ranks"] == [1]
    assert verdict["rule_id"] == "trace-straggler-rank"
    # rank 1 sleeps 30 ms and runs ~25 ms of extra matmuls per step: rank 0 waits ~55 ms for it.
    assert 40 < lag_ms(verdict["summary"]) < 70
    assert "last in 4 of 4 profiled steps" in verdict["summary"]
    assert {e["file"] for e in verdict["evidence"]} == {"traces/rank0.json", "traces/rank1.json"}
    idle = findings(report, "trace-gpu-idle-gaps")
    assert idle and idle[0]["ranks"] == [1] and "data_loader" in idle[0]["summary"]


def test_recorded_healthy_traced_run_has_no_trace_finding():
    report = analyze(RECORDED / "healthy_traced" / "job").report
    assert report["verdict"]["category"] == "none"
    assert not [f for f in report["findings"] if f["rule_id"].startswith(TRACE_RULES)]


def test_straggler_among_four_ranks(tmp_path):
    ranks = {r: step_events(r, 6, host_ms=1, compute_ms=10, wait_ms=0 if r == 2 else 25) for r in range(4)}
    ranks[2] = step_events(2, 6, host_ms=26, compute_ms=10, wait_ms=0)
    report = analyze(write_job(tmp_path, ranks)).report
    (found,) = findings(report, "trace-straggler-rank")
    assert found["ranks"] == [2]
    assert lag_ms(found["summary"]) == pytest.approx(25.0, abs=0.2)


def test_balanced_ranks_have_no_straggler(tmp_path):
    ranks = {r: step_events(r, 6, host_ms=1, compute_ms=10, wait_ms=0.3 * r) for r in range(4)}
    report = analyze(write_job(tmp_path, ranks)).report
    assert not findings(report, "trace-straggler-rank")


def test_a_slow_half_is_named_but_three_slow_ranks_of_four_are_not(tmp_path):
    ranks = {r: step_events(r, 6, host_ms=1, compute_ms=10, wait_ms=20 if r % 2 else 0) for r in range(4)}
    report = analyze(write_job(tmp_path, ranks)).report
    found = findings(report, "trace-straggler-rank")
    assert found and found[0]["ranks"] == [0, 2]
    ranks = {r: step_events(r, 6, host_ms=1, compute_ms=10, wait_ms=20 if r == 0 else 0) for r in range(4)}
    assert not findings(analyze(write_job(tmp_path / "b", ranks)).report, "trace-straggler-rank")


def test_every_rank_idle_is_reported_without_a_culprit(tmp_path):
    ranks = {r: step_events(r, 5, host_ms=40, compute_ms=10, wait_ms=0) for r in range(2)}
    report = analyze(write_job(tmp_path, ranks)).report
    (idle,) = findings(report, "trace-gpu-idle-gaps")
    assert idle["ranks"] == [] and idle["summary"].startswith("every rank")
    assert not findings(report, "trace-straggler-rank")


def test_communication_not_overlapped(tmp_path):
    exposed = {r: step_events(r, 5, host_ms=1, compute_ms=10, wait_ms=0, nccl_ms=20) for r in range(2)}
    report = analyze(write_job(tmp_path / "a", exposed)).report
    (found,) = findings(report, "trace-communication-not-overlapped")
    assert "20.0 ms" in found["summary"]
    hidden = {r: step_events(r, 5, host_ms=1, compute_ms=25, wait_ms=0, nccl_ms=20, overlap_ms=20) for r in range(2)}
    assert not findings(analyze(write_job(tmp_path / "b", hidden)).report, "trace-communication-not-overlapped")


def test_allocator_churn_in_steady_state(tmp_path):
    churn = {r: step_events(r, 5, host_ms=1, compute_ms=10, wait_ms=0, allocs_per_step=2 if r == 1 else 0) for r in range(2)}
    report = analyze(write_job(tmp_path / "a", churn)).report
    (found,) = findings(report, "memory-allocator-churn")
    assert found["ranks"] == [1] and "8 device allocations and 8 releases" in found["summary"]
    assert found["category"] == "fragmented_memory"
    steady = {r: step_events(r, 5, host_ms=1, compute_ms=10, wait_ms=0) for r in range(2)}
    assert not findings(analyze(write_job(tmp_path / "b", steady)).report, "memory-allocator-churn")


def test_fragmentation_figure_on_the_churning_snapshot_and_not_on_the_clean_one():
    report = analyze(RECORDED / "memory_fragmented" / "job").report
    assert report["verdict"]["category"] == "fragmented_memory"
    (found,) = findings(report, "memory-snapshot-fragmentation-oom")
    assert "1.75 GiB free inside 177 partly used allocator segments, 49%" in found["summary"]
    assert "1.00 GiB request" in found["summary"]
    clean = analyze(RECORDED / "memory_clean" / "job").report
    assert clean["verdict"]["category"] == "none"
    assert not findings(clean, "memory-")


OOM = (
    "[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 3 has a total capacity of "
    "63.42 GiB of which 1.70 GiB is free. Of the allocated memory 50.94 GiB is allocated by PyTorch, and {unalloc} is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_oom_message_with_large_reserved_but_unallocated(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "log.txt").write_text(OOM.format(rank=11, req="4.35 GiB", unalloc="8.56 GiB") + "\n")
    report = analyze(tmp_path / "a").report
    (found,) = findings(report, "memory-oom-reserved-unallocated")
    assert found["ranks"] == [11] and "8.56 GiB" in found["summary"] and "4.35 GiB" in found["summary"]
    # From the message alone the OOM stays the verdict; the fragmentation is its explanation.
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "log.txt").write_text(OOM.format(rank=11, req="4.35 GiB", unalloc="120.00 MiB") + "\n")
    assert not findings(analyze(tmp_path / "b").report, "memory-oom-reserved-unallocated")


def test_recorded_straggler_evidence_cites_trace_events_not_the_file():
    report = analyze(RECORDED / "slow_rank_traced" / "job").report
    evidence = report["verdict"]["evidence"]
    assert evidence and all(e["line"] > 0 for e in evidence)
    # rank 0 waits inside its longest all-reduce kernel; the entry it cites is that kernel.
    (waiting,) = [e for e in evidence if e["rank"] == 0 and "AllReduce" in e["text"]]
    assert re.match(r"rank 0 ncclDevKernel_AllReduce\S* ts=[\d.]+ us dur=([\d.]+) ms in ProfilerStep#\d+", waiting["text"])
    assert float(re.search(r"dur=([\d.]+) ms", waiting["text"]).group(1)) > 40
    entries = json.loads((RECORDED / "slow_rank_traced" / "job" / waiting["file"]).read_text())["traceEvents"]
    cited = entries[waiting["line"] - 1]
    assert cited["name"].startswith("ncclDevKernel_AllReduce") and f"ts={cited['ts']} us" in waiting["text"]
    gaps = [e for e in evidence if "GPU idle ts=" in e["text"]]
    assert gaps and all(e["rank"] == 1 and "data_loader" in e["text"] for e in gaps)
