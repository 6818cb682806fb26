"""Property-based fuzzing of every grammar and parser entry point (strategies: tests/fuzz_strategies.py).

The contract under test: a line-level entry point raises nothing but its own error type (Lark's
for the grammars, the loaders' ValueError subclasses for pickles and dumps), and a file-level
parse never raises at all, whatever the bytes: it records a status and a reason on the input.
CI runs a few dozen derandomized examples per property; `python -m tests.fuzz_long --examples N`
runs the same properties longer with random seeds.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from unittest import mock

import jsonschema
import polars as pl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from lark.exceptions import LarkError

import analyzer.io.inputs as discover_module
from analyzer.api import NothingToAnalyse, analyze
from analyzer.io import InputFile, discover, iter_text_chunks
from analyzer.events import EVENT_SCHEMA
from analyzer.parse import PARSERS, TEXT_FORMATS, parse_inputs
from analyzer.io.budget import BudgetExceeded
from analyzer.parse.flight_recorder import FlightRecorderError, decode_dump, flight_recorder_events
from analyzer.parse.grammars import GRAMMAR_STARTS, grammar, parse_body
from analyzer.parse.lines import MAX_LINE_CHARS, lines_frame_many, peel_prefixes
from analyzer.parse.structured import ErrorJsonError, parse_error_json
from analyzer.io.safepickle import CorruptPickleError, UnsafePickleError, load_untrusted_pickle
from tests import fuzz_strategies as fs
from tests.fuzz_strategies import FUZZ, FUZZ_SLOW

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
STATUSES = {"parsed", "partial", "skipped", "error"}
INT64 = (-(2**63), 2**63 - 1)
FORMATS = sorted({*PARSERS, *TEXT_FORMATS})


@pytest.fixture(autouse=True)
def _no_pickle_ran():
    fs.TRIPPED.clear()
    yield
    assert not fs.TRIPPED, "unpickling called a global: a hostile pickle would have run code"


# --- grammars -------------------------------------------------------------------------------------


def test_every_grammar_start_is_fuzzed():
    assert set(fs.seed_bodies()) == {(g, s) for g, starts in GRAMMAR_STARTS.items() for s in starts}


@FUZZ
@given(fs.grammar_body())
def test_grammar_raises_only_lark_errors(case):
    grammar_name, start, body = case
    try:
        result = grammar(grammar_name).parse(body, start=start)
    except LarkError:
        result = None
    assert result is None or isinstance(result, dict)
    fields = parse_body(grammar_name, start, body)
    assert fields is None or isinstance(fields, dict)


@FUZZ
@given(fs.grammar_body())
@example(("c10d", "work", "WorkNCCL(SeqNum=99999999999999999999999, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1)"))
def test_grammar_integers_fit_the_event_schema(case):
    fields = parse_body(*case) or {}
    for value in fields.values():
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, int) and not isinstance(number, bool):
                assert INT64[0] <= number <= INT64[1]


# --- line layer -----------------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.tuples(fs.log_document(), st.integers(1, 10**9)), min_size=1, max_size=4))
def test_line_layer_splits_like_python_and_never_raises(docs):
    chunks = [(text, f"f{index}.log", first) for index, (text, first) in enumerate(docs)]
    lines = lines_frame_many(chunks)
    for index, (text, file, first) in enumerate(chunks):
        mine = lines.filter(pl.col("file") == file)
        if index == 0 and text.startswith("\ufeff"):  # a BOM opening the batch is dropped: harmless
            text = text[1:]
        expected = (text if text.endswith("\n") else text + "\n").split("\n")[:-1]
        expected = [line.replace("\x1f", " ")[:MAX_LINE_CHARS].rstrip("\r") for line in expected]
        assert [line.rstrip("\r") for line in mine.get_column("text").to_list()] == expected  # CR: line ends
        assert mine.get_column("line").to_list() == list(range(first, first + len(expected)))
    peeled = peel_prefixes(lines)
    assert peeled.height == lines.height
    assert peeled.schema["pfx_rank"] == pl.Int64 and peeled.get_column("body").null_count() == 0


# --- reading bytes ----------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """Lines as a file holds them: a final newline ends the last line, it does not start another."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _item(data: bytes, fmt: str = "text", name: str = "rank3.log") -> InputFile:
    return InputFile(name, format=fmt, size=len(data), _payload=data)


