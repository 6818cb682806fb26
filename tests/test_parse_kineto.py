"""Kineto (PyTorch profiler) Chrome traces: streaming reader and per-rank timeline reduction."""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import polars as pl
import pytest

from analyzer.io import discover
from analyzer.parse import parse_input
from analyzer.parse.kineto_stream import TraceFormatError, read_kineto

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
NCCL_NAME = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def step_events(rank: int, steps: int, *, host_ms: float, compute_ms: float, wait_ms: float, nccl_ms: float = 3.0,
                overlap_ms: float = 0.0, start_us: float = 5_200_000_000_000.0, allocs_per_step: int = 0) -> list[dict]:
    """Events of `steps` training steps shaped like torch.profiler's: a ProfilerStep#N range, a
    data_loader range, a GEMM kernel and an NCCL all-reduce kernel (which waits `wait_ms`)."""
    out: list[dict] = []
    t = start_us
    for n in range(steps):
        begin = t
        out.append({"ph": "X", "cat": "user_annotation", "name": "data_loader", "pid": 1713, "tid": 1713, "ts": t, "dur": host_ms * 1000, "args": {"External id": 3 * n}})
        for a in range(allocs_per_step):
            for call in ("cudaMalloc", "cudaFree"):
                out.append({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": 1713, "tid": 1713, "ts": t + a, "dur": 5.0, "args": {"correlation": 900 + a}})
        t += host_ms * 1000
        out.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": rank, "tid": 7, "ts": t, "dur": compute_ms * 1000,
                    "args": {"External id": 3 * n + 1, "device": rank, "stream": 7, "correlation": 100 + n, "grid": [132, 1, 1]}})
        nccl_start = t + (compute_ms - overlap_ms) * 1000
        dur = (nccl_ms + wait_ms) * 1000
        out.append({"ph": "X", "cat": "kernel", "name": NCCL_NAME, "pid": rank, "tid": 21, "ts": nccl_start, "dur": dur,
                    "args": {"External id": 3 * n + 2, "device": rank, "stream": 21, "correlation": 200 + n}})
        t = max(t + compute_ms * 1000, nccl_start + dur) + 100.0
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{10 + n}", "pid": 1713, "tid": 1713, "ts": begin, "dur": t - begin, "args": {}})
    return out


def kineto_text(rank: int, world: int, events: list[dict], *, compact: bool = False) -> str:
    """A trace document laid out as Kineto writes it (header members, traceEvents, trailer)."""
    head = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": rank, "name": "NVIDIA H200", "totalGlobalMem": 150109880320}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "nccl_version": "2.28.9"},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
    }
    if compact:
        return json.dumps({**head, "traceEvents": events, "traceName": "x.json"})
    lines = ["{"] + [f'  "{k}": {json.dumps(v)},' for k, v in head.items()] + ['  "traceEvents": [']
    body = []
    for e in events:
        args = e.get("args")
        rest = {k: v for k, v in e.items() if k != "args"}
        text = "  {\n    " + json.dumps(rest)[1:-1]
        if args is not None:
            text += ',\n    "args": {\n      ' + json.dumps(args)[1:-1].replace(", ", ",\n      ") + "\n    }"
        body.append(text + "\n  }")
    lines.append(",\n".join(body))
    lines += ["  ],", '  "traceName": "/tmp/rank.json"', "}"]
    return "\n".join(lines) + "\n"


