"""py-spy dumps (text, --locals, --native, --json) -> one stack.thread event per thread."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analyzer.io import InputFile, discover
from analyzer.events import EVENT_COLUMNS, EVENT_SCHEMA
from analyzer.io.sniff import rank_from_name
from analyzer.parse.pyspy import parse_pyspy_json, parse_pyspy_text

SHARED = Path(__file__).resolve().parents[2] / "shared"
PYSPY_DIR = SHARED / "formats-samples" / "py-spy"


def _samples() -> dict[str, InputFile]:
    if not PYSPY_DIR.is_dir():
        pytest.skip("shared/formats-samples not available")
    return {item.path: item for item in discover(PYSPY_DIR)}


def _item(name: str, text: str, fmt: str = "pyspy_text") -> InputFile:
    data = text.encode()
    return InputFile(name, format=fmt, size=len(data), _payload=data)


def _threads(events: pl.DataFrame) -> pl.DataFrame:
    return events.filter(pl.col("kind") == "stack.thread")


def _parse(item: InputFile) -> pl.DataFrame:
    events = parse_pyspy_json(item) if item.format == "pyspy_json" else parse_pyspy_text(item)
    assert events.columns == EVENT_COLUMNS and dict(events.schema) == EVENT_SCHEMA
    return events


# --- real samples ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dump_rank0.txt", "dump_locals_rank0.txt", "dump_json_rank0.json"])
def test_rank0_sample_active_in_synchronize(name):
    item = _samples()[name]
    thread = _threads(_parse(item)).row(0, named=True)
    assert (thread["pid"], thread["tid"], thread["rank"]) == (2179, 2179, 0)
    assert thread["source"] == "pyspy" and thread["code"] == "active"
    assert thread["message"] == 'thread "MainThread" (active): synchronize'
    assert thread["detail"] == "synchronize (torch/cuda/__init__.py:1162) <- <module> (w.py:55)"


@pytest.mark.parametrize("name", ["dump_rank1.txt", "dump_locals_rank1.txt", "dump_json_rank1.json"])
def test_rank1_sample_idle_in_module(name):
    thread = _threads(_parse(_samples()[name])).row(0, named=True)
    assert (thread["pid"], thread["rank"], thread["code"]) == (2180, 1, "idle")
    assert thread["message"] == 'thread "MainThread" (idle): <module>'
    assert thread["detail"] == "<module> (w.py:52)"


def test_locals_are_not_frames():
    thread = _threads(_parse(_samples()["dump_locals_rank0.txt"])).row(0, named=True)
    assert "device" not in thread["detail"] and "Arguments" not in thread["detail"]


def test_native_sample_keeps_native_frames_and_names_the_innermost_symbol():
    thread = _threads(_parse(_samples()["dump_native_rank0.txt"])).row(0, named=True)
    frames = thread["detail"].split(" <- ")
    assert len(frames) == 17
    assert frames[0] == "0x7fb9f801488c (libcuda.so.580.159.04)"
    assert "cudaDeviceSynchronize (libcudart.so.13)" in frames
    assert "synchronize (torch/cuda/__init__.py:1162)" in frames
    assert thread["message"] == 'thread "MainThread" (active): cuCtxSynchronize_v2'
    idle = _threads(_parse(_samples()["dump_native_rank1.txt"])).row(0, named=True)
    assert idle["detail"].startswith("clock_nanosleep (libc.so.6) <- <module> (w.py:52)")


def test_process_line_gives_a_process_event():
    events = _parse(_samples()["dump_rank0.txt"])
    process = events.filter(pl.col("kind") == "stack.process").row(0, named=True)
    assert process["pid"] == 2179 and process["message"].endswith("/home/user/w.py hang") and process["line"] == 1
    assert _threads(events).row(0, named=True)["line"] == 4


# --- grammar corners ------------------------------------------------------------------------------

SUBPROCESSES = """\
Process 100: python train.py
Python v3.11.4 (/usr/bin/python3.11)

Thread 100 (active+gil): "MainThread"
    forward (model.py:10)
    train (train.py:99)
