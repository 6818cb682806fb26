"""Flight Recorder dumps (pickle and JSON, every layout since PyTorch 2.2) -> canonical events."""

from __future__ import annotations

import copy
import json
import os
import pickle
from pathlib import Path

import polars as pl
import pytest

from analyzer.io import InputFile, discover
from analyzer.events import EVENT_COLUMNS, EVENT_SCHEMA
from analyzer.io.sniff import rank_from_name
from analyzer.parse.flight_recorder import ENTRIES_KEPT_PER_PG, flight_recorder_events, parse_flight_recorder

SHARED = Path(__file__).resolve().parents[2] / "shared"
FR_DIR = SHARED / "formats-samples" / "flight-recorder"


def _sample(relative: str) -> Path:
    path = FR_DIR / relative
    if not path.exists():
        pytest.skip("shared/formats-samples not available")
    return path


def _doc(relative: str = "api-dump/_dump_nccl_trace_rank0.pkl") -> dict:
    return pickle.loads(_sample(relative).read_bytes())  # our captured sample: trusted in tests


def _item(name: str, data: bytes, fmt: str | None = None) -> InputFile:
    if fmt is None:
        fmt = "pickle" if data[:1] == b"\x80" else "flight_recorder_json"
    return InputFile(name, format=fmt, size=len(data), _payload=data)


def _check_schema(events: pl.DataFrame) -> None:
    assert events.columns == EVENT_COLUMNS
    assert dict(events.schema) == EVENT_SCHEMA


# --- real samples ---------------------------------------------------------------------------------


def test_timeout_dump_rank0_pickle():
    path = _sample("timeout-dump_TORCH_NCCL_DUMP_ON_TIMEOUT/nccl_trace_rank_0")
    item = _item(str(path.relative_to(FR_DIR)), path.read_bytes())
    events, info = parse_flight_recorder(item)
    _check_schema(events)
    assert info["status"] == "parsed" and info["version"] == "2.10" and info["comm_lib_version"] == "2.28.9"
    assert info["rank"] == 0 and info["entries"] == 2 and info["pgs"] == ["0"]
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert entries.get_column("seq").to_list() == [1, 2]
    assert entries.get_column("op").to_list() == ["ALLREDUCE", "ALLREDUCE"]
    assert entries.get_column("code").to_list() == ["completed", "scheduled"]
    assert entries.get_column("numel_in").to_list() == [1024, 1024]
    assert entries.get_column("timeout_ms").to_list() == [20000, 20000]
    assert entries.get_column("pg").to_list() == ["0", "0"]
    assert set(entries.get_column("source").to_list()) == {"flight_recorder"}
    assert entries.get_column("rank").to_list() == [0, 0]
    assert entries.get_column("file").to_list() == [item.path] * 2
    last = entries.row(1, named=True)
    assert last["message"].startswith("pg 0 #2 ALLREDUCE state=scheduled in=[[1024]] Float")
    assert "nccl:all_reduce" in last["message"]
    assert last["text"] == last["message"], "evidence quotes the record, not the bare profiling name"
    assert last["detail"].startswith("all_reduce (/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:3068) <- wrapper")
    assert last["detail"].endswith("<module> (/home/user/w.py:54)")
    assert last["ts_source"] == "flight_recorder"
    assert last["ts"].year == 2026 and str(last["ts"].tzinfo) == "UTC"
    status = events.filter(pl.col("kind") == "fr.pg_status").row(0, named=True)
    assert (status["pg"], status["last_enqueued"], status["last_completed"]) == ("0", 2, 1)
    assert status["ranks_ref"] == [0, 1] and status["nranks"] == 2 and status["pg_rank"] == 0


def test_api_dump_ops_p2p_barrier_and_subgroup():
    path = _sample("api-dump/_dump_nccl_trace_rank0.pkl")
    events, info = parse_flight_recorder(_item("api-dump/_dump_nccl_trace_rank0.pkl", path.read_bytes()))
    assert info["entries"] == 8 and info["pgs"] == ["0", "1"]
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert entries.get_column("op").to_list() == [
        "ALLREDUCE", "BROADCAST", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "ALLTOALL", "SEND", "BARRIER", "ALLREDUCE",
    ]
    assert entries.get_column("numel_out").to_list()[2:4] == [2048, 512]
    send = entries.row(5, named=True)
    assert send["op"].lower().startswith("send") and send["seq"] == 1  # the p2p counter, not collective #5
    assert send["peer"] == "rank 1" and "nccl:send 0->1" in send["message"]
    barrier = entries.row(6, named=True)
    assert barrier["seq"] == 6 and barrier["numel_in"] == 1 and "all_reduce_barrier" in barrier["message"]
    assert entries.row(7, named=True)["pg"] == "1"
    status = events.filter(pl.col("kind") == "fr.pg_status").sort("pg")
    assert status.get_column("last_enqueued").to_list() == [6, 1]
    assert status.get_column("last_completed").to_list() == [6, None]  # -1 = nothing completed yet


