"""Stage 2, parse (py-spy): `py-spy dump` output (text, --locals, --native, --json) -> canonical events.

One `stack.thread` event per thread: `code` is py-spy's status (`active`, `idle`, `gil`, combined
as py-spy prints them, e.g. `active+gil`), `detail` the frames innermost first as
"func (file:line)" joined by " <- ", `message` a one-line summary. Stack clustering (detect) reads
these. Dumps are small (a few threads of a few dozen frames per process) and the format is
line-oriented with fixed indents, so a compiled regex per line is all it takes.
"""

from __future__ import annotations

import json
import re
import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from analyzer.bounds import bounded_str, cap_text, int64
from analyzer.io import DecompressionLimit, InputFile
from analyzer.io.sniff import rank_from_name
from analyzer.events import EVENT_SCHEMA, empty_events

MAX_DUMP_BYTES = 64 << 20
MAX_FRAMES = 512  # a runaway recursion prints thousands of identical frames; the innermost ones matter
# A line is cut here before any pattern sees it (py-spy prints one frame per line; the longest real
# ones are C++ template symbols of a few KB), and frames are split with str.find, never a regex
# that backtracks: a 3 MB line of ` (` without its `)` costs one pass.
MAX_LINE_CHARS = 8192

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|^\[0m ?")
_PROCESS = re.compile(r"^Process (\d+): ?(.*)$")
_PARENT = re.compile(r"^Parent Process (\d+): ?(.*)$")
_THREAD = re.compile(r'^Thread (0[xX][0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_LOCALS_LINE = re.compile(r"^ {8}")
_ERROR = re.compile(r"^(?:Error: |Permission Denied|Failed to )")
_ADDRESS = re.compile(r"^0[xX][0-9a-fA-F]+$")


def parse_pyspy_text(item: InputFile) -> pl.DataFrame:
    """Events of a `py-spy dump` text capture (one or several process blocks)."""
    text = _read_text(item)
    if text is None:
        return empty_events()
    rows = list(_text_rows(text))
    if not any(row["kind"] == "stack.thread" for row in rows):
        _mark_empty(item, text)
        return empty_events()
    cut = sum(1 for line in text.splitlines() if len(line) > MAX_LINE_CHARS)
    if cut:
        item.reason = f"{cut} line(s) longer than {MAX_LINE_CHARS} characters cut to their first {MAX_LINE_CHARS}"
    return _finish(rows, item)


def parse_pyspy_json(item: InputFile) -> pl.DataFrame:
    """Events of `py-spy dump --json` (an array of thread objects; several arrays back to back are fine)."""
    text = _read_text(item)
    if text is None:
        return empty_events()
    rows = []
    for dump_index, document in enumerate(_json_documents(text)):
        threads = document if isinstance(document, list) else [document]
        seen_pids: set[int] = set()
        for index, thread in enumerate(threads):
            if not isinstance(thread, Mapping):
                continue
            row = _json_row(thread, dump_index, index)
            if row["cmdline"] is not None and row["pid"] not in seen_pids:
                seen_pids.add(row["pid"])
                rows.append({"kind": "stack.process", "line": 0, "pid": row["pid"], "cmdline": row["cmdline"], "text": row["cmdline"]})
            rows.append(row)
    if not any(row["kind"] == "stack.thread" for row in rows):
        _mark_empty(item, text)
        return empty_events()
    return _finish(rows, item)


# --- text ---------------------------------------------------------------------------------------


def _text_rows(text: str) -> Iterator[dict[str, Any]]:
    pid: int | None = None
    cmdline: str | None = None
    thread: dict[str, Any] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        raw = raw[:MAX_LINE_CHARS]
        line = _ANSI.sub("", raw.rstrip("\r")) if ("\x1b" in raw or "[0m" in raw) else raw.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("    "):
            if thread is None or _LOCALS_LINE.match(line):
                continue  # Arguments:/Locals: blocks of --locals, or frames outside any thread
            frame = _split_frame(line)
            if frame and len(thread["frames"]) < MAX_FRAMES:
                thread["frames"].append(_frame_text(*frame))
            continue
        match = _THREAD.match(line)
        if match:
            if thread is not None:
                yield thread
            ident, status, name = match.groups()
            os_tid = int64(ident) if ident.isdigit() else None  # `0X7F..` is a pthread id, not an OS tid
            thread = {"kind": "stack.thread", "line": number, "pid": pid, "tid": os_tid, "status": status.strip(), "name": name,
                      "ident": ident, "frames": [], "text": line, "cmdline": cmdline}
            continue
        process = _PROCESS.match(line)
        if process:
            if thread is not None:
                yield thread
                thread = None
            pid, cmdline = int64(process.group(1)), process.group(2).strip()
            yield {"kind": "stack.process", "line": number, "pid": pid, "cmdline": cmdline, "text": line}
            continue
        if _PARENT.match(line) or line.startswith("Python v") or set(line.strip()) <= {"-", "\u2500"}:
            continue
        # Anything else (an error message, a stray line) ends the current thread block.
        if thread is not None:
            yield thread
            thread = None
    if thread is not None:
        yield thread


def _split_frame(line: str) -> tuple[str, str] | None:
    """`    func (file:line)` -> (func, file:line): func up to the first ` (`, the rest inside the last `)`."""
    body = line[4:].rstrip()
    if not body or body[0].isspace() or not body.endswith(")"):
        return None
    split = body.find(" (", 1)
    if split < 0 or split + 2 > len(body) - 1:
        return None
    return body[:split], body[split + 2 : -1]


def _frame_text(function: str, where: str) -> str:
    # Text and JSON render the same frame the same way: `func (file:line)`, `symbol (lib.so)`.
    return f"{function} ({where})"


# --- JSON ---------------------------------------------------------------------------------------


def _json_documents(text: str) -> Iterator[object]:
    """Top-level JSON values back to back (several `py-spy dump --json` runs appended to one file)."""
    decoder = json.JSONDecoder()
    position, end = 0, len(text)
    while position < end:
        while position < end and text[position].isspace():
            position += 1
        if position >= end:
            return
        try:
            document, position = decoder.raw_decode(text, position)
        except ValueError:
            return
        yield document


def _json_row(thread: Mapping, dump_index: int, index: int) -> dict[str, Any]:
    active, gil = bool(thread.get("active")), bool(thread.get("owns_gil"))
    frames = []
    listed = thread.get("frames")
    for frame in (listed if isinstance(listed, list) else [])[:MAX_FRAMES]:  # a malformed dump: no frames
        if isinstance(frame, Mapping):
            frames.append(_json_frame(frame))
    os_tid = thread.get("os_thread_id")
    process = thread.get("process_info") if isinstance(thread.get("process_info"), Mapping) else {}
    return {
        "kind": "stack.thread",
        "line": 0,
        "pid": int64(thread.get("pid")),
        "tid": int64(os_tid),
        "status": _status(active, gil),
        "name": thread.get("thread_name"),
        "ident": str(os_tid if os_tid is not None else thread.get("thread_id")),
        "frames": frames,
        "text": json.dumps({k: thread.get(k) for k in ("pid", "thread_id", "thread_name", "os_thread_id", "active", "owns_gil")}),
        "cmdline": process.get("command_line") if process else None,
    }


def _json_frame(frame: Mapping) -> str:
    name = _field(frame.get("name"))
    filename = _field(frame.get("short_filename") or frame.get("filename"))
    line = int64(frame.get("line"))
    if not line:
        # Native frames carry the library path and line 0; text output shows the basename.
        if not filename.endswith(".py"):
            filename = PurePosixPath(filename).name or filename
        return _frame_text(name, filename)
    return _frame_text(name, f"{filename}:{line}")


def _status(active: bool, gil: bool) -> str:
    # As py-spy's dump prints it: "active" / "idle", plus "gil" when the thread holds the GIL.
    parts = ["active"] if active else ([] if gil else ["idle"])
    if gil:
        parts.append("gil")
    return "+".join(parts)


# --- shared -------------------------------------------------------------------------------------


def _finish(rows: list[dict[str, Any]], item: InputFile) -> pl.DataFrame:
    pids = {row["pid"] for row in rows if row["pid"] is not None}
    # A dump's trailing digits may be a pid (`py-spy dump --pid 2179 > 2179.txt`): those of its own processes are not a rank.
    rank = item.rank_hint if item.rank_hint is not None else rank_from_name(item.path, directories=True, digits=True, pids=pids)
    threads = [row.get("kind") == "stack.thread" for row in rows]
    n = len(rows)
    columns = {
        "file": [item.path] * n,
        "line": [row["line"] for row in rows],
        "pid": [row["pid"] for row in rows],
        "tid": [row.get("tid") for row in rows],
        "rank": [rank] * n,
        "local_rank": [item.local_rank_hint] * n,
        "source": ["pyspy"] * n,
        "kind": [row["kind"] for row in rows],
        "severity": ["info"] * n,
        "code": [row.get("status") for row in rows],
        "message": [
            f'thread "{row["name"] if row["name"] is not None else row["ident"]}" ({row["status"]}): '
            f'{_innermost(row["frames"])}'
            if is_thread
            else f"process {row['pid']}: {row['cmdline']}"
            for row, is_thread in zip(rows, threads)
        ],
        # A thread's record spans many lines; its evidence is the header with the frames that say
        # where the program itself is: the innermost frames of its own code, not the library's.
        "text": [_thread_evidence(row) if is_thread else row["text"] for row, is_thread in zip(rows, threads)],
        "detail": [(" <- ".join(row["frames"]) or None) if is_thread else None for row, is_thread in zip(rows, threads)],
    }
    frame = pl.DataFrame(columns, schema={name: EVENT_SCHEMA[name] for name in columns})
    return frame.select(
        [(pl.col(n) if n in columns else pl.lit(None)).cast(t).alias(n) for n, t in EVENT_SCHEMA.items()]
    )


# Frames of the interpreter, the standard library and installed packages say where a thread waits,
# not why. py-spy shortens installed paths (`torch/autograd/graph.py`), so a frame is also a
# library's when its first path component is a stdlib module or a framework training code calls.
_LIBRARY_PATH = re.compile(r"site-packages/|dist-packages/|/lib/python\d|<frozen |<string>")
_FRAME_FILE = re.compile(r"\(([^()]*?\.py):\d+\)$")
FRAMEWORK_PACKAGES = frozenset({
    "torch", "torchvision", "torchaudio", "transformers", "accelerate", "deepspeed", "lightning", "pytorch_lightning",
    "datasets", "numpy", "tqdm", "apex", "triton", "ray", "horovod", "jax", "flax", "peft", "trl", "safetensors",
    "huggingface_hub", "fsspec", "urllib3", "requests", "wandb", "tensorboard",
})
OWN_FRAMES_QUOTED = 2


def _is_own_frame(frame: str) -> bool:
    match = _FRAME_FILE.search(frame)
    if not match or _LIBRARY_PATH.search(match.group(1)):
        return False
    parts = match.group(1).lstrip("./").split("/")
    top = parts[0].removesuffix(".py")
    return top not in sys.stdlib_module_names and not (len(parts) > 1 and top in FRAMEWORK_PACKAGES)


def own_frames(frames: list[str], count: int = OWN_FRAMES_QUOTED) -> list[str]:
    """The innermost `count` frames of the program's own code (`func (file:line)`), innermost first."""
    return [f for f in frames if _is_own_frame(f)][:count]


def _thread_evidence(row: dict[str, Any]) -> str:
    header = row["text"] if row["line"] else f'Thread {row["ident"]} ({row["status"]}): "{row["name"] or ""}"'
    frames = own_frames(row["frames"]) or row["frames"][:1]
    return f"{header} in {' <- '.join(frames)}" if frames else header


def _innermost(frames: list[str]) -> str:
    """The innermost frame with a name: --native stacks start with bare addresses (`0x7fb9... (libcuda.so)`)."""
    if not frames:
        return "(no frames)"
    for frame in frames:
        name = frame.split(" (", 1)[0]
        if not _ADDRESS.match(name):
            return name
    return frames[0].split(" (", 1)[0]


def _read_text(item: InputFile) -> str | None:
    try:
        data = item.read_all(MAX_DUMP_BYTES)
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        item.skip(f"cannot read py-spy dump: {exc}", status="error")
        return None
    return data.decode("utf-8", errors="replace")


def _mark_empty(item: InputFile, text: str) -> None:
    error = next((line.strip() for line in text.splitlines() if _ERROR.match(line.strip())), None)
    if error:
        item.skip(f"py-spy failed: {error}"[:300], status="error")
    else:
        item.skip("py-spy output with no thread stacks", status="partial")


def _field(value: object) -> str:
    """A JSON frame's name or file as text of bounded length ("?" when absent)."""
    return cap_text(value, MAX_LINE_CHARS) if isinstance(value, str) and value else bounded_str(value, 256) if value else "?"
