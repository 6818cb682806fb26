"""Stage 2, parse (Flight Recorder): PyTorch NCCL Flight Recorder dumps -> canonical events.

A dump is one rank's ring buffer of recent collectives plus its process-group configuration and
status. It comes as a pickle (read only through `analyzer.io.safepickle`, never `pickle.load`) or as
the JSON variant, in every layout PyTorch has written since 2.2: a bare list with
`seq_id`/`time_created_us`, the 1.x dicts, the 2.x dicts with `collective_seq_id`/`p2p_seq_id`,
`nccl_version` or `comm_lib_version`, `pg_status` values as strings in JSON, `pg_config.ranks` as a
JSON string, `process_group` as tuple or list. The keys and the format `version` are the writer's
constants (`DEFINE_CONSTANT(version_val, ...)` in PyTorch's `torch/csrc/distributed/c10d/TraceUtils.h`,
in later releases `FlightRecorder.hpp`; "2.10" in PyTorch 2.10 and 2.11). The repository holds
recorded 2.10 dumps (`fixtures/recorded/hang_uneven_data/job/fr/`) and `tests/frgen.py`, which
writes the older versions' layouts from one of them.

Events: one `fr.entry` per ring-buffer entry and one `fr.pg_status` per process group. Dumps of
16k ranks x 2k entries are normal at scale, so columns are built with one list comprehension
each and the frame is made once per file; nothing here creates a frame per entry.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from analyzer.bounds import INT64_MAX, INT64_MIN, bounded_str, int64
from analyzer.io import DecompressionLimit, InputFile
from analyzer.events import EVENT_SCHEMA, UTC_TS, empty_events
from analyzer.io.budget import address_space
from analyzer.io.safepickle import CorruptPickleError, UnsafePickleError, load_untrusted_pickle
from analyzer.io.sniff import rank_from_name
from analyzer.parse.fr_groups import field_text, pg_members, pg_rank_of, pg_sort_key, ranks_text

MAX_DUMP_BYTES = 256 << 20  # real dumps are a few MB; building one must also fit the parse budget
INLINE_MEMBERS = 256

# profiling_name (after "backend:") -> WorkNCCL OpType spelling (opTypeToString), so FR entries and
# watchdog lines name the same op the same way. `all_reduce_barrier` stays distinguishable as BARRIER.
OP_NAMES: dict[str, str] = {
    "all_reduce": "ALLREDUCE",
    "allreduce": "ALLREDUCE",
    "all_reduce_barrier": "BARRIER",
    "barrier": "BARRIER",
    "all_reduce_coalesced": "ALLREDUCE_COALESCED",
    "allreduce_coalesced": "ALLREDUCE_COALESCED",
    "_allreduce_sparse": "_ALLREDUCE_SPARSE",
    "broadcast": "BROADCAST",
    "reduce": "REDUCE",
    "all_gather": "ALLGATHER",
    "allgather": "ALLGATHER",
    "_all_gather_base": "_ALLGATHER_BASE",
    "_allgather_base": "_ALLGATHER_BASE",
    "all_gather_into_tensor": "_ALLGATHER_BASE",
    "all_gather_coalesced": "ALLGATHER_COALESCED",
    "allgather_coalesced": "ALLGATHER_COALESCED",
    "allgather_into_tensor_coalesced": "ALLGATHER_COALESCED",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "reduce_scatter": "REDUCE_SCATTER",
    "_reduce_scatter_base": "_REDUCE_SCATTER_BASE",
    "reduce_scatter_tensor": "_REDUCE_SCATTER_BASE",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER_COALESCED",
    "all_to_all": "ALLTOALL",
    "alltoall": "ALLTOALL",
    "all_to_all_single": "ALLTOALL_BASE",
    "alltoall_base": "ALLTOALL_BASE",
    "coalesced": "COALESCED",
    "send": "SEND",
    "recv": "RECV",
    "recvanysource": "RECVANYSOURCE",
}
P2P_OPS = frozenset({"SEND", "RECV", "RECVANYSOURCE"})

_P2P_PEERS = re.compile(r"^(?:send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)")
# The PyTorch FR tutorial prints "JSON" with a Python tuple for process_group; accept that spelling.
_TUPLE_VALUE = re.compile(r'("process_group"\s*:\s*)\(([^()]*)\)')


class FlightRecorderError(ValueError):
    """The input is not a Flight Recorder dump this parser can read."""


def parse_flight_recorder(item: InputFile, doc: object | None = None, total_entries: int | None = None) -> tuple[pl.DataFrame, dict]:
    """Events and a summary (`version`, `rank`, `entries`, `pgs`, `status`, `reason`) of one dump.

    `doc` is the dump already decoded by the caller (the pickle dispatcher unpickles once to tell
    a memory snapshot from a dump, or decodes only the entries kept: `fr_partial`, which then
    gives the number of entries in the dump, `total_entries`); without it the file is read and
    decoded here. Never raises for bad content: an unreadable, refused or malformed dump returns
    no events with `status="error"` and the reason, so one bad file cannot abort the job.
    """
    rows, info = flight_recorder_rows(item, doc, total_entries)
    return (rows_frame([rows]) if rows is not None else empty_events()), info


def flight_recorder_rows(item: InputFile, doc: object | None = None, total_entries: int | None = None) -> tuple[DumpRows | None, dict]:
    """`parse_flight_recorder` with the events left as column lists (None: no events, see `info`),
    for a caller that builds one frame for many dumps (`rows_frame`)."""
    rank = item.rank_hint if item.rank_hint is not None else rank_from_name(item.path, digits=True)
    info: dict[str, Any] = {"status": "error", "reason": "", "rank": rank, "ranks": [], "entries": 0}
    try:
        if item.size > MAX_DUMP_BYTES:  # refused before reading: a sparse file of holes costs nothing
            raise FlightRecorderError(f"dump is {item.size} bytes, more than the {MAX_DUMP_BYTES}-byte limit")
        if doc is None:
            doc = decode_dump(item.read_all(MAX_DUMP_BYTES), item.format)
    except UnsafePickleError as exc:
        info["reason"] = f"unsafe pickle, not loaded: {exc}"
        return None, info
    except (CorruptPickleError, FlightRecorderError) as exc:
        info["reason"] = str(exc)
        return None, info
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        info["reason"] = f"cannot read: {exc}"
        return None, info
    try:
        rows, summary = dump_rows(doc, file=item.path, rank=rank, total_entries=total_entries)
    except FlightRecorderError as exc:
        info["reason"] = str(exc)
        return None, info
    info.update(summary)
    if rank is None:
        info["status"] = "partial"
        info["reason"] = "; ".join(filter(None, [info["reason"], "rank unknown: the file name carries no rank number"]))
    return rows, info


def decode_dump(data: bytes, fmt: str = "") -> object:
    """Bytes of a dump -> the Python document (pickle through the restricted loader, or JSON)."""
    if fmt == "pickle" or data[:1] == b"\x80":
        return load_untrusted_pickle(data, max_bytes=MAX_DUMP_BYTES)
    text = data.decode("utf-8", errors="replace")
    with address_space():  # `[[],[],...]` is 56 bytes of objects per 2 bytes of JSON
        try:
            return json.loads(text)
        except ValueError:
            pass
        repaired = _TUPLE_VALUE.sub(r"\1[\2]", text)
        try:
            return json.loads(repaired)
        except ValueError as exc:
            raise FlightRecorderError(f"neither a pickle nor valid JSON: {exc}") from exc


def flight_recorder_events(doc: object, *, file: str, rank: int | None) -> tuple[pl.DataFrame, dict]:
    """Canonical events of one decoded dump (see the module docstring for the layouts accepted)."""
    rows, summary = dump_rows(doc, file=file, rank=rank)
    return rows_frame([rows]), summary


def dump_rows(doc: object, *, file: str, rank: int | None, total_entries: int | None = None) -> tuple[DumpRows, dict]:
    """The events of one decoded dump as column lists, and its summary. `total_entries`: the number
    of entries in the dump when `doc` holds only those kept (`fr_partial`)."""
    ignored: list[str] = []
    if isinstance(doc, list):
        if doc and not any(isinstance(e, Mapping) and ("profiling_name" in e or "seq_id" in e) for e in doc[:16]):
            raise FlightRecorderError("not a Flight Recorder dump: a list without collective entries")
        version, entries, pg_config, pg_status, comm_version = "pre-1.0 (bare list)", doc, {}, {}, None
    elif isinstance(doc, Mapping):
        if not any(key in doc for key in ("entries", "pg_config", "pg_status", "version")):
            raise FlightRecorderError("not a Flight Recorder dump: no entries, pg_config or version key")
        version = field_text(doc.get("version"))
        entries = doc.get("entries") or []
        pg_config = _mapping_field(doc, "pg_config", ignored)
        pg_status = _mapping_field(doc, "pg_status", ignored)
        comm_version = field_text(doc.get("comm_lib_version") or doc.get("nccl_version"))
    else:
        raise FlightRecorderError(f"not a Flight Recorder dump: top level is {type(doc).__name__}")
    if not isinstance(entries, list):
        raise FlightRecorderError("not a Flight Recorder dump: 'entries' is not a list")
    entries = [e for e in entries if type(e) is dict or isinstance(e, Mapping)]  # the ABC check only for odd types
    if total_entries is None:
        total_entries = len(entries)
    entries = _recent_per_pg(entries)
    members = pg_members(pg_config)
    entry_columns = _entry_columns(entries, members, rank)
    status_columns = _status_columns(pg_config, pg_status, members, rank)
    rows = DumpRows(file, rank, [(len(entries), entry_columns), (len(status_columns.get("pg", [])), status_columns)])
    pgs = sorted(
        set(members) | {field_text(k) for k in pg_status} | {pg for pg in entry_columns.get("pg", []) if pg is not None},
        key=pg_sort_key,
    )
    summary = {
        "status": "partial" if ignored else "parsed",
        "reason": "; ".join(ignored),
        "version": version,
        "comm_lib_version": comm_version,
        "rank": rank,
        "ranks": [rank] if rank is not None else [],
        "entries": total_entries,
        "entries_kept": len(entries),
        "pgs": pgs,
        "pg_sizes": {pg: len(ranks) for pg, ranks in members.items()},
    }
    return rows, summary


def _mapping_field(doc: Mapping, key: str, ignored: list[str]) -> Mapping:
    """A per-PG table of the dump; one of another type is noted and dropped, the entries still count."""
    value = doc.get(key)
    if isinstance(value, Mapping):
        return value
    if value:
        ignored.append(f"'{key}' is a {type(value).__name__}, not a mapping: ignored")
    return {}


# A hang is decided by the last collectives of each process group; a full ring buffer (thousands of
# completed entries per rank, x16k ranks) adds nothing but memory. Keep the newest entries per group.
ENTRIES_KEPT_PER_PG = 64


def _recent_per_pg(entries: list[Mapping]) -> list[Mapping]:
    if len(entries) <= ENTRIES_KEPT_PER_PG:
        return entries
    # 2.x pickles hold `process_group` as a (name, desc) tuple: read it inline, the helper only for
    # the other layouts. This runs over every entry of every dump (16k ranks x 2k entries).
    groups = [e.get("process_group") for e in entries]
    pgs = [g[0] if type(g) is tuple and g and type(g[0]) is str else _pg_of(e) for g, e in zip(groups, entries)]
    if len(set(pgs)) == 1:
        return entries[-ENTRIES_KEPT_PER_PG:]
    seen: dict[str | None, int] = {}
    keep = [False] * len(entries)
    for index in range(len(entries) - 1, -1, -1):
        pg = pgs[index]
        count = seen.get(pg, 0)
        if count < ENTRIES_KEPT_PER_PG:
            seen[pg] = count + 1
            keep[index] = True
    return [entry for entry, kept in zip(entries, keep) if kept]


@dataclass
class DumpRows:
    """One dump's events as column lists: (row count, columns) per part, entries then pg status."""

    file: str
    rank: int | None
    parts: list[tuple[int, dict[str, list]]]

    @property
    def height(self) -> int:
        return sum(n for n, _ in self.parts)

    @property
    def ranks(self) -> list[int]:
        return [self.rank] if self.rank is not None and self.height else []


