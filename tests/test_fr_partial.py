"""The partial decode of Flight Recorder dumps (analyzer/parse/fr_partial.py) gives the events of the
full decode, on every recorded dump of the repository (as recorded, and grown to a full ring
buffer) and on frgen dump sets of several sizes, versions, writers and process-group layouts; and
every surprise falls back to the full load, with the full load's result or error."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyzer import parse
from analyzer.io import InputFile
from analyzer.io.safepickle import load_untrusted_pickle
from analyzer.parse import fr_partial
from analyzer.parse.flight_recorder import ENTRIES_KEPT_PER_PG, flight_recorder_events
from tests.frgen import DumpFactory, DumpSetSpec, torch_pickle

REPO = Path(__file__).resolve().parents[1]
KEEP = ENTRIES_KEPT_PER_PG


def _recorded_dumps() -> list[Path]:
    """Every Flight Recorder pickle under fixtures/ (found by content, whatever its name)."""
    found = []
    for path in sorted((REPO / "fixtures").rglob("*")):
        if not path.is_file() or path.stat().st_size > 64 << 20:
            continue
        with path.open("rb") as fh:
            head = fh.read(2)
        if head == b"\x80\x02" and b"X\x07\x00\x00\x00entries" in path.read_bytes():
            found.append(path)
    return found


RECORDED = _recorded_dumps()


def test_the_repository_has_recorded_dumps():
    assert len(RECORDED) >= 10, RECORDED


def _item(data: bytes, rank: int = 3) -> InputFile:
    return InputFile(path=f"fr/nccl_trace_rank_{rank}", format="pickle", size=len(data), _payload=data)


def _full_events(data: bytes, rank: int = 3) -> pl.DataFrame:
    """The events of the full restricted load, bypassing the partial decode."""
    return flight_recorder_events(load_untrusted_pickle(data), file=f"fr/nccl_trace_rank_{rank}", rank=rank)[0]


def _parsed(data: bytes, rank: int = 3) -> tuple[pl.DataFrame, InputFile]:
    item = _item(data, rank)
    return parse.parse_input(item), item


def _full_parsed(data: bytes, monkeypatch, rank: int = 3) -> tuple[pl.DataFrame, InputFile]:
    with monkeypatch.context() as m:
        m.setattr(fr_partial, "decode_recent", lambda data, keep: None)
        return _parsed(data, rank)


def _assert_same_as_full(data: bytes, monkeypatch) -> None:
    events, item = _parsed(data)
    full, full_item = _full_parsed(data, monkeypatch)
    assert_frame_equal(events, full)
    assert (item.status, item.reason, item.ranks) == (full_item.status, full_item.reason, full_item.ranks)


def _grown(doc: dict, entries: int) -> dict:
    """A recorded dump's ring buffer filled to `entries`: its entries repeated in order, renumbered
    as the recorder numbers them (record_id and seq ids keep counting), all but the last lap
    completed. Lists are new per entry and frame dicts shared, as the C++ recorder writes them."""
    source = doc["entries"]
    seq_step = max(e["collective_seq_id"] for e in source)
    grown = []
    for index in range(entries):
        lap, position = divmod(index, len(source))
        entry = dict(source[position])
        for key in ("input_sizes", "output_sizes"):
            entry[key] = [list(shape) for shape in entry[key]]
        for key in ("input_dtypes", "output_dtypes", "frames"):
            entry[key] = list(entry[key])
        entry["record_id"] = index
        entry["collective_seq_id"] += lap * seq_step
        entry["op_id"] += lap * seq_step
        if index < entries - len(source):
            entry["state"], entry["retired"] = "completed", True
        grown.append(entry)
    return {**doc, "entries": grown}


# --- equality: recorded dumps -------------------------------------------------------------------


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(REPO)))
def test_recorded_dump_as_recorded(path, monkeypatch):
    data = path.read_bytes()
    _assert_same_as_full(data, monkeypatch)
    # A dump this small is not worth cutting: the partial decode declines it.
    assert fr_partial.decode_recent(data, KEEP) is None


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(REPO)))
def test_recorded_dump_grown_to_a_full_ring_buffer(path, monkeypatch):
    data = torch_pickle(_grown(pickle.loads(path.read_bytes()), 2000))
    assert fr_partial.decode_recent(data, KEEP) is not None
    _assert_same_as_full(data, monkeypatch)
    events, _ = _parsed(data)
    assert events.filter(pl.col("kind") == "fr.entry").height <= KEEP * 2  # at most two PGs in these recordings


def test_the_torch_writer_lays_out_the_recorded_dumps_byte_for_byte():
    for path in RECORDED:
        data = path.read_bytes()
        assert torch_pickle(pickle.loads(data)) == data, path


# --- equality: frgen dump sets ------------------------------------------------------------------


SPECS = [
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, culprit_mode="behind"),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, culprit_mode="behind", writer="torch"),
    DumpSetSpec(world=8, entries=5000, steps=1900, culprit=2, culprit_mode="barrier", writer="torch"),
    DumpSetSpec(world=8, entries=300, steps=200, culprit=2, culprit_mode="barrier"),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=1, side_group=(0, 1, 2, 3)),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=1, side_group=(0, 1, 2, 3), writer="torch"),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, version="2.9", writer="torch"),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, version="2.5"),
    DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, version="2.3", writer="torch"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.entries}x{s.version}-{s.writer}-{s.culprit_mode}-pgs{1 + bool(s.side_group)}")
@pytest.mark.parametrize("rank", [0, 1, 5, 7])
def test_frgen_dump(spec, rank, monkeypatch):
    from tests.frgen import WRITERS

    data = WRITERS[spec.writer](DumpFactory(spec).dump(rank))
    recent = fr_partial.decode_recent(data, KEEP)
    assert recent is not None
    assert recent.total == spec.entries
    assert_frame_equal(_parsed(data, rank)[0], _full_events(data, rank))
    _assert_same_as_full(data, monkeypatch)


def test_side_group_widens_the_tail_to_the_groups_newest_entries():
    """In the side group one entry in four is pg 1: its newest 64 reach far past the last 64 entries."""
    spec = DumpSetSpec(world=8, entries=2000, steps=900, culprit=1, side_group=(0, 1, 2, 3))
    recent = fr_partial.decode_recent(pickle.dumps(DumpFactory(spec).dump(0), protocol=2), KEEP)
    tail = recent.doc["entries"][recent.prefix :]
    assert sum(e["process_group"][0] == "1" for e in tail) >= KEEP
    assert len(tail) > 3 * KEEP


def test_version_without_process_groups_is_read_in_full(monkeypatch):
    spec = DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, version="1.5", writer="torch")
    data = torch_pickle(DumpFactory(spec).dump(2))
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


# --- fallbacks ----------------------------------------------------------------------------------


def _big(writer: str = "torch", rank: int = 2, **changes) -> dict:
    spec = DumpSetSpec(world=8, entries=2000, steps=900, culprit=5, writer=writer, **changes)
    return DumpFactory(spec).dump(rank)


def _bytes(doc: object, writer: str) -> bytes:
    return torch_pickle(doc) if writer == "torch" else pickle.dumps(doc, protocol=2)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_truncated_dump_falls_back_and_reports_the_full_loads_error(writer, monkeypatch):
    whole = _bytes(_big(writer), writer)
    for cut in (len(whole) - 1, len(whole) - 40, len(whole) * 2 // 3):
        data = whole[:cut]
        assert fr_partial.decode_recent(data, KEEP) is None
        events, item = _parsed(data)
        _, full_item = _full_parsed(data, monkeypatch)
        assert events.height == 0 and item.status == "error" == full_item.status
        assert item.reason == full_item.reason and "truncated" in item.reason


def _layout_mark(data: bytes) -> bytes:
    layout = fr_partial._layout(data)
    assert layout is not None
    return layout.mark


@pytest.mark.parametrize("writer", ["torch", "python"])
@pytest.mark.parametrize("where", [1950, 1990, 1999, 5, fr_partial.PREFIX_STEPS[0] - 1])
def test_signature_inside_a_string_where_the_cut_is_searched_falls_back(writer, where, monkeypatch):
    doc = _big(writer)
    mark = _layout_mark(_bytes(doc, writer)).decode("latin-1")
    # A frame name holding an entry's opening bytes, in the tail or the first entries.
    doc["entries"][where]["frames"] = [{"name": "}" + mark + "]", "filename": "x.py", "line": 1}]
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_signature_inside_a_string_of_the_cut_out_part_is_harmless(writer, monkeypatch):
    """Nothing is cut there: the decode holds, and equals the full one."""
    doc = _big(writer)
    mark = _layout_mark(_bytes(doc, writer)).decode("latin-1")
    doc["entries"][1000]["frames"] = [{"name": "}" + mark + "]", "filename": "x.py", "line": 1}]
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is not None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_a_whole_entry_inside_a_string_falls_back(writer, monkeypatch):
    """A string holding the bytes of a complete entry, where the last entries are searched for."""
    doc = _big(writer)
    clean = _bytes(doc, writer)
    layout = fr_partial._layout(clean)
    last = fr_partial._entry_from_end(clean, layout, 1)
    fake = clean[last:-3].decode("latin-1")  # the last entry, up to the closing APPENDS/SETITEMS/STOP
    doc["entries"][-1]["thread_name"] = fake
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_dump_with_few_entries_is_read_in_full(writer, monkeypatch):
    doc = _big(writer)
    doc["entries"] = doc["entries"][-(fr_partial.PREFIX_STEPS[0] + KEEP) :]
    doc["pg_config"]["0"]["ranks"] = str(list(range(20000)))  # big enough to be tried
    data = _bytes(doc, writer)
    assert len(data) >= fr_partial.MIN_BYTES
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_entries_missing_from_the_middle_fall_back(writer, monkeypatch):
    """Fewer entries than the record ids say (a gap): the cut could not be proven, full load."""
    doc = _big(writer)
    del doc["entries"][700:705]
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_non_dict_top_level_falls_back(writer, monkeypatch):
    entries = _big(writer)["entries"]
    for doc in (entries, ("entries", entries), [{"entries": entries}]):
        data = _bytes(doc, writer)
        assert fr_partial.decode_recent(data, KEEP) is None
        _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
@pytest.mark.parametrize("version", ["9.9", "1.5", None])
def test_unknown_version_falls_back(writer, version, monkeypatch):
    doc = _big(writer)
    doc["version"] = version
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_a_tail_referring_past_the_first_prefix_is_read_with_the_next(writer, monkeypatch):
    """An op name first written after the first PREFIX_STEPS[0] entries and used again in the tail:
    the first prefix cannot define it, the next one does (no full load)."""
    doc = _big(writer)
    first = fr_partial.PREFIX_STEPS[0] + 4
    assert first < fr_partial.PREFIX_STEPS[1]
    for index in (first, 1990):
        doc["entries"][index]["profiling_name"] = "nccl:all_to_all"
    data = _bytes(doc, writer)
    recent = fr_partial.decode_recent(data, KEEP)
    assert recent is not None and recent.prefix == fr_partial.PREFIX_STEPS[1]
    _assert_same_as_full(data, monkeypatch)


def test_memo_reference_into_the_cut_out_part_falls_back(monkeypatch):
    """A string first written in the middle and used again in the tail: its GET has nothing to read."""
    doc = _big("torch")
    for index in (900, 1990):
        doc["entries"][index]["profiling_name"] = "nccl:all_to_all"
    data = torch_pickle(doc)
    assert fr_partial.decode_recent(data, KEEP) is None
    _assert_same_as_full(data, monkeypatch)


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_process_group_only_in_the_cut_out_part_falls_back(writer, monkeypatch):
    doc = _big(writer)
    doc["pg_config"]["7"] = {"name": "7", "desc": "undefined", "ranks": "[0, 1]"}
    for index in range(600, 610):
        doc["entries"][index]["process_group"] = ("7", "undefined")
    data = _bytes(doc, writer)
    assert fr_partial.decode_recent(data, KEEP) is None
    events, _ = _parsed(data)
    assert events.filter((pl.col("kind") == "fr.entry") & (pl.col("pg") == "7")).height == 10
    _assert_same_as_full(data, monkeypatch)


def test_refused_global_in_the_tail_is_the_full_loads_refusal(monkeypatch):
    data = bytearray(torch_pickle(_big("torch")))
    # Overwrite the tail's last entry's `state` string value with a GLOBAL opcode of the same length.
    at = data.rfind(b"X\x09\x00\x00\x00scheduled")
    assert at > 0
    data[at : at + 14] = b"cos\nsystem\nNNN"  # GLOBAL os.system, padded to the string's 14 bytes
    data = bytes(data)
    assert fr_partial.decode_recent(data, KEEP) is None
    events, item = _parsed(data)
    _, full_item = _full_parsed(data, monkeypatch)
    assert events.height == 0 and (item.status, item.reason) == (full_item.status, full_item.reason)


def test_pool_chunk_builds_the_events_of_the_sequential_parse(tmp_path):
    """A worker's chunk (one frame for all its dumps, a memory snapshot among them) equals the
    events of the same inputs parsed one by one."""
    spec = DumpSetSpec(world=6, entries=2000, steps=900, culprit=4, side_group=(0, 1))
    factory = DumpFactory(spec)
    payloads = [torch_pickle(factory.dump(rank)) for rank in range(6)]
    payloads.insert(3, pickle.dumps({"segments": [], "device_traces": []}, protocol=2))
    payloads.insert(5, b"\x80\x02garbage")

    def items() -> list[InputFile]:
        return [InputFile(path=f"fr/nccl_trace_rank_{i}", format="pickle", size=len(p), _payload=p) for i, p in enumerate(payloads)]

    chunk = items()
    events, states = parse._parse_chunk(chunk)
    one_by_one = items()
    sequential = pl.concat([parse.parse_input(i) for i in one_by_one], how="vertical")
    assert_frame_equal(events, sequential)
    assert states == [(i.status, i.reason, i.format, i.ranks, i.lines, i.unparsed_lines) for i in one_by_one]
    assert [s[0] for s in states].count("error") == 1 and states[3][2] == "memory_snapshot"
