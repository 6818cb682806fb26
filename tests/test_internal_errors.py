"""An analyzer fault is never a verdict: a bug in a parser, an analysis or the report building exits 3
with "internal error" on standard error and prints no verdict and no JSON; bad input stays a per-file
status. `analyzer.exits.INPUT_ERRORS` is the one list of what counts as bad input."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pickle
import sqlite3
import struct
import sys
import zlib
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner
from lark.exceptions import UnexpectedCharacters
from polars.exceptions import ComputeError, NoDataError, PanicException

import analyzer.parse as parse
from analyzer.analyses import load_all
from analyzer.cli import main
from analyzer.io import DecompressionLimit
from analyzer.exits import EXIT_INTERNAL_ERROR, INPUT_ERRORS, is_input_error
from analyzer.parse.nsys import NotNsysExport

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
WITH_ERROR_JSON = ROOT / "fixtures" / "recorded" / "rank_raises" / "job"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def assert_internal_error(result, exc_name: str) -> None:
    assert result.exit_code == EXIT_INTERNAL_ERROR, result.output
    assert f"internal error: {exc_name}" in result.stderr
    assert "VERDICT" not in result.output
    assert "Traceback" not in result.output  # only with --debug


def _raise(exc: BaseException):
    def broken(*_args, **_kwargs):
        raise exc

    return broken


# --- the classification ---------------------------------------------------------------------------


def _caught(exc_type: type[BaseException]) -> BaseException:
    try:
        if exc_type is zlib.error:
            zlib.decompress(b"not zlib")
        elif exc_type is lzma.LZMAError:
            lzma.decompress(b"not xz")
        elif exc_type is zstandard.ZstdError:
            zstandard.ZstdDecompressor().decompress(b"not zstd")
        elif exc_type is pickle.UnpicklingError:
            pickle.loads(b"\x80\x05garbage")
        elif exc_type is struct.error:
            struct.unpack("<q", b"\x00")
        elif exc_type is json.JSONDecodeError:
            json.loads("{")
        elif exc_type is sqlite3.DatabaseError:
            sqlite3.connect(":memory:").execute("select * from no_such_table")
        elif exc_type is EOFError:
            gzip.decompress(gzip.compress(b"x" * 100)[:20])
        elif exc_type is OSError:
            bz2.decompress(b"not bz2")
        elif exc_type is UnicodeError:
            b"\xff".decode("utf-8")
    except BaseException as exc:  # noqa: BLE001 - the test wants the real exception object
        return exc
    raise AssertionError(f"{exc_type} not raised")


@pytest.mark.parametrize("exc_type", [zlib.error, lzma.LZMAError, zstandard.ZstdError, pickle.UnpicklingError, struct.error,
                                      json.JSONDecodeError, sqlite3.DatabaseError, EOFError, OSError, UnicodeError])
def test_what_libraries_raise_on_bad_bytes_is_an_input_error(exc_type):
    exc = _caught(exc_type)
    assert isinstance(exc, exc_type) and is_input_error(exc)


@pytest.mark.parametrize("exc", [
    ValueError("bad number"), ComputeError("cannot cast"), NoDataError("empty CSV"), PanicException("rust panicked"),
    UnexpectedCharacters("x", 0, 1, 1), DecompressionLimit("bomb"), NotNsysExport("no tables"),
    RecursionError("nested too deep"),
], ids=lambda e: type(e).__name__)
def test_input_errors(exc):
    assert is_input_error(exc)


@pytest.mark.parametrize("exc", [
    TypeError("unsupported operand"), AttributeError("no attribute"), NameError("name"), KeyError("k"),
    ModuleNotFoundError("No module named 'pyarrow'"), ImportError("cannot import name"), AssertionError(),
    ZeroDivisionError(), KeyboardInterrupt(), SystemExit(1),
], ids=lambda e: type(e).__name__)
def test_analyzer_faults_are_not_input_errors(exc):
    assert not is_input_error(exc)


def test_the_interpreter_exits_are_never_listed():
    assert not any(issubclass(t, (KeyboardInterrupt, SystemExit, GeneratorExit)) for t in INPUT_ERRORS)


# --- a fault in a parser --------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [TypeError("unsupported operand type(s)"), ModuleNotFoundError("No module named 'pyarrow'")],
                         ids=lambda e: type(e).__name__)
def test_a_text_parser_fault_exits_3_in_text_and_json(monkeypatch, exc):
    import analyzer.parse.logtext as logtext

    monkeypatch.setattr(logtext, "parse_text_pieces", _raise(exc))
    assert_internal_error(run("analyze", CASE), type(exc).__name__)
    result = run("analyze", CASE, "--format", "json")
    assert_internal_error(result, type(exc).__name__)
    assert result.stdout == ""


def test_a_structured_parser_fault_exits_3(monkeypatch):
    monkeypatch.setitem(parse.PARSERS, "error_json", _raise(AttributeError("'list' object has no attribute 'get'")))
    assert_internal_error(run("analyze", WITH_ERROR_JSON), "AttributeError")


@pytest.mark.parametrize("exc", [ValueError("not an error.json"), PanicException("polars panicked on this file")],
                         ids=lambda e: type(e).__name__)
def test_an_input_error_in_a_parser_stays_that_files_status(monkeypatch, exc):
    monkeypatch.setitem(parse.PARSERS, "error_json", _raise(exc))
    result = run("analyze", WITH_ERROR_JSON, "--format", "json")
    assert result.exit_code in (0, 1), result.output
    broken = [i for i in json.loads(result.stdout)["inputs"] if i["format"] == "error_json"]
    assert broken and all(i["status"] == "error" and type(exc).__name__ in i["reason"] for i in broken)


def test_a_bad_line_in_a_text_batch_fails_that_file_only(monkeypatch, tmp_path):
    import analyzer.parse.logtext as logtext

    real = logtext.parse_text_pieces
    poisoned = "poisoned.log"

    def picky(pieces, year_hint):
        if any(p.item.path == poisoned for p in pieces):
            raise ComputeError("the parser cannot take this line")
        return real(pieces, year_hint)

    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_bytes((CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes())
    (job / poisoned).write_text("[rank1]: something\n")
    monkeypatch.setattr(logtext, "parse_text_pieces", picky)
    result = run("analyze", job, "--format", "json")
    assert result.exit_code == 1
    inputs = {i["file"]: i for i in json.loads(result.stdout)["inputs"]}
    assert inputs[poisoned]["status"] == "error" and "ComputeError" in inputs[poisoned]["reason"]
    assert inputs["rank0.log"]["status"] == "parsed"


# --- a fault in detection or report building --------------------------------------------------------


def test_an_analysis_fault_exits_3_never_a_verdict(monkeypatch):
    analyses = load_all()
    for name in analyses:
        monkeypatch.setitem(analyses, name, _raise(TypeError("'NoneType' object is not subscriptable")))
    assert_internal_error(run("analyze", CASE), "TypeError")
    result = run("analyze", CASE, "--format", "json")
    assert_internal_error(result, "TypeError")
    assert result.stdout == ""


def test_an_import_error_in_one_analysis_exits_3(monkeypatch):
    analyses = load_all()
    name = sorted(analyses)[0]
    monkeypatch.setitem(analyses, name, _raise(ImportError("cannot import name 'x' from 'analyzer.y'")))
    assert_internal_error(run("analyze", CASE), "ImportError")


def test_a_report_building_fault_exits_3(monkeypatch):
    import analyzer.api as api

    monkeypatch.setattr(api, "host_fact_records", _raise(KeyError("nccl_version")))
    assert_internal_error(run("analyze", CASE, "--format", "json"), "KeyError")


def test_a_renderer_fault_prints_no_half_report(monkeypatch):
    import analyzer.render.text as text

    real = text._inputs_table
    monkeypatch.setattr(text, "_inputs_table", lambda *a: (real(*a), 1 / 0))
    result = run("analyze", CASE)
    assert_internal_error(result, "ZeroDivisionError")
    assert result.stdout == ""  # the verdict was rendered, but never written


def test_debug_prints_the_traceback(monkeypatch):
    analyses = load_all()
    for name in analyses:
        monkeypatch.setitem(analyses, name, _raise(TypeError("boom")))
    result = run("analyze", CASE, "--debug")
    assert result.exit_code == EXIT_INTERNAL_ERROR
    assert "Traceback (most recent call last)" in result.stderr and "internal error: TypeError: boom" in result.stderr
    assert "VERDICT" not in result.output


# --- an optional dependency is not a fault -----------------------------------------------------------


def test_torch_missing_is_not_an_internal_error(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from tests.test_analyses_checkpoint import complete

    job = complete(tmp_path)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as on a machine without it
    result = run("analyze", job, "--format", "json")
    assert result.exit_code in (0, 1), result.output
    (checkpoint,) = json.loads(result.stdout)["checkpoints"]
    assert "torch not installed" in checkpoint["checked_with"]