def rows_frame(dumps: list[DumpRows]) -> pl.DataFrame:
    """One frame for many dumps straight from their column lists: at 16k dumps per job, per-dump
    polars overhead (a frame each, then their concat) would cost more than the entries themselves."""
    constants = {"source": "flight_recorder", "severity": "info"}
    total = sum(d.height for d in dumps)
    series = []
    for name, dtype in EVENT_SCHEMA.items():
        if name in constants:
            values: list = [constants[name]] * total
        elif name in ("file", "rank"):
            values = []
            for dump in dumps:
                values.extend([getattr(dump, name)] * dump.height)
        else:
            values = []
            for dump in dumps:
                for n, columns in dump.parts:
                    values.extend(columns.get(name) or [None] * n)
        if name == "ts":
            series.append(pl.Series(name, values, dtype=pl.Int64).cast(UTC_TS))  # epoch microseconds
        elif dtype == pl.String:
            series.append(_shared_strings(name, values))
        else:
            series.append(pl.Series(name, values, dtype=dtype))
    return pl.DataFrame(series)


def _shared_strings(name: str, values: list[str | None]) -> pl.Series:
    """A string column whose rows share the bytes of equal values. A dump repeats a handful of
    texts (the same stack, op, state and file on every entry): gathered from the distinct values,
    every row is a 16-byte view into one copy of each, so 16k dumps x 65 events stay compact through
    the pool's transfer, the concatenation and every later filter."""
    codes: dict[str | None, int] = {}
    index = [codes.setdefault(v, len(codes)) for v in values]
    return pl.Series(name, list(codes), dtype=pl.String).gather(pl.Series(index, dtype=pl.UInt32))