def write_job(root: Path, per_rank: dict[int, list[dict]], *, gz: bool = False, compact: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rank, events in per_rank.items():
        text = kineto_text(rank, len(per_rank), events, compact=compact)
        path = root / "traces" / f"rank{rank}.json"
        path.parent.mkdir(exist_ok=True)
        if gz:
            (path.parent / (path.name + ".gz")).write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
    return root


def parse_one(path: Path) -> tuple[pl.DataFrame, object]:
    item = next(i for i in discover(path))
    return parse_input(item), item


def test_classified_from_the_head_without_a_full_parse(tmp_path, monkeypatch):
    import analyzer.io.sniff as discover_module

    write_job(tmp_path, {0: step_events(0, 3, host_ms=1, compute_ms=2, wait_ms=0)})

    def refuse(*args, **kwargs):
        raise AssertionError("a trace must be recognised from its head")

    monkeypatch.setattr(discover_module, "_json_kind", refuse)
    (item,) = discover(tmp_path)
    assert item.format == "kineto_trace"


def test_rank_summary_figures(tmp_path):
    # 4 steps: the first is left out (steady state), 3 remain; per step 2 ms host gap, 5 ms GEMM,
    # 3 ms all-reduce of which 1 ms overlaps the GEMM.
    write_job(tmp_path, {0: step_events(0, 4, host_ms=2, compute_ms=5, wait_ms=0, overlap_ms=1)})
    events, item = parse_one(tmp_path / "traces" / "rank0.json")
    assert item.status == "parsed"
    summary = events.filter(pl.col("kind") == "trace.rank").row(0, named=True)
    assert (summary["rank"], summary["nranks"], summary["device"], summary["source"]) == (0, 1, 0, "kineto")
    figures = json.loads(summary["detail"])
    assert figures["steps"] == 3
    assert figures["compute_us"] == pytest.approx(15_000, abs=1)
    assert figures["nccl_us"] == pytest.approx(9_000, abs=1)
    assert figures["overlap_us"] == pytest.approx(3_000, abs=1)
    assert figures["exposed_us"] == pytest.approx(6_000, abs=1)
    # idle: the 2 ms data loading gap of every step plus the 0.1 ms step tail
    assert figures["idle_us"] == pytest.approx(3 * 2_100, abs=2)
    assert figures["gaps"] == 3
    assert summary["ts"].year == 2026  # baseTimeNanoseconds + ts
    collective = events.filter(pl.col("kind") == "trace.collective").row(0, named=True)
    assert collective["op"] == "AllReduce"
    assert json.loads(collective["detail"])["count"] == 3
    steps = events.filter(pl.col("kind") == "trace.step")
    assert steps.get_column("seq").to_list() == [11, 12, 13]
    gaps = events.filter(pl.col("kind") == "trace.gap")
    assert gaps.height == 3 and all("data_loader" in m for m in gaps.get_column("message"))


def test_small_blocks_compact_layout_and_gzip_give_the_same_timeline(tmp_path):
    events = step_events(1, 5, host_ms=1, compute_ms=3, wait_ms=4)
    reference = kineto_text(1, 2, events)
    kept_big, meta = read_kineto(io.BytesIO(reference.encode()))
    kept_small, _ = read_kineto(io.BytesIO(reference.encode()), block_bytes=1000)
    assert kept_big.equals(kept_small)
    assert meta.header["distributedInfo"]["rank"] == 1
    assert meta.trailer["traceName"] == "/tmp/rank.json"
    kept_compact, _ = read_kineto(io.BytesIO(kineto_text(1, 2, events, compact=True).encode()), block_bytes=700)
    assert kept_compact.equals(kept_big)
    write_job(tmp_path, {1: events}, gz=True)
    parsed, item = parse_one(tmp_path / "traces" / "rank1.json.gz")
    assert item.format == "kineto_trace" and item.status == "parsed"
    assert parsed.filter(pl.col("kind") == "trace.rank").get_column("rank").to_list() == [1]


def test_separators_inside_strings_and_nested_values_fall_back_to_exact_decoding():
    events = step_events(0, 3, host_ms=1, compute_ms=3, wait_ms=0)
    events.insert(1, {"ph": "X", "cat": "cpu_op", "name": "odd}, {name", "ts": 5.0, "dur": 1.0,
                      "args": {"nested": [{"a": 1}, {"b": 2}]}})
    events.insert(2, {"ph": "i", "cat": "kernel", "name": "instant", "ts": "not a number", "args": {"device": "gpu"}})
    text = kineto_text(0, 1, events, compact=True)
    kept, meta = read_kineto(io.BytesIO(text.encode()), block_bytes=300)
    assert meta.slow_blocks > 0
    expected = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "user_annotation")]
    assert kept.height == len(expected)
    assert kept.get_column("name").cast(pl.String).to_list() == [e["name"] for e in expected]


