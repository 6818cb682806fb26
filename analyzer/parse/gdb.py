"""Stage 2, parse (gdb): a `bt` / `thread apply all bt` backtrace -> the stack events py-spy dumps give.

One `stack.thread` event per thread, as `pyspy.py` makes them: `detail` the frames innermost first as
"func (file:line)" or "func (lib.so)" joined by " <- ", `message` a one-line summary, `code` "gdb"
(gdb prints no thread state). A frame is `#N  [0xADDR in ]FUNC (ARGS) [at FILE:LINE | from LIB]`,
its `at` / `from` part sometimes wrapped onto the next line; FUNC is reduced to its qualified name
(no return type, no parameter types), so the stack analyses read native frames the same way from
both tools. `Thread N (...)` headers start threads; a plain `bt` is the current thread, taken as the
main one (gdb's thread 1 unless told otherwise). Lines are capped and split by position, never by a
regex that backtracks.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from analyzer.bounds import int64
from analyzer.events import EVENT_SCHEMA, empty_events
from analyzer.io import DecompressionLimit, InputFile
from analyzer.io.sniff import rank_from_name
from analyzer.parse.pyspy import MAX_DUMP_BYTES, MAX_FRAMES, MAX_LINE_CHARS

_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-fA-F]+ in )?(.*)$")
_THREAD = re.compile(r"^Thread (\d+) \((?:Thread 0x[0-9a-fA-F]+ )?(?:\(LWP (\d+)\))?[^\"]*(?:\"([^\"]*)\")?\)?:?\s*$")
_CONTINUATION = re.compile(r"^\s+(at \S+:\d+|from \S+)\s*$")
_AT = re.compile(r"^(.*?)\s+at (\S+:\d+)\s*$")
_FROM = re.compile(r"^(.*?)\s+from (\S+)\s*$")
MAIN_THREAD = "MainThread"


def parse_gdb_text(item: InputFile) -> pl.DataFrame:
    """Events of a gdb backtrace capture (one or several threads)."""
    try:
        text = item.read_all(MAX_DUMP_BYTES).decode("utf-8", errors="replace")
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        item.skip(f"cannot read gdb backtrace: {exc}", status="error")
        return empty_events()
    threads = list(_threads(text))
    if not any(t["frames"] for t in threads):
        item.skip("no backtrace frame (`#N ...`) in the file")
        return empty_events()
    return _events([t for t in threads if t["frames"]], item)


def _threads(text: str) -> Iterator[dict[str, Any]]:
    thread: dict[str, Any] = _thread(0, None, None, None)
    pending: list[str] = []  # the frame being read: its `at` / `from` part may be on the next line
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw[:MAX_LINE_CHARS].rstrip("\r")
        header = _THREAD.match(line)
        if header:
            _flush(thread, pending)
            if thread["frames"]:
                yield thread
            thread = _thread(number, int(header.group(1)), int64(header.group(2)), header.group(3))
            continue
        frame = _FRAME.match(line)
        if frame:
            _flush(thread, pending)
            pending.append(frame.group(2))
            thread["line"] = thread["line"] or number
            thread["text"] = thread["text"] or line
            continue
        more = _CONTINUATION.match(line)
        if more and pending:
            pending[0] = f"{pending[0]} {more.group(1)}"
    _flush(thread, pending)
    if thread["frames"]:
        yield thread


def _thread(line: int, number: int | None, lwp: int | None, name: str | None) -> dict[str, Any]:
    # Without a header (a plain `bt`) the stack is the current thread: thread 1 when gdb attached.
    main = number is None or number == 1
    return {"line": line, "tid": lwp, "name": MAIN_THREAD if main else (name or f"Thread {number}"), "frames": [], "text": None}


def _flush(thread: dict[str, Any], pending: list[str]) -> None:
    if pending and len(thread["frames"]) < MAX_FRAMES:
        thread["frames"].append(frame_text(pending[0]))
    pending.clear()


def frame_text(body: str) -> str:
    """`FUNC (ARGS) at FILE:LINE` -> `func (FILE:LINE)`; `... from /x/libtorch_cpu.so` -> `func (libtorch_cpu.so)`."""
    where = "?"
    at, lib = _AT.match(body), _FROM.match(body)
    if at:
        body, where = at.group(1), at.group(2)
    elif lib:
        body, where = lib.group(1), PurePosixPath(lib.group(2)).name
    return f"{function_name(body)} ({where})"


def function_name(signature: str) -> str:
    """The qualified name of a gdb frame's function: `void c10d::tcputil::recvBytes<unsigned char>(int, unsigned
    char*) ()` -> `c10d::tcputil::recvBytes<unsigned char>`; `__libc_recv (fd=98, ...)` -> `__libc_recv`."""
    name = _strip_parenthesised_tail(signature.strip())  # the argument values `(fd=98, ...)` / `()`
    name = _strip_parenthesised_tail(name)  # a demangled name's parameter types `(int, unsigned char*)`
    # The return type before the name: the last space outside template brackets.
    depth, cut = 0, -1
    for index, char in enumerate(name):
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        elif char == " " and depth == 0:
            cut = index
    return name[cut + 1:] if cut >= 0 and not name.startswith("operator") else name or "??"


def _strip_parenthesised_tail(text: str) -> str:
    """`f (a, (b))` -> `f`: drop the balanced group that ends the text, if it does."""
    if not text.endswith(")"):
        return text
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        if text[index] == ")":
            depth += 1
        elif text[index] == "(":
            depth -= 1
            if depth == 0:
                return text[:index].rstrip()
    return text


def _events(threads: list[dict[str, Any]], item: InputFile) -> pl.DataFrame:
    rank = item.rank_hint if item.rank_hint is not None else rank_from_name(item.path, directories=True, digits=True)
    n = len(threads)
    columns = {
        "file": [item.path] * n,
        "line": [t["line"] for t in threads],
        "tid": [t["tid"] for t in threads],
        "rank": [rank] * n,
        "local_rank": [item.local_rank_hint] * n,
        "source": ["gdb"] * n,
        "kind": ["stack.thread"] * n,
        "severity": ["info"] * n,
        "code": ["gdb"] * n,
        "message": [f'thread "{t["name"]}" (gdb): {_innermost(t["frames"])}' for t in threads],
        "text": [t["text"] for t in threads],
        "detail": [" <- ".join(t["frames"]) for t in threads],
    }
    frame = pl.DataFrame(columns, schema={name: EVENT_SCHEMA[name] for name in columns})
    return frame.select([(pl.col(c) if c in columns else pl.lit(None)).cast(t).alias(c) for c, t in EVENT_SCHEMA.items()])


def _innermost(frames: list[str]) -> str:
    named = [f for f in frames if not f.startswith("??")]
    return (named or frames)[0]
