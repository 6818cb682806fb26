"""CUDA memory snapshots: restricted unpickling, routing by content, fragmentation figures."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import polars as pl
import pytest

from analyzer.io import discover
from analyzer.parse import parse_input
from analyzer.parse.memsnapshot import snapshot_events
from analyzer.io.safepickle import load_untrusted_pickle

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
MiB = 1 << 20


def parse_path(path: Path):
    (item,) = discover(path)
    return parse_input(item), item


def test_snapshots_are_plain_containers():
    data = (RECORDED / "memory_fragmented" / "job" / "mem" / "churn.pickle").read_bytes()
    doc = load_untrusted_pickle(data)  # refuses every global: this must load without one
    assert {"segments", "device_traces"} <= set(doc)


def test_churning_snapshot_figures():
    events, item = parse_path(RECORDED / "memory_fragmented" / "job" / "mem" / "churn.pickle")
    assert item.format == "memory_snapshot" and item.status == "parsed"
    snap = events.filter(pl.col("kind") == "memory.snapshot").row(0, named=True)
    figures = json.loads(snap["detail"])
    assert figures["segments"] == 183
    assert figures["stranded"] == pytest.approx(1.75 * (1 << 30), rel=0.01)  # the OOM message's figure
    assert 0.45 < figures["fragmentation"] < 0.55
    assert figures["largest_free"] < 20 * MiB
    assert figures["ooms"] == 1 and figures["oom_request"] == 1 << 30
    oom = events.filter(pl.col("kind") == "memory.oom").row(0, named=True)
    assert "1.00 GiB" in oom["message"]


def test_clean_snapshot_has_nothing_stranded():
    events, _ = parse_path(RECORDED / "memory_clean" / "job" / "mem" / "clean.pickle")
    figures = json.loads(events.filter(pl.col("kind") == "memory.snapshot").get_column("detail")[0])
    assert figures["stranded"] == 0 and figures["fragmentation"] == 0.0 and figures["segment_frees"] == 0


def test_flight_recorder_pickles_still_reach_their_parser():
    dump = next((RECORDED / "hang_rank_stuck_outside" / "job" / "fr").iterdir())
    events, item = parse_path(dump)
    assert item.format == "pickle"
    assert events.filter(pl.col("kind") == "fr.entry").height > 0


def test_a_pickle_with_a_global_is_refused_and_nothing_runs(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "snap.pickle").write_bytes(pickle.dumps({"segments": [], "x": Evil()}))
    events, item = parse_path(tmp_path / "snap.pickle")
    assert events.height == 0 and item.status == "error" and "unsafe pickle" in item.reason


def test_segments_reallocated_after_releases_are_counted():
    seg = {"device": 0, "total_size": 20 * MiB, "allocated_size": 0, "blocks": [{"size": 20 * MiB, "state": "inactive"}]}
    trace = [{"action": "segment_alloc", "size": 20 * MiB}] * 3
    for _ in range(10):  # an allocator emptied and refilled every step
        trace += [{"action": "segment_free", "size": 20 * MiB}, {"action": "segment_alloc", "size": 20 * MiB}]
    events = snapshot_events({"segments": [seg], "device_traces": [trace]}, file="s.pickle", rank=3)
    figures = json.loads(events.get_column("detail")[0])
    assert (figures["segment_allocs"], figures["segment_frees"], figures["segment_reallocs"]) == (13, 10, 10)
    assert events.get_column("rank").to_list() == [3]
