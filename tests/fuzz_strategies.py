"""Hypothesis strategies for fuzzing the parsers: random inputs, and real inputs mutated.

Seeds are the repository's own fixtures (real incident logs, recorded Flight Recorder dumps, CUDA
memory snapshots, py-spy dumps, torchelastic error.json files, profiler traces, nsys reports),
grouped by the format `discover` gives them, plus the grammars' golden bodies from
tests/test_grammars.py. Mutations are the ways logs actually break: truncation, a half-line from
another process spliced in, wrapper prefixes and colour codes, CR/CRLF, NULs, invalid UTF-8,
numbers too large for any integer type, runaway line lengths; and for structured files, bit
flips, truncation and values of the wrong type anywhere in the document.

`FUZZ` is the settings every fuzz test uses. CI runs a few dozen derandomized examples per test
(deterministic, no example database written); `python -m tests.fuzz_long --examples N` runs the
same tests with N random examples each (see DEVELOPERS.md).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
from functools import cache
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_JOBS = ("cases", "healthy", "recorded", "drift")
MAX_SEED_BYTES = 64 << 10

EXAMPLES = int(os.environ.get("POSTMORTEM_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("POSTMORTEM_FUZZ_RANDOM") != "1",
    database=None,  # CI writes nothing; fuzz_long keeps failures in --database
    print_blob=True,
    phases=[phase for phase in Phase if phase is not Phase.explain],  # explain writes .hypothesis/patches
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
# Whole-pipeline examples cost about a second each: a tenth as many.
FUZZ_SLOW = settings(FUZZ, max_examples=max(5, EXAMPLES // 8))

if os.environ.get("POSTMORTEM_FUZZ_DB"):
    from hypothesis.database import DirectoryBasedExampleDatabase

    FUZZ = settings(FUZZ, database=DirectoryBasedExampleDatabase(os.environ["POSTMORTEM_FUZZ_DB"]))
    FUZZ_SLOW = settings(FUZZ_SLOW, database=FUZZ.database)


# --- seeds ------------------------------------------------------------------------------------------


@cache
def seed_files() -> dict[str, tuple[bytes, ...]]:
    """Raw bytes of every fixture input, by the format discover gives it (capped at 64 KiB each)."""
    from analyzer.io import discover

    by_format: dict[str, list[bytes]] = {}
    jobs = [job for kind in FIXTURE_JOBS for job in sorted((ROOT / "fixtures" / kind).glob("*/job"))]
    for job in [*jobs, ROOT / "fixtures" / "traces"]:
        for item in discover(job):
            if item.status != "pending" or item.size > 4 * MAX_SEED_BYTES and item.format not in ("pickle", "kineto_trace"):
                continue
            data = item.read_all(8 << 20)
            by_format.setdefault(item.format, []).append(data)
    return {fmt: tuple(files) for fmt, files in sorted(by_format.items())}


@cache
def seed_lines() -> tuple[str, ...]:
    """Distinct non-empty lines of every fixture text log, in a fixed order."""
    seen: dict[str, None] = {}
    for data in seed_files().get("text", ()):
        for line in data.decode("utf-8", "replace").splitlines():
            if line.strip() and len(line) < 4000:
                seen.setdefault(line, None)
    return tuple(seen)


@cache
def seed_bodies() -> dict[tuple[str, str], tuple[str, ...]]:
    """Golden bodies of every grammar start symbol (tests/test_grammars.py guards that each has one)."""
    from tests.test_grammars import GOLDEN

    bodies: dict[tuple[str, str], list[str]] = {}
    for grammar_name, start, body, _ in GOLDEN:
        bodies.setdefault((grammar_name, start), []).append(body)
    return {key: tuple(value) for key, value in bodies.items()}


def _shrink(doc: object, width: int = 6, depth: int = 0) -> object:
    """A real document cut to a few items per container, so that a mutated copy stays cheap."""
    if depth > 12:
        return None
    if isinstance(doc, dict):
        return {k: _shrink(v, width, depth + 1) for k, v in list(doc.items())[: width * 4]}
    if isinstance(doc, (list, tuple)):
        items = [_shrink(v, width, depth + 1) for v in list(doc)[:width]]
        return items if isinstance(doc, list) else tuple(items)
    return doc


@cache
def seed_documents() -> dict[str, tuple[object, ...]]:
    """Decoded structured seeds (Flight Recorder dumps, memory snapshots, JSON records), shrunk."""
    from analyzer.io.safepickle import load_untrusted_pickle

    docs: dict[str, list[object]] = {}
    for fmt, files in seed_files().items():
        for data in files:
            try:
                doc = load_untrusted_pickle(data) if fmt == "pickle" else json.loads(data)
            except ValueError:
                continue
            docs.setdefault(fmt, []).append(_shrink(doc))
    return {fmt: tuple(v) for fmt, v in docs.items()}


# --- text -----------------------------------------------------------------------------------------

# Characters that make parsers stumble: structure, prefixes' punctuation, line breaks of every kind,
# controls, NUL, replacement characters, wide and combining characters, a BOM.
_NASTY = "[](){}<>:=,.;-_/\\|*#%\"' \t0123456789eE+x\x00\r\x0b\x0c\x1b\x7f\x85\u2028\u2029\ufeff\ufffd\u0301\u4e2d\U0001f525"
nasty_text = st.text(alphabet=st.sampled_from(_NASTY) | st.characters(exclude_categories=["Cs"]), max_size=120)

PREFIXES = (
    "[rank{n}]:", "[default{n}]:", "[default{n}]:[rank{n}]:", "{n}: ", "[1,{n}]<stdout>:", "[{n}] ", "worker-{n}: ",
    "[host-{n}:{n}]: ", "(RayWorkerWrapper pid={n}, ip=10.0.0.{n}) ", "2025-03-12T10:11:12.{n}Z | INFO | ",
    "host{n}:{n}:{n} [{n}] NCCL INFO ", "[E{n} 14:57:41.70 ProcessGroupNCCL.cpp:{n}] ", "\x1b[3{n}m",
)
HUGE_NUMBERS = ("99999999999999999999999", "-9223372036854775809", "9223372036854775808", "18446744073709551616",
                "1e309", "NaN", "-0", "00000000000000000000001", "4" * 5000)


@st.composite
def mutated_text(draw, base: str) -> str:
    """`base` broken in one to four of the ways real logs break."""
    text = base
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 11))
        at = draw(st.integers(0, len(text)))
        if op == 0:  # truncated
            text = text[:at]
        elif op == 1:  # a span deleted
            text = text[:at] + text[draw(st.integers(at, len(text))):]
        elif op == 2:  # junk inserted
            text = text[:at] + draw(nasty_text) + text[at:]
        elif op == 3:  # another line spliced in, as two processes writing to one file do
            text = text[:at] + draw(st.sampled_from(seed_lines())) + text[at:]
        elif op == 4:  # a wrapper prefix (launcher, tee, collector) in front
            text = draw(st.sampled_from(PREFIXES)).format(n=draw(st.integers(0, 70000))) + text
        elif op == 5:  # every number, or one, replaced by one that fits no integer type
            text = re.sub(r"\d+", lambda m: draw(st.sampled_from(HUGE_NUMBERS)), text, count=draw(st.integers(0, 3)))
        elif op == 6:  # a span repeated: runaway output
            end = draw(st.integers(at, min(len(text), at + 40)))
            text = text[:at] + text[at:end] * draw(st.integers(2, 300)) + text[end:]
        elif op == 7:  # colour codes
            text = text[:at] + draw(st.sampled_from(("\x1b[0m", "\x1b[1;31m", "\x1b]0;title\x07", "[0m", "\x1b[?25l"))) + text[at:]
        elif op == 8:  # line breaks of another system, or a carriage-return progress bar
            text = text[:at] + draw(st.sampled_from(("\r", "\r\n", "\n", "\r\r\n", "\u2028"))) + text[at:]
        elif op == 9:  # swapped halves
            text = text[at:] + text[:at]
        elif op == 10:  # case flipped (level names, hex digits)
            text = text[:at] + text[at:].swapcase()
        else:  # a character replaced
            text = text[:at] + draw(st.sampled_from(_NASTY)) + text[at + 1:]
    return text


@st.composite
def log_line(draw) -> str:
    """A real line, a real line mutated, or random text."""
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return draw(st.sampled_from(seed_lines()))
    if choice == 4:
        return draw(nasty_text)
    return draw(mutated_text(draw(st.sampled_from(seed_lines()))))


@st.composite
def grammar_body(draw) -> tuple[str, str, str]:
    """(grammar, start symbol, body): a golden body, mutated, or random text."""
    (grammar_name, start), bodies = draw(st.sampled_from(sorted(seed_bodies().items())))
    base = draw(st.sampled_from(bodies))
    body = draw(st.one_of(st.just(base), mutated_text(base), mutated_text(base), log_line(), nasty_text))
    return grammar_name, start, body


@st.composite
def log_document(draw) -> str:
    """A file's worth of lines: a slice of a real log, or lines drawn one by one, with any breaks."""
    if draw(st.booleans()):
        data = draw(st.sampled_from(seed_files()["text"])).decode("utf-8", "replace")
        lines = data.splitlines()
        start = draw(st.integers(0, max(len(lines) - 1, 0)))
        lines = lines[start : start + draw(st.integers(1, 60))]
        lines = [draw(mutated_text(line)) if draw(st.integers(0, 3)) == 0 else line for line in lines]
    else:
        lines = draw(st.lists(log_line(), min_size=1, max_size=25))
    separator = draw(st.sampled_from(("\n", "\n", "\r\n", "\r")))
    return separator.join(lines) + draw(st.sampled_from(("", separator)))


