"""Nsight Systems: the SQLite export (a real one, gzipped) and `nsys stats` CSV reports."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import polars as pl

from analyzer.api import analyze
from analyzer.io import discover
from analyzer.parse import parse_input

NSYS = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "nsys"
EXPORT = NSYS / "nsys-2025.3_torch-2.11_2gpu-allreduce_export.sqlite.gz"


def parse_path(path: Path):
    (item,) = discover(path)
    return parse_input(item), item


def test_classification_by_content(tmp_path):
    shutil.copy(EXPORT, tmp_path / "profile.bin.gz")  # the name says nothing
    shutil.copy(NSYS / "nsys-2025.3_stats_cuda_gpu_trace.csv", tmp_path / "report1.txt")
    formats = {i.path: i.format for i in discover(tmp_path)}
    assert formats == {"profile.bin.gz": "nsys_sqlite", "report1.txt": "nsys_stats_csv"}


def test_gzipped_export_is_read_through_a_temporary_copy_outside_the_job(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(EXPORT, job / "profile.sqlite.gz")
    events, item = parse_path(job)
    assert item.status == "parsed", item.reason
    assert list(scratch.iterdir()) == []  # the decompressed copy is gone
    assert sorted(p.name for p in job.iterdir()) == ["profile.sqlite.gz"]  # nothing written into the job
    ranks = events.filter(pl.col("kind") == "trace.rank").sort("device")
    # One unit per training process: its pid, its GPU and the host from the export.
    assert ranks.select("pid", "device", "local_rank", "host").rows() == [(930, 0, 0, "vm"), (931, 1, 1, "vm")]
    assert ranks.get_column("rank").is_null().all()  # no rank in an nsys export: correlate fills it
    figures = json.loads(ranks.get_column("detail")[0])
    assert figures["steps"] == 3  # NVTX step0..step3, the first left out as warm-up
    ops = events.filter((pl.col("kind") == "trace.collective") & (pl.col("pid") == 931))
    assert sorted(ops.get_column("op").to_list()) == ["AllGather", "AllReduce", "Broadcast"]
    steps = events.filter((pl.col("kind") == "trace.step") & (pl.col("pid") == 931))
    assert steps.get_column("seq").to_list() == [1, 2, 3]


def test_plain_export_is_opened_in_place_read_only(tmp_path):
    import gzip

    path = tmp_path / "profile.sqlite"
    path.write_bytes(gzip.decompress(EXPORT.read_bytes()))
    before = path.stat().st_mtime_ns
    events, item = parse_path(path)
    assert item.status == "parsed" and events.filter(pl.col("kind") == "trace.rank").height == 2
    assert path.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.sqlite"]


def test_ranks_come_from_the_jobs_nccl_lines(tmp_path):
    shutil.copy(EXPORT, tmp_path / "profile.sqlite.gz")
    (tmp_path / "nccl.log").write_text(
        "vm:930:930 [0] NCCL INFO ncclCommInitRankConfig comm 0x488d1940 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x9df4917f25c57c21 - Init COMPLETE\n"
        "vm:931:931 [1] NCCL INFO ncclCommInitRankConfig comm 0x3cde8fd0 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 70 commId 0x9df4917f25c57c21 - Init COMPLETE\n"
    )
    result = analyze(tmp_path)
    ranks = result.events.filter(pl.col("kind") == "trace.rank").select("pid", "rank").sort("pid").rows()
    assert ranks == [(930, 0), (931, 1)]


def test_sqlite_that_is_not_an_nsys_export_is_skipped_with_the_reason(tmp_path):
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    events, item = parse_path(tmp_path / "other.db")
    assert item.format == "nsys_sqlite" and item.status == "skipped" and "not an nsys export" in item.reason
    assert events.height == 0


def test_stats_gpu_trace_is_a_per_device_timeline():
    events, item = parse_path(NSYS / "nsys-2025.3_stats_cuda_gpu_trace.csv")
    assert item.status == "parsed"
    ranks = events.filter(pl.col("kind") == "trace.rank")
    assert sorted(ranks.get_column("device").to_list()) == [0, 1]
    ops = events.filter(pl.col("kind") == "trace.collective")
    counts = {(d, op): json.loads(x)["count"] for d, op, x in ops.select("device", "op", "detail").iter_rows()}
    assert counts[(0, "AllReduce")] == counts[(1, "AllReduce")] == 4


def test_stats_summaries():
    kern, _ = parse_path(NSYS / "nsys-2025.3_stats_cuda_gpu_kern_sum.csv")
    assert kern.get_column("kind").to_list() == ["trace.kernel_summary"]
    assert json.loads(kern.get_column("detail")[0])["nccl_share"] > 0.99
    api, _ = parse_path(NSYS / "nsys-2025.3_stats_cuda_api_sum.csv")
    figures = json.loads(api.get_column("detail")[0])
    # cuMemCreate 294 + cudaMalloc 2; cuMemRelease 778 + cudaFree 2 (NCCL's buffers, at init)
    assert (figures["mallocs"], figures["frees"]) == (296, 780)
    nvtx, _ = parse_path(NSYS / "nsys-2025.3_stats_nvtx_sum.csv")
    assert json.loads(nvtx.get_column("detail")[0])["steps"] == 8
    skipped, item = parse_path(NSYS / "nsys-2025.3_stats_nvtx_gpu_proj_trace.csv")
    assert skipped.height == 0 and item.status == "skipped" and "nvtx_gpu_proj_trace" in item.reason


def test_export_and_stats_reports_of_one_profile_are_kept_apart():
    result = analyze(NSYS)
    sources = result.events.filter(pl.col("kind") == "trace.rank").get_column("source").value_counts(sort=True)
    assert dict(sources.iter_rows()) == {"nsys": 2, "nsys_stats": 2}
    # A small all-reduce test: no straggler, and the stats timeline has no steps to judge idle time by.
    assert result.report["verdict"]["category"] == "none"


def test_export_events_cite_the_row_of_their_table():
    import gzip

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.sqlite"
        path.write_bytes(gzip.decompress(EXPORT.read_bytes()))
        events, _ = parse_path(path)
        con = sqlite3.connect(path)
        try:
            ops = events.filter(pl.col("kind") == "trace.collective")
            assert ops.height
            for line, text in ops.select("line", "text").iter_rows():
                name_id, start, end = con.execute(
                    "SELECT shortName, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = ?", (line,)).fetchone()
                (name,) = con.execute("SELECT value FROM StringIds WHERE id = ?", (name_id,)).fetchone()
                assert name[:40] in text and f"dur={round((end - start) / 1e6, 3)} ms" in text
        finally:
            con.close()


def test_stats_gpu_trace_events_cite_the_csv_line():
    path = NSYS / "nsys-2025.3_stats_cuda_gpu_trace.csv"
    events, _ = parse_path(path)
    lines = path.read_text().splitlines()
    ops = events.filter(pl.col("kind") == "trace.collective")
    assert ops.height
    for line, op, text in ops.select("line", "op", "text").iter_rows():
        start = lines[line - 1].split(",")[0]
        assert f"Kernel_{op}" in lines[line - 1] and f"ts={int(start) / 1000:.3f}".rstrip("0").rstrip(".") + " us" in text