def test_json_dump_matches_pickle_dump():
    pickle_path = _sample("api-dump/_dump_nccl_trace_rank1.pkl")
    json_path = _sample("api-dump/_dump_nccl_trace_json_rank1.json")
    from_pickle, _ = parse_flight_recorder(_item("_dump_nccl_trace_rank1.pkl", pickle_path.read_bytes()))
    from_json, info = parse_flight_recorder(_item("_dump_nccl_trace_json_rank1.json", json_path.read_bytes()))
    _check_schema(from_json)
    assert info["rank"] == 1 and info["status"] == "parsed"
    identity = ["kind", "pg", "seq", "op", "numel_in", "numel_out", "code", "rank"]
    assert from_json.select(identity).to_dicts() == from_pickle.select(identity).to_dicts()
    assert from_json.filter(pl.col("kind") == "fr.entry").get_column("detail").null_count() == 8  # no frames in JSON


def test_discovered_samples_parse_with_their_rank_hints():
    _sample("api-dump")
    for item in discover(FR_DIR):
        if item.format not in ("pickle", "flight_recorder_json"):
            continue
        events, info = parse_flight_recorder(item)
        assert info["status"] == "parsed", (item.path, info)
        assert events.get_column("rank").unique().to_list() == [item.rank_hint]


# --- layouts of every FR version ------------------------------------------------------------------


def _as_bare_list(doc: dict) -> list:
    """PyTorch 2.2 (early): a bare list, seq_id, time_created_us, no pg_config/status."""
    out = []
    for entry in doc["entries"]:
        old = {k: entry[k] for k in ("pg_id", "profiling_name", "input_sizes", "output_sizes", "state", "frames")}
        old["seq_id"] = entry["collective_seq_id"]
        old["time_created_us"] = entry["time_created_ns"] // 1000
        out.append(old)
    return out


def _as_v1(doc: dict, version: str = "1.1") -> dict:
    entries = []
    for entry in doc["entries"]:
        e = {k: v for k, v in entry.items() if k not in ("collective_seq_id", "p2p_seq_id", "process_group", "timeout_ms", "is_p2p", "thread_id", "thread_name")}
        e["seq_id"] = entry["collective_seq_id"]
        e["time_discovered_started_ns"] = None
        entries.append(e)
    out = {"version": version, "entries": entries}
    if version >= "1.4":
        out["pg_config"] = doc["pg_config"]
    return out


def _as_v2(doc: dict, version: str = "2.9") -> dict:
    out = copy.deepcopy(doc)
    out["version"] = version
    out["nccl_version"] = out.pop("comm_lib_version")
    for entry in out["entries"]:
        entry.pop("thread_id"), entry.pop("thread_name")
        if version < "2.4":
            entry.pop("timeout_ms"), entry.pop("is_p2p")
        entry["process_group"] = list(entry["process_group"])
    return out


def test_bare_list_layout():
    doc = _doc()
    events, info = flight_recorder_events(_as_bare_list(doc), file="nccl_trace_rank_0", rank=0)
    _check_schema(events)
    assert info["version"].startswith("pre-1.0") and info["entries"] == 8
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    # Without is_p2p or p2p_seq_id the send keeps its seq_id; it is still recognised as p2p by name.
    assert entries.get_column("op").to_list()[5] == "SEND"
    assert entries.get_column("seq").to_list()[:5] == [1, 2, 3, 4, 5]
    original = doc["entries"][0]["time_created_ns"] // 1000
    assert entries.get_column("ts").dt.epoch("us").to_list()[0] == original
    assert entries.get_column("pg").to_list()[-1] == "1"  # pg_id stands in for the PG name
    assert events.filter(pl.col("kind") == "fr.pg_status").height == 0