Thread 117 (idle): "Thread-1 (_read_thread)"
    _recv (multiprocessing/connection.py:395)
Thread 118 (idle)
    wait (threading.py:324)

\x1b[2m------------------------------------------------------------\x1b[0m
Process 101: sglang::scheduler_DP3_TP3_EP3
Python v3.11.4 (/usr/bin/python3.11)
Parent Process 100: python train.py

Thread 0X7F8E4B2F1740 (gil): "MainThread"
    _run_module_as_main (<frozen runpy>:198)
    helper (helper.py)
"""


def test_subprocesses_hex_tids_statuses_and_unnamed_threads():
    events = _parse(_item("host1/pyspy_rank3.txt", SUBPROCESSES))
    threads = _threads(events).sort("line")
    assert threads.height == 4
    assert threads.get_column("pid").to_list() == [100, 100, 100, 101]
    assert threads.get_column("tid").to_list() == [100, 117, 118, None]  # 0X... is a pthread id, not an OS tid
    assert threads.get_column("code").to_list() == ["active+gil", "idle", "idle", "gil"]
    assert threads.get_column("rank").to_list() == [3] * 4
    assert threads.get_column("message").to_list()[2] == 'thread "118" (idle): wait'
    assert threads.get_column("detail").to_list()[3] == "_run_module_as_main (<frozen runpy>:198) <- helper (helper.py)"
    assert events.filter(pl.col("kind") == "stack.process").get_column("pid").to_list() == [100, 101]


def test_ansi_colours_and_crlf():
    coloured = (
        "Process \x1b[1;33m2179\x1b[0m: python w.py\r\n"
        "Python v3.12.3 (/usr/bin/python3.12)\r\n\r\n"
        'Thread \x1b[1;33m2179\x1b[0m (active): "MainThread"\r\n'
        "    \x1b[32mall_reduce\x1b[0m (\x1b[36mtorch/distributed/distributed_c10d.py\x1b[0m:\x1b[2m2501\x1b[0m)\r\n"
        "    \x1b[32m<module>\x1b[0m (\x1b[36mw.py\x1b[0m:\x1b[2m5\x1b[0m)\r\n"
    )
    thread = _threads(_parse(_item("dump_rank0.txt", coloured))).row(0, named=True)
    assert thread["pid"] == 2179 and thread["tid"] == 2179
    assert thread["detail"] == "all_reduce (torch/distributed/distributed_c10d.py:2501) <- <module> (w.py:5)"


def test_error_output_marks_the_input():
    item = _item("dump_rank5.txt", "Error: Failed to find python version from target process\n")
    assert parse_pyspy_text(item).height == 0
    assert item.status == "error" and "Failed to find python version" in item.reason


def test_rank_attribution_ignores_pid_file_names():
    text = "Process 2179: python w.py\nPython v3.12.3 (/usr/bin/python3)\n\nThread 2179 (idle): \"MainThread\"\n    f (w.py:1)\n"
    assert _threads(_parse(_item("pyspy/2179.txt", text))).get_column("rank").to_list() == [None]
    assert _threads(_parse(_item("pyspy/node3_7.txt", text))).get_column("rank").to_list() == [7]
    item = _item("pyspy/whatever.txt", text)
    item.rank_hint = 12
    assert _threads(_parse(item)).get_column("rank").to_list() == [12]
    assert rank_from_name("rank5/py-spy.txt", directories=True, digits=True) == 5
    assert rank_from_name("rank5/py-spy.txt") is None  # a file name alone (discovery's hint) says nothing
    assert rank_from_name("pid_2179.txt", directories=True, digits=True) is None
    assert rank_from_name("pyspy/2179.txt", directories=True, digits=True, pids={2179}) is None
    assert rank_from_name("pyspy/node3_7.txt", directories=True, digits=True, pids={2179}) == 7


# --- JSON corners ----------------------------------------------------------------------------------


def _json_thread(pid, tid, active, gil, frames, name="MainThread"):
    return {
        "pid": pid, "thread_id": 140705944023360, "thread_name": name, "os_thread_id": tid,
        "active": active, "owns_gil": gil, "frames": frames, "process_info": None,
    }


def _json_frame(name, short, line, filename=None):
    return {"name": name, "filename": filename or f"/abs/{short}", "module": None, "short_filename": short,
            "line": line, "locals": None}


def test_json_status_combinations_native_frames_and_concatenated_arrays():
    first = [
        _json_thread(10, 10, True, True, [_json_frame("step", "train.py", 5)]),
        _json_thread(10, 11, False, True, [_json_frame("run", "threading.py", 9)], name=None),
        _json_thread(10, 12, False, False, [
            {"name": "pthread_cond_wait", "filename": "/lib/x86_64-linux-gnu/libc.so.6", "module": None,
             "short_filename": None, "line": 0, "locals": None},
            _json_frame("all_gather_into_tensor", "torch/distributed/distributed_c10d.py", 4193),
        ]),
    ]
    second = [_json_thread(10, 10, True, False, [_json_frame("step", "train.py", 6)])]
    text = json.dumps(first, indent=2) + "\n" + json.dumps(second, indent=2) + "\n"
    threads = _threads(_parse(_item("dump_json_rank2.json", text, "pyspy_json")))
    assert threads.get_column("code").to_list() == ["active+gil", "gil", "idle", "active"]
    assert threads.get_column("tid").to_list() == [10, 11, 12, 10]
    assert threads.get_column("rank").unique().to_list() == [2]
    assert threads.get_column("message").to_list()[1] == 'thread "11" (gil): run'
    assert threads.get_column("detail").to_list()[2] == (
        "pthread_cond_wait (libc.so.6) <- all_gather_into_tensor (torch/distributed/distributed_c10d.py:4193)"
    )


def test_json_thread_id_beyond_2_53_and_null_os_tid():
    thread = _json_thread(7, None, False, False, [_json_frame("f", "a.py", 1)])
    thread["thread_id"] = 18446744073709551000
    text = json.dumps([thread])
    row = _threads(_parse(_item("dump_json_rank0.json", text, "pyspy_json"))).row(0, named=True)
    assert row["tid"] is None and row["pid"] == 7 and "18446744073709551000" in row["text"]


def test_broken_json_is_not_a_crash():
    item = _item("dump_json_rank0.json", '[{"pid": 1, "frames": [', "pyspy_json")
    assert parse_pyspy_json(item).height == 0
    assert item.status in ("partial", "error")


def test_thread_evidence_quotes_the_programs_own_innermost_frames():
    from analyzer.parse.pyspy import own_frames

    frames = ["wait (/usr/lib/python3.11/threading.py:320)", "get (queue.py:171)",
              "barrier (/opt/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:4159)",
              "_engine_run_backward (torch/autograd/graph.py:979)", "0x7f3a (libcuda.so.1)",
              "load_shard (train.py:10)", "step (mylib/data.py:44)", "<module> (train.py:30)"]
    assert own_frames(frames) == ["load_shard (train.py:10)", "step (mylib/data.py:44)"]
    assert own_frames(frames[:5]) == []


def test_a_json_dump_thread_cites_its_frame_not_its_json(tmp_path):
    import json

    from analyzer.io import discover
    from analyzer.parse.pyspy import parse_pyspy_json

    dump = [{"pid": 9954, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": 9954, "active": False, "owns_gil": False,
             "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py", "short_filename": "threading.py", "line": 320},
                        {"name": "load_shard", "filename": "/work/train.py", "short_filename": "train.py", "line": 10},
                        {"name": "main", "filename": "/work/train.py", "short_filename": "train.py", "line": 31}]}]
    (tmp_path / "rank1.pyspy.json").write_text(json.dumps(dump))
    (item,) = discover(tmp_path)
    text = parse_pyspy_json(item).filter(pl.col("kind") == "stack.thread")["text"].item()
    assert text == 'Thread 9954 (idle): "MainThread" in load_shard (train.py:10) <- main (train.py:31)'