def test_truncated_and_non_trace_documents_are_reported_not_raised(tmp_path):
    text = kineto_text(0, 1, step_events(0, 3, host_ms=1, compute_ms=3, wait_ms=0))
    with pytest.raises(TraceFormatError):
        read_kineto(io.BytesIO(text[: len(text) // 2].encode()))
    (tmp_path / "rank0.json").write_text(text[: len(text) // 2])
    events, item = parse_one(tmp_path / "rank0.json")
    assert events.height == 0 and item.status == "error" and "truncated" in item.reason


def test_cpu_only_trace_says_why_it_has_no_timeline(tmp_path):
    cpu = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0, "args": {}}]
    (tmp_path / "cpu.json").write_text(kineto_text(0, 1, cpu))
    events, item = parse_one(tmp_path / "cpu.json")
    assert events.height == 0 and "without GPU activity" in item.reason


def test_recorded_slow_rank_traces():
    job = RECORDED / "slow_rank_traced" / "job" / "traces"
    per_rank = {}
    for rank in (0, 1):
        events, item = parse_one(job / f"rank{rank}.json")
        assert item.status == "parsed", item.reason
        assert events.height < 40  # compact: no event per kernel
        per_rank[rank] = json.loads(events.filter(pl.col("kind") == "trace.rank").get_column("detail")[0])
    # Rank 0 waits in the all-reduce for rank 1, which computes and idles (data loading) instead.
    assert per_rank[0]["nccl_us"] > 10 * per_rank[1]["nccl_us"]
    assert per_rank[1]["compute_us"] > 5 * per_rank[0]["compute_us"]
    assert per_rank[1]["idle_us"] > 5 * per_rank[0]["idle_us"]


def test_benchmark_trace_is_read_completely(tmp_path):
    from bench.bench_traces import write_trace

    counts = write_trace(tmp_path / "rank0.json", 3 << 20)
    with open(tmp_path / "rank0.json", "rb") as fh:
        kept, meta = read_kineto(fh, block_bytes=256 << 10)
    assert meta.slow_blocks == 0
    kinds = dict(kept.group_by("kind").len().iter_rows())
    assert kinds["kernel"] + kinds["memcpy"] == counts["kernels"]
    assert kinds["mark"] == 2 * counts["steps"]  # data_loader and ProfilerStep#N of every step
    assert "api" not in kinds  # cudaLaunchKernel is not an allocator call


def _dur_ms(text: str) -> float:
    return float(re.search(r"dur=([\d.]+) ms", text).group(1))


def _cited(text: str, line: int) -> dict:
    """The traceEvents entry a trace event's `line` points at (1-based)."""
    return json.loads(text)["traceEvents"][line - 1]


@pytest.mark.parametrize("layout", ["kineto", "compact-small-blocks", "slow-path"])
def test_every_trace_event_cites_one_trace_entry_by_position_name_ts_and_duration(tmp_path, layout):
    events = step_events(0, 4, host_ms=2, compute_ms=5, wait_ms=6)
    if layout == "slow-path":  # a separator inside a string sends blocks through the exact decoder
        events.insert(3, {"ph": "X", "cat": "cpu_op", "name": "odd}, {name", "ts": 5.0, "dur": 1.0})
    text = kineto_text(0, 1, events, compact=layout != "kineto")
    kept, meta = read_kineto(io.BytesIO(text.encode()), block_bytes=300 if layout != "kineto" else 1 << 20)
    assert (meta.slow_blocks > 0) == (layout == "slow-path")
    entries = json.loads(text)["traceEvents"]
    assert kept.get_column("name").cast(pl.String).to_list() == [entries[i]["name"] for i in kept.get_column("index")]
    path = tmp_path / "traces" / "rank0.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    parsed, _ = parse_one(path)
    assert parsed.height and (parsed.get_column("line") > 0).all()
    for row in parsed.iter_rows(named=True):
        entry = _cited(text, row["line"])
        ts = float(re.search(r"ts=([\d.]+) us", row["text"]).group(1))
        assert row["text"].startswith("rank 0 ")
        if row["kind"] == "trace.gap":  # the gap's start and length; it cites the kernel that ends it
            assert entry["cat"] == "kernel" and entry["ts"] == pytest.approx(ts + _dur_ms(row["text"]) * 1000, abs=0.01)
        else:
            assert ts == entry["ts"]
        if row["kind"] == "trace.step":
            assert entry["name"] == f"ProfilerStep#{row['seq']}" and entry["name"] in row["text"]
            assert _dur_ms(row["text"]) == pytest.approx(entry["dur"] / 1000, abs=0.05)
        elif row["kind"] == "trace.collective":  # the longest NCCL kernel, with its step
            assert entry["name"] == NCCL_NAME and " ms in ProfilerStep#" in row["text"]
            assert _dur_ms(row["text"]) == pytest.approx(entry["dur"] / 1000, abs=0.001)
        elif row["kind"] == "trace.gap":
            assert "in ProfilerStep#" in row["text"] and "data_loader" in row["text"]
        else:  # the first analysed step (the first of four is left out)
            assert row["kind"] == "trace.rank" and entry["name"] == "ProfilerStep#11"
            assert "ProfilerStep#11..ProfilerStep#13" in row["text"]