@FUZZ
@given(fs.log_bytes(), st.integers(1, 300), st.integers(8, 200))
def test_text_reader_keeps_every_line_and_only_cuts_runaway_ones(data, chunk_bytes, cap):
    with mock.patch.object(discover_module, "MAX_LINE_CHARS_READ", cap):
        item = _item(data)
        chunks = list(iter_text_chunks(item, chunk_bytes=chunk_bytes))
    assert all(chunk.endswith("\n") for chunk in chunks[:-1])
    expected = _lines(data.decode("utf-8-sig", "replace").replace("\x00", ""))
    got = _lines("".join(chunks))
    assert len(got) == len(expected)
    for read, written in zip(got, expected):
        assert written.startswith(read) and (read == written or len(read) == cap)
    assert item.status in ("pending", "partial")


@FUZZ
@given(st.sampled_from(FORMATS), st.data())
def test_discovery_never_raises(fmt, data):
    payload = data.draw(fs.input_bytes(fmt))
    name = data.draw(st.sampled_from(("rank0.log", "x.log.gz", "nccl_trace_rank_1", "error.json", "a\udcff.log")))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / name).write_bytes(payload)  # "a\udcff.log": the byte 0xff, not UTF-8, in the name
        items = discover(tmp)
    assert len(items) == 1 and items[0].status in STATUSES | {"pending"}
    items[0].path.encode("utf-8")  # shown names are valid UTF-8 whatever the bytes on disk


# --- file level: never raises -------------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(FORMATS), st.data())
def test_file_level_parse_never_raises(fmt, data):
    """Any bytes under any format label (discover can be wrong): a status and a reason, no exception."""
    item = _item(data.draw(fs.input_bytes(fmt)), fmt, data.draw(st.sampled_from(("rank3.log", "nccl_trace_rank_2"))))
    events = parse_inputs([item])
    assert item.status in STATUSES
    assert item.status in ("parsed", "partial") or item.reason
    assert dict(events.schema) == EVENT_SCHEMA
    assert item.lines >= 0 and 0 <= item.unparsed_lines


@FUZZ
@given(fs.log_bytes(), st.data())
def test_a_bad_file_never_changes_another_files_events(bad, data):
    """Text files share parse batches: one file's content must not fail or alter its neighbour's."""
    good_bytes = data.draw(st.sampled_from(fs.seed_files()["text"]))
    alone = parse_inputs([_item(good_bytes, name="good.log")])
    good, other = _item(good_bytes, name="good.log"), _item(bad, name="bad.log")
    together = parse_inputs([other, good])
    assert good.status != "error"
    assert together.filter(pl.col("file") == "good.log").equals(alone)


def test_a_file_that_breaks_the_parser_fails_alone():
    """A parser exception on one file of a batch is retried file by file: only that file is marked."""
    from analyzer.parse import logtext

    real = logtext.parse_text_pieces

    def breaks_on_poison(pieces, year_hint):
        if any("POISON" in piece.text for piece in pieces):
            raise OverflowError("a parser bug")
        return real(pieces, year_hint)

    good_bytes = fs.seed_files()["text"][0]
    alone = parse_inputs([_item(good_bytes, name="good.log")])
    poisoned, good = _item(b"POISON\n", name="bad.log"), _item(good_bytes, name="good.log")
    with mock.patch.object(logtext, "parse_text_pieces", breaks_on_poison):
        together = parse_inputs([poisoned, good])
    assert (poisoned.status, poisoned.reason) == ("error", "could not parse: OverflowError: a parser bug")
    assert good.status == "parsed" and together.filter(pl.col("file") == "good.log").equals(alone)


def test_an_oversized_number_costs_only_its_own_line():
    line = ("[rank0]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum={}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 ms.\n")
    item = _item((line.format(7) + line.format("99999999999999999999999")).encode())
    events = parse_inputs([item])
    assert item.status == "parsed"
    assert events.filter(pl.col("kind") == "watchdog.timeout").get_column("seq").to_list() == [7, None]


def test_host_labels_survive_a_batch_mate_without_labels():
    good = b'c000001: FileNotFoundError: [Errno 2] No such file\nc000002:   File "/a.py", line 3, in f\nc000002: ValueError: bad\n'
    alone = parse_inputs([_item(good, name="good.log")])
    together = parse_inputs([_item(b"ERROR: disk quota exceeded\n" * 100, name="other.log"), _item(good, name="good.log")])
    assert together.filter(pl.col("file") == "good.log").equals(alone)