@pytest.mark.parametrize("version", ["1.1", "1.5"])
def test_v1_layouts(version):
    events, info = flight_recorder_events(_as_v1(_doc(), version), file="x_rank_0", rank=0)
    assert info["version"] == version
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert entries.get_column("seq").to_list()[:5] == [1, 2, 3, 4, 5]
    assert entries.get_column("timeout_ms").null_count() == 8
    status = events.filter(pl.col("kind") == "fr.pg_status")
    assert status.height == (2 if version == "1.5" else 0)
    if version == "1.5":
        assert status.get_column("last_enqueued").null_count() == 2  # pg_config but no pg_status yet
        assert status.get_column("ranks_ref").to_list() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("version", ["2.2", "2.5", "2.9"])
def test_v2_layouts_with_nccl_version_and_list_process_group(version):
    events, info = flight_recorder_events(_as_v2(_doc(), version), file="x", rank=0)
    assert info["version"] == version and info["comm_lib_version"] == "2.28.9"
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert entries.get_column("pg").to_list() == ["0"] * 7 + ["1"]
    assert entries.get_column("seq").to_list()[5] == 1  # p2p_seq_id
    assert (entries.get_column("timeout_ms").null_count() == 8) == (version < "2.4")


def test_json_strings_in_pg_status_and_ranks_and_zero_timestamps():
    doc = _doc()
    doc["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in doc["pg_status"].items()}
    for entry in doc["entries"]:
        entry["process_group"] = list(entry["process_group"])
        entry["time_discovered_started_ns"] = 0
    doc["entries"][0]["time_created_ns"] = 0
    doc["entries"][1]["time_created_ns"] = None
    data = json.dumps(doc).encode()
    events, info = parse_flight_recorder(_item("nccl_trace_rank_0.json", data, "flight_recorder_json"))
    assert info["status"] == "parsed"
    status = events.filter(pl.col("kind") == "fr.pg_status").sort("pg")
    assert status.get_column("last_enqueued").to_list() == [6, 1]
    assert status.get_column("last_completed").to_list() == [6, None]
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert entries.get_column("ts").to_list()[:2] == [None, None]  # 0 and None both mean unknown
    assert entries.get_column("ts_source").to_list()[:3] == [None, None, "flight_recorder"]


def test_tutorial_json_with_python_tuple():
    text = (
        '{"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},'
        ' "pg_status": {"0": {"last_enqueued_collective": 2, "last_started_collective": -1, "last_completed_collective": 2}},'
        ' "entries": [{"frames": [{"name": "test_short_pickle", "filename": "test_c10d_nccl.py", "line": 3647}],'
        ' "record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0,'
        ' "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 1724779239936775119,'
        ' "input_sizes": [[3, 4]], "input_dtypes": ["Float"], "output_sizes": [[3, 4]], "output_dtypes": ["Float"],'
        ' "state": "completed", "time_discovered_started_ns": null, "time_discovered_completed_ns": 1724779239975811724,'
        ' "retired": true, "timeout_ms": 600000, "is_p2p": false}]}'
    )
    events, info = parse_flight_recorder(_item("trace_rank_1.json", text.encode(), "flight_recorder_json"))
    assert info["status"] == "parsed" and info["rank"] == 1
    entry = events.filter(pl.col("kind") == "fr.entry").row(0, named=True)
    assert (entry["pg"], entry["seq"], entry["op"], entry["numel_in"]) == ("0", 1, "ALLREDUCE", 12)
    assert entry["detail"] == "test_short_pickle (test_c10d_nccl.py:3647)"
    assert "in=[[3,4]] Float" in entry["message"]


def test_op_name_mapping():
    doc = _doc()
    names = ["nccl:all_gather", "nccl:reduce_scatter", "nccl:reduce", "nccl:gather", "nccl:scatter",
             "nccl:allreduce_coalesced", "nccl:coalesced", "gloo:all_reduce", "nccl:recv 1<-0", "xccl:frobnicate"]
    entries = []
    for i, name in enumerate(names):
        entry = dict(doc["entries"][0], profiling_name=name, collective_seq_id=i + 1, record_id=i)
        entry["is_p2p"] = name.startswith("nccl:recv")
        entries.append(entry)
    doc["entries"] = entries
    events, _ = flight_recorder_events(doc, file="x", rank=1)
    ops = events.filter(pl.col("kind") == "fr.entry").sort("line").get_column("op").to_list()
    assert ops == ["ALLGATHER", "REDUCE_SCATTER", "REDUCE", "GATHER", "SCATTER", "ALLREDUCE_COALESCED", "COALESCED",
                   "ALLREDUCE", "RECV", "FROBNICATE"]
    recv = events.filter(pl.col("op") == "RECV").row(0, named=True)
    assert recv["peer"] == "rank 0" and recv["pg_rank"] == 1


def test_malformed_entries_do_not_abort_the_file():
    doc = _doc()
    doc["entries"][0]["input_sizes"] = "garbage"
    doc["entries"][1]["frames"] = [{"name": "f"}]  # no filename / line
    doc["entries"][2]["input_dtypes"] = None
    doc["entries"][3]["collective_seq_id"] = "7"
    doc["entries"].append("not a dict")
    events, info = flight_recorder_events(doc, file="x", rank=0)
    entries = events.filter(pl.col("kind") == "fr.entry").sort("line")
    assert info["entries"] == 8 and entries.height == 8
    assert entries.get_column("numel_in").to_list()[0] is None
    assert entries.get_column("detail").to_list()[1] == "f (None)"
    assert entries.get_column("seq").to_list()[3] == 7


# --- rank attribution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "rank"),
    [
        ("nccl_trace_rank_3", 3),
        ("node12_nccl_trace_rank_3", 3),
        ("dumps/node12-gpu4_nccl_trace_rank_1027", 1027),
        ("_dump_nccl_trace_rank0.pkl", 0),
        ("job.tar!traces/nccl_trace_rank_15", 15),
        ("fr/trace_7", 7),
        ("fr/trace_rank_5.pkl.gz", 5),
        ("frank/trace", None),
    ],
)
def test_rank_from_file_name(path, rank):
    assert rank_from_name(path, digits=True) == rank