@st.composite
def log_bytes(draw) -> bytes:
    """A log document as bytes: UTF-8, UTF-16 either way, Latin-1, with NUL padding or raw corruption."""
    text = draw(log_document())
    encoding = draw(st.sampled_from(("utf-8", "utf-8", "utf-8", "utf-16", "utf-16-be", "latin-1")))
    data = text.encode(encoding, "replace") if encoding != "utf-8" else text.encode("utf-8", "surrogatepass")
    return draw(mutated_bytes(data)) if draw(st.integers(0, 3)) == 0 else data


# --- bytes and documents ----------------------------------------------------------------------------


@st.composite
def mutated_bytes(draw, base: bytes) -> bytes:
    """`base` with bit flips, truncation, inserted runs (NULs, 0xFF, random) or a duplicated span."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(data)))
        if op == 0 and data:
            at = min(at, len(data) - 1)
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == 1:
            del data[at:]
        elif op == 2:
            data[at:at] = draw(st.sampled_from((b"\x00" * 64, b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x04\x95")))
        elif op == 3:
            data[at:at] = draw(st.binary(max_size=32))
        else:
            end = draw(st.integers(at, min(len(data), at + 256)))
            data[at:at] = data[at:end] * draw(st.integers(1, 8))
    return bytes(data)


KEYS = (
    # Flight Recorder
    "version", "entries", "pg_config", "pg_status", "comm_lib_version", "nccl_version", "profiling_name", "seq_id",
    "collective_seq_id", "p2p_seq_id", "record_id", "pg_id", "process_group", "input_sizes", "output_sizes",
    "input_dtypes", "output_dtypes", "state", "time_created_ns", "time_discovered_started_ns", "duration_ms",
    "frames", "ranks", "desc", "is_p2p", "timeout_ms", "last_enqueued_collective", "last_completed_collective",
    # memory snapshots
    "segments", "blocks", "device_traces", "allocator_settings", "device", "address", "total_size", "allocated_size",
    "active_size", "requested_size", "size", "action", "addr", "stream", "segment_type",
    # py-spy, error.json, capture manifests, traces
    "thread_id", "thread_name", "os_thread_id", "active", "owns_gil", "pid", "name", "filename", "short_filename",
    "line", "locals", "message", "extraInfo", "py_callstack", "timestamp", "errorCode", "traceEvents", "ph", "ts",
    "dur", "cat", "args", "tid", "postmortem_capture", "files", "host", "rank",
)
json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.sampled_from(("", "nccl:all_reduce", "completed", "scheduled", "active_allocated", "oom", "0", "-1", "[0, 1]")),
    nasty_text,
)
json_value = st.recursive(
    json_scalar,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.sampled_from(KEYS) | nasty_text, children, max_size=6),
    max_leaves=25,
)


@st.composite
def mutated_document(draw, base: object) -> object:
    """A deep copy of `base` with one to six values, anywhere in it, replaced by any JSON value."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 6))):
        holder, key = None, None
        node = doc
        for _ in range(draw(st.integers(0, 8))):
            if isinstance(node, dict) and node:
                holder, key = node, draw(st.sampled_from(sorted(node, key=repr)))
            elif isinstance(node, list) and node:
                holder, key = node, draw(st.integers(0, len(node) - 1))
            else:
                break
            node = holder[key]
        replacement = draw(json_value)
        if holder is None:
            doc = replacement
        else:
            holder[key] = replacement
    return doc