# --- structured files -------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(fs.pickle_bytes(), st.binary(max_size=300)))
def test_pickle_loader_raises_only_its_own_errors(data):
    try:
        load_untrusted_pickle(data)
    except (UnsafePickleError, CorruptPickleError, BudgetExceeded):
        pass  # BudgetExceeded: the loader's refusal of a length it has no memory for (load_bounded)


@FUZZ
@given(st.one_of(fs.pickle_bytes(), fs.input_bytes("flight_recorder_json"), st.binary(max_size=300)))
def test_flight_recorder_decoder_raises_only_its_own_errors(data):
    try:
        doc = decode_dump(data)
    except (UnsafePickleError, CorruptPickleError, FlightRecorderError, BudgetExceeded):
        return  # BudgetExceeded: e.g. a 300-byte pickle declaring a 553 MB string, refused by the memory budget
    try:
        events, summary = flight_recorder_events(doc, file="nccl_trace_rank_0", rank=0)
    except FlightRecorderError:
        return
    assert dict(events.schema) == EVENT_SCHEMA and summary["status"] in ("parsed", "partial")
    assert (summary["status"] == "partial") == bool(summary["reason"])


def test_a_tiny_pickle_declaring_a_huge_string_is_refused_not_loaded():
    # Found by Hypothesis (6.170): BINUNICODE with a 4-byte length of 0x2100000f (553 MB) in 300 bytes.
    data = (b"\x80\x02}q\x00(X\x07\x00\x00\x00entriesq\x01]q\x02(}q\x03(X\x02\x00\x00\x00\xc2\x80q\x04]q\x05("
            b"J\xff\xff\xff\xff]q\x06(X\x00\x00\x00\x00q\x07X\x0f\x00\x00!\x00nccl:all_reduceq\x08ee.")
    with pytest.raises((UnsafePickleError, CorruptPickleError, FlightRecorderError, BudgetExceeded)):
        decode_dump(data)
    with pytest.raises((UnsafePickleError, CorruptPickleError, BudgetExceeded)):
        load_untrusted_pickle(data)


ENTRY = {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1, "p2p_seq_id": 0,
         "op_id": 1, "profiling_name": "nccl:all_reduce", "time_created_ns": 1, "input_sizes": [[4]],
         "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled"}


@pytest.mark.parametrize("field, value", [("pg_config", True), ("pg_status", [1, 2]), ("pg_config", "ranks")])
def test_flight_recorder_table_of_the_wrong_type_is_noted_and_the_entries_kept(field, value):
    doc = {"version": "2.10", field: value, "entries": [ENTRY]}
    events, summary = flight_recorder_events(doc, file="nccl_trace_rank_0", rank=0)
    assert events.filter(pl.col("kind") == "fr.entry").height == 1
    assert summary["status"] == "partial"
    assert f"'{field}' is a {type(value).__name__}, not a mapping" in summary["reason"]


@FUZZ
@given(st.one_of(fs.input_bytes("error_json"), st.binary(max_size=200)))
def test_error_json_raises_only_its_own_error(data):
    item = _item(data, "error_json", "attempt_0/1/error.json")
    try:
        events = parse_error_json(item)
    except ErrorJsonError:
        return
    assert events.height == 1 and dict(events.schema) == EVENT_SCHEMA


# --- the whole pipeline ------------------------------------------------------------------------------


@FUZZ_SLOW
@given(st.lists(st.sampled_from(FORMATS), min_size=1, max_size=3), st.data())
def test_analyze_never_raises_and_reports_every_file(formats, data):
    with tempfile.TemporaryDirectory() as tmp:
        names = []
        for index, fmt in enumerate(formats):
            name = data.draw(st.sampled_from((f"rank{index}.log", f"nccl_trace_rank_{index}", f"r{index}/error.json")))
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.draw(fs.input_bytes(fmt)))
            names.append(name)
        try:
            report = analyze(tmp).report
        except NothingToAnalyse as exc:
            assert str(exc)
            return
    jsonschema.validate(report, SCHEMA)
    assert {i["file"] for i in report["inputs"]} == set(names)