def test_rank_hint_wins_and_missing_rank_is_partial():
    data = _sample("timeout-dump_TORCH_NCCL_DUMP_ON_TIMEOUT/nccl_trace_rank_1").read_bytes()
    item = _item("whatever_9", data)
    item.rank_hint = 1
    events, info = parse_flight_recorder(item)
    assert set(events.get_column("rank").to_list()) == {1}
    events, info = parse_flight_recorder(_item("dump.pkl", data))
    assert info["status"] == "partial" and "rank unknown" in info["reason"]
    assert events.get_column("rank").null_count() == events.height


# --- hostile and broken inputs --------------------------------------------------------------------


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_not_run(tmp_path):
    marker = tmp_path / "marker"
    doc = _doc()
    doc["entries"][0]["frames"] = _Evil(marker)
    events, info = parse_flight_recorder(_item("nccl_trace_rank_0", pickle.dumps(doc)))
    assert events.height == 0 and info["status"] == "error"
    assert "refused to load global" in info["reason"] and "system" in info["reason"]
    assert not marker.exists()


@pytest.mark.parametrize(
    "data",
    [b"\x80\x04\x95\x10\x00\x00", b'{"entries": [', b'{"hello": "world"}', b"[1, 2, 3", b"[1, 2, 3]", b"\x80\x04K\x05."],
    ids=["truncated-pickle", "truncated-json", "other-json", "broken-list", "list-of-ints", "pickled-int"],
)
def test_broken_dumps_are_errors_not_crashes(data):
    events, info = parse_flight_recorder(_item("nccl_trace_rank_2", data))
    assert events.height == 0 and info["status"] == "error" and info["reason"]