@st.composite
def structured_document(draw, fmt: str) -> object:
    """A document in the shape of `fmt` (a seed, mutated), or any JSON value."""
    seeds = seed_documents().get(fmt) or seed_documents()["pickle"]
    return draw(st.one_of(mutated_document(draw(st.sampled_from(seeds))), json_value))


def _tripwire(*args):  # noqa: ARG001 - what a hostile pickle asks the unpickler to call
    TRIPPED.append(args)


TRIPPED: list[tuple] = []


class _CallsTripwire:
    def __reduce__(self):
        return _tripwire, ("unpickled",)


@st.composite
def pickle_bytes(draw) -> bytes:
    """A pickle of a structured document (possibly carrying a call to `_tripwire`), possibly damaged."""
    fmt = draw(st.sampled_from(("pickle", "flight_recorder_json", "error_json", "pyspy_json")))
    doc = draw(structured_document(fmt))
    if draw(st.integers(0, 3)) == 0:
        doc = {"entries": [doc, _CallsTripwire()], "segments": [_CallsTripwire()]}
    data = pickle.dumps(doc, protocol=draw(st.integers(2, pickle.HIGHEST_PROTOCOL)))
    return draw(mutated_bytes(data)) if draw(st.booleans()) else data


def json_bytes(doc: object) -> bytes:
    return json.dumps(doc, default=repr, allow_nan=True).encode()


@st.composite
def input_bytes(draw, fmt: str) -> bytes:
    """Bytes a file of format `fmt` could hold: a real one mutated, a generated one, or noise."""
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(st.binary(max_size=512))
    if fmt in ("text", "text-utf16", "pyspy_text", "nsys_stats_csv"):
        if fmt in seed_files() and choice <= 2:
            return draw(mutated_bytes(draw(st.sampled_from(seed_files()[fmt]))[:MAX_SEED_BYTES]))
        return draw(log_bytes())
    if fmt == "pickle":
        return draw(pickle_bytes())
    if fmt == "nsys_sqlite":
        return draw(mutated_bytes(draw(st.sampled_from(seed_files()["nsys_sqlite"]))))
    return json_bytes(draw(structured_document(fmt)))