# --- entries ------------------------------------------------------------------------------------


def _entry_columns(entries: list[Mapping], members: dict[str, tuple[int, ...]], rank: int | None) -> dict[str, list]:
    n = len(entries)
    if not n:
        return {}
    names = [field_text(e.get("profiling_name")) or "" for e in entries]
    parsed = {name: _op_of(name) for name in set(names)}  # a dump repeats a handful of names
    bare = [parsed[name][0] for name in names]
    ops = [parsed[name][1] for name in names]
    is_p2p = [_is_p2p(e.get("is_p2p"), op) for e, op in zip(entries, ops)]
    coll_seq = _int_column([e["collective_seq_id"] if "collective_seq_id" in e else e.get("seq_id") for e in entries])
    p2p_seq = _int_column([e.get("p2p_seq_id") for e in entries])
    seq = [p if (flag and p is not None) else c for flag, p, c in zip(is_p2p, p2p_seq, coll_seq)]
    pgs = [_pg_of(e) for e in entries]
    states = [field_text(e.get("state")) for e in entries]
    in_sizes = [e.get("input_sizes") or [] for e in entries]
    out_sizes = [e.get("output_sizes") or [] for e in entries]
    in_ok = [_shapes_ok(s) for s in in_sizes]  # checked once, read by the numel and the record text
    out_ok = [_shapes_ok(s) for s in out_sizes]
    in_dtypes = _dtype_column(entries, "input_dtypes")
    out_dtypes = _dtype_column(entries, "output_dtypes")
    created = [_created_ns(e) for e in entries]
    own = {pg: pg_rank_of(members.get(pg), rank) for pg in set(pgs)}
    records = [
        f"pg {pg} #{s} {op} state={st} in={_sizes_text(i, iok)} {idt} out={_sizes_text(o, ook)} {odt} ({name})"
        for pg, s, op, st, i, iok, idt, o, ook, odt, name
        in zip(pgs, seq, ops, states, in_sizes, in_ok, in_dtypes, out_sizes, out_ok, out_dtypes, names)
    ]
    sizes = {pg: len(ranks) for pg, ranks in members.items()}
    return {
        "line": list(range(1, n + 1)),
        "ts": [ns // 1000 if ns is not None else None for ns in created],
        "ts_source": ["flight_recorder" if ns is not None else None for ns in created],
        "kind": ["fr.entry"] * n,
        "pg": pgs,
        "pg_rank": [own[pg] for pg in pgs],
        "nranks": [sizes.get(pg) for pg in pgs],
        "seq": seq,
        "op": ops,
        "numel_in": _numel_column(in_sizes, in_ok),
        "numel_out": _numel_column(out_sizes, out_ok),
        "timeout_ms": _int_column([e.get("timeout_ms") for e in entries]),
        "code": states,
        "message": records,
        # A dump entry has no line of text: its evidence quotes the record (pg, seq, op, sizes,
        # dtypes, state, the profiling name), not the bare `nccl:all_reduce`.
        "text": records,
        "peer": [_p2p_peer(b, members.get(pg)) if flag else None for b, flag, pg in zip(bare, is_p2p, pgs)],
        "detail": _frames_column(entries),
    }


def _op_of(name: str) -> tuple[str, str]:
    """`nccl:all_reduce` -> (the name after the backend, the WorkNCCL op type)."""
    bare = name.split(":", 1)[1].strip() if ":" in name else name.strip()
    base = bare.split(" ", 1)[0].lower()
    return bare, OP_NAMES.get(base) or base.upper()


def _int_column(values: list) -> list[int | None]:
    """`int64` of each value, with the common case (an int64 int) inline: this runs per entry."""
    return [v if type(v) is int and INT64_MIN <= v <= INT64_MAX else int64(v) for v in values]


def _status_columns(
    pg_config: Mapping, pg_status: Mapping, members: dict[str, tuple[int, ...]], rank: int | None
) -> dict[str, list]:
    """One event per process group named by pg_config or pg_status (membership even without status).

    `ranks_ref` carries the PG's global ranks. Every dump repeats the whole pg_config, so for big
    groups (more than INLINE_MEMBERS ranks) only the dumps of the group's PG ranks 0 and 1 carry
    the list: 16k dumps x a 16k-rank default group would otherwise be 268M list elements.
    `nranks` is always set.
    """
    names = sorted({field_text(k) for k in pg_config} | {field_text(k) for k in pg_status}, key=pg_sort_key)
    status = {field_text(k): v for k, v in pg_status.items() if isinstance(v, Mapping)}
    config = {field_text(k): v for k, v in pg_config.items() if isinstance(v, Mapping)}
    columns: dict[str, list] = {
        key: [] for key in ("kind", "line", "pg", "pg_rank", "nranks", "last_enqueued", "last_completed", "ranks_ref", "message", "detail")
    }
    for pg in names:  # one row per process group: a handful per dump
        st = status.get(pg, {})
        enq = _status_int(st.get("last_enqueued_collective"))
        started = _status_int(st.get("last_started_collective"))
        done = _status_int(st.get("last_completed_collective"))
        ranks = members.get(pg)
        desc = field_text(config.get(pg, {}).get("desc"))
        pg_rank = pg_rank_of(ranks, rank)
        inline = ranks is not None and (len(ranks) <= INLINE_MEMBERS or rank is None or pg_rank in (0, 1))
        label = f"pg {pg}" + (f" ({desc})" if desc else "")
        if st:
            message = (
                f"{label} last enqueued {_fmt_seq(enq)}, last started {_fmt_seq(started)}, "
                f"last completed {_fmt_seq(done)}"
            )
        else:
            message = f"{label} (no status in dump)"
        if ranks is not None:
            message += f"; ranks {ranks_text(ranks)}"
        for key, value in (
            ("kind", "fr.pg_status"), ("line", 0), ("pg", pg), ("pg_rank", pg_rank),
            ("nranks", len(ranks) if ranks is not None else None), ("last_enqueued", enq), ("last_completed", done),
            ("ranks_ref", list(ranks) if inline else None), ("message", message), ("detail", desc),
        ):
            columns[key].append(value)
    return columns


# --- columns: a fast comprehension for well-formed dumps, a tolerant one when it trips -------------
# The fast paths matter: at 16k ranks x 2k entries every microsecond per entry is half a minute.


# A hostile dump may hold anything where these fields are: numbers past int64, strings where dims
# belong (`math.prod([10**9, "a"])` is a 1 GB string), or one list shared at every level (600 bytes
# of pickle whose str() never ends). The fast paths run only on the shapes PyTorch writes; anything
# else takes the bounded helpers.
MAX_TENSORS = 64
MAX_DIMS = 16
MAX_FRAMES = 64


def _frames_column(entries: list[Mapping]) -> list[str | None]:
    """The stack of each entry. The recorder shares one dict per distinct frame between entries (one
    memo entry each in the pickle), so a stack is joined once per distinct run of frame objects."""
    texts: dict[tuple[int, ...], str | None] = {}
    column = []
    try:
        for entry in entries:
            frames = entry["frames"][:MAX_FRAMES]
            key = tuple(map(id, frames))  # the entries keep every frame alive: ids are stable here
            text = texts.get(key, _UNSEEN)
            if text is _UNSEEN:
                text = texts[key] = " <- ".join(
                    [f"{_plain(f['name'])} ({_plain(f['filename'])}:{_plain(f['line'])})" for f in frames]
                ) or None
            column.append(text)
    except (KeyError, TypeError):
        return [_frames_text(e.get("frames")) for e in entries]
    return column


_UNSEEN = object()


def _plain(value: object) -> object:
    """A frame field for an f-string: str and small ints as they are; anything else bounded, or refused."""
    if type(value) is str:
        if len(value) > 1024:
            raise TypeError("long frame field")
        return value
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    raise TypeError("odd frame field")


def _shapes_ok(sizes: object) -> bool:
    """True for a list of at most MAX_TENSORS shapes, each a list of at most MAX_DIMS int64 ints."""
    if type(sizes) is not list or len(sizes) > MAX_TENSORS:
        return False
    for shape in sizes:
        if type(shape) is not list or len(shape) > MAX_DIMS:
            return False
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= INT64_MAX:
                return False
    return True


def _numel_column(sizes: list, ok: list[bool]) -> list[int | None]:
    numels = [sum(map(math.prod, s)) if good else None for s, good in zip(sizes, ok)]
    return [n if n is None or n <= INT64_MAX else None for n in numels]


def _dtype_column(entries: list[Mapping], key: str) -> list[str]:
    try:
        return [(",".join(e[key]) or "-") if len(e[key]) <= MAX_TENSORS else _dtypes(e[key]) for e in entries]
    except (KeyError, TypeError):
        return [_dtypes(e.get(key)) for e in entries]


# --- field helpers (called once per entry: keep them cheap) ---------------------------------------


def _pg_of(entry: Mapping) -> str | None:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return field_text(group[0])
    if isinstance(group, str):
        return field_text(group)
    pg_id = entry.get("pg_id")
    return None if pg_id is None else field_text(pg_id)  # pre-2.2 dumps: the local index, "0" = default PG


def _is_p2p(flag: object, op: str) -> bool:
    if flag is None:
        return op in P2P_OPS
    return bool(flag)


def _status_int(value: object) -> int | None:
    number = int64(value)
    return None if number is None or number < 0 else number  # -1 = "none yet"


def _created_ns(entry: Mapping) -> int | None:
    ns = entry.get("time_created_ns")
    if ns is None and entry.get("time_created_us") is not None:
        us = int64(entry.get("time_created_us"))
        ns = us * 1000 if us else None
    ns = int64(ns)
    return ns if ns else None  # None and 0 both mean "unknown"


def _sizes_text(sizes: object, ok: bool) -> str:
    text = (str(sizes) if ok else bounded_str(sizes, 512)).replace(" ", "")
    return text.replace("(", "[").replace(")", "]") if "(" in text else text


def _dtypes(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(field_text(v) or "None" for v in value[:MAX_TENSORS]) or "-"
    return "-" if value is None else (field_text(value) or "-")


def _frames_text(frames: object) -> str | None:
    if not frames or not isinstance(frames, list):
        return None
    parts = []
    for frame in frames[:MAX_FRAMES]:
        if isinstance(frame, Mapping):
            line = frame.get("line")
            where = f"{field_text(frame.get('filename'))}" if line is None else f"{field_text(frame.get('filename'))}:{field_text(line)}"
            parts.append(f"{field_text(frame.get('name'))} ({where})")
    return " <- ".join(parts) or None


def _p2p_peer(bare_name: str, ranks: tuple[int, ...] | None) -> str | None:
    match = _P2P_PEERS.match(bare_name)
    if not match:
        return None
    peer = int64(match.group(2))
    if peer is None:
        return None  # `send me->peer`, `recv me<-peer`; PG ranks
    if ranks and 0 <= peer < len(ranks):
        return f"rank {ranks[peer]}"
    return f"pg rank {peer}"


def _fmt_seq(value: int | None) -> str:
    return "none" if value is None else f"#{value}"