def test_truncated_real_dump():
    data = _sample("api-dump/_dump_nccl_trace_rank0.pkl").read_bytes()
    events, info = parse_flight_recorder(_item("nccl_trace_rank_0", data[: len(data) // 2]))
    assert events.height == 0 and info["status"] == "error" and "truncated" in info["reason"]


# --- scale ---------------------------------------------------------------------------------------


def test_full_ring_buffer_keeps_the_newest_entries_per_group():
    doc = _doc()
    template = doc["entries"][0]
    entries = []
    for i in range(2000):
        entry = copy.deepcopy(template)
        entry.update(record_id=i, collective_seq_id=i + 1, op_id=i + 1, time_created_ns=template["time_created_ns"] + i)
        entry["frames"] = entry["frames"] + [{"name": f"step_{i % 9}", "filename": "/x/train.py", "line": 10 + i % 9}] * 6
        entries.append(entry)
    side = copy.deepcopy(template)
    side.update(process_group=("1", "undefined"), collective_seq_id=7)
    entries.insert(10, side)  # an old entry of another group survives: it is that group's newest
    doc["entries"] = entries
    events, info = parse_flight_recorder(_item("nccl_trace_rank_42", pickle.dumps(doc, protocol=4)))
    kept = events.filter(pl.col("kind") == "fr.entry")
    assert info["entries"] == 2001 and info["entries_kept"] == ENTRIES_KEPT_PER_PG + 1
    assert kept.filter(pl.col("pg") == "0").get_column("seq").to_list() == list(range(2001 - ENTRIES_KEPT_PER_PG, 2001))
    assert kept.filter(pl.col("pg") == "1").get_column("seq").to_list() == [7]


def test_big_group_membership_is_carried_by_its_first_two_ranks_only():
    doc = _doc("timeout-dump_TORCH_NCCL_DUMP_ON_TIMEOUT/nccl_trace_rank_0")
    doc["pg_config"]["0"]["ranks"] = str(list(range(1000)))
    status = {}
    for rank in (0, 1, 500):
        events, _ = flight_recorder_events(doc, file=f"nccl_trace_rank_{rank}", rank=rank)
        status[rank] = events.filter(pl.col("kind") == "fr.pg_status").row(0, named=True)
    assert status[0]["ranks_ref"] == list(range(1000)) and status[1]["ranks_ref"] == list(range(1000))
    assert status[500]["ranks_ref"] is None
    assert {s["nranks"] for s in status.values()} == {1000}
    assert status[500]["pg_rank"] == 500 and "(1000 ranks)" in status[500]["message"]


# --- many dumps: parsed in worker processes, same result --------------------------------------------


def _many_dumps(root: Path, n: int) -> None:
    """n real recorded dumps (the rank is only in the name), a truncated one and a py-spy file among them."""
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "hang_uneven_data" / "job"
    data = [(recorded / "fr" / f"nccl_trace_rank_{r}").read_bytes() for r in (0, 1)]
    (root / "fr").mkdir(parents=True)
    for rank in range(n):
        (root / "fr" / f"nccl_trace_rank_{rank}").write_bytes(data[rank % 2])
    (root / "fr" / "nccl_trace_rank_77").write_bytes(data[1][: len(data[1]) // 2])  # cut mid-stream
    # A py-spy dump whose name sorts among the dumps: pooled runs are cut around it, order kept.
    (root / "fr" / "nccl_trace_rank_5_pyspy.txt").write_bytes((recorded / "pyspy" / "rank1.txt").read_bytes())


def _table(items) -> list[tuple]:
    return [(i.path, i.format, i.status, i.reason, i.ranks) for i in items]


def test_many_dumps_parse_the_same_in_worker_processes(tmp_path, monkeypatch):
    import analyzer.parse as parse

    _many_dumps(tmp_path, 150)
    sequential = discover(tmp_path)
    monkeypatch.setattr(parse, "POOL_MIN_DUMPS", 10**9)
    expected = parse.parse_inputs(sequential)
    pooled = discover(tmp_path)
    monkeypatch.setattr(parse, "POOL_MIN_DUMPS", 100)
    calls = []
    real_run_pool = parse._run_pool
    monkeypatch.setattr(parse, "_run_pool", lambda chunks, workers: calls.append(workers) or real_run_pool(chunks, workers))
    got = parse.parse_inputs(pooled)
    if parse._pool_workers(151) >= 2:
        assert calls and calls[0] >= 2  # the pool was used
    assert got.equals(expected)  # same events, same order: event ids do not depend on the cores
    assert _table(pooled) == _table(sequential)
    broken = next(i for i in pooled if i.path.endswith("_77"))
    assert broken.status == "error" and "truncated" in broken.reason
    stacks = next(i for i in pooled if i.path.endswith("_pyspy.txt"))
    assert stacks.format == "pyspy_text" and stacks.status == "parsed" and stacks.ranks == [5]


def test_a_pool_that_cannot_start_costs_time_not_inputs(tmp_path, monkeypatch):
    import concurrent.futures

    import analyzer.parse as parse

    _many_dumps(tmp_path, 130)
    expected_items = discover(tmp_path)
    monkeypatch.setattr(parse, "POOL_MIN_DUMPS", 10**9)
    expected = parse.parse_inputs(expected_items)

    def no_processes(*args, **kwargs):
        raise OSError("fork: Resource temporarily unavailable")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_processes)
    monkeypatch.setattr(parse, "POOL_MIN_DUMPS", 100)
    monkeypatch.setattr(parse, "_pool_workers", lambda n: 2)
    items = discover(tmp_path)
    assert parse.parse_inputs(items).equals(expected)
    assert _table(items) == _table(expected_items)
