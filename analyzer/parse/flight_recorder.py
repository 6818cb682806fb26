"""Stage 2, parse (Flight Recorder): PyTorch NCCL Flight Recorder dumps -> canonical events.

A dump is one rank's ring buffer of recent collectives plus its process-group configuration and
status. It comes as a pickle (read only through `analyzer.safepickle`, never `pickle.load`) or as
the JSON variant, in every layout PyTorch has written since 2.2 (FORMATS.md section 5): a bare
list with `seq_id`/`time_created_us`, the 1.x dicts, the 2.x dicts with
`collective_seq_id`/`p2p_seq_id`, `nccl_version` or `comm_lib_version`, `pg_status` values as
strings in JSON, `pg_config.ranks` as a JSON string, `process_group` as tuple or list.

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
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from analyzer.discover import DecompressionLimit, InputFile
from analyzer.events import EVENT_SCHEMA, UTC_TS, conform, concat_events, empty_events
from analyzer.safepickle import CorruptPickleError, UnsafePickleError, load_untrusted_pickle

MAX_DUMP_BYTES = 1 << 30

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
_RANK_WORD = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)", re.IGNORECASE)
_TRAILING_DIGITS = re.compile(r"(\d+)$")
_DUMP_SUFFIXES = (".gz", ".pkl", ".pickle", ".json", ".pt", ".bin", ".txt")
# The PyTorch FR tutorial prints "JSON" with a Python tuple for process_group; accept that spelling.
_TUPLE_VALUE = re.compile(r'("process_group"\s*:\s*)\(([^()]*)\)')


class FlightRecorderError(ValueError):
    """The input is not a Flight Recorder dump this parser can read."""


def parse_flight_recorder(item: InputFile) -> tuple[pl.DataFrame, dict]:
    """Events and a summary (`version`, `rank`, `entries`, `pgs`, `status`, `reason`) of one dump.

    Never raises for bad content: an unreadable, refused or malformed dump returns no events
    with `status="error"` and the reason, so one bad file cannot abort the job.
    """
    rank = item.rank_hint if item.rank_hint is not None else rank_from_name(item.path)
    info: dict[str, Any] = {"status": "error", "reason": "", "rank": rank, "ranks": [], "entries": 0}
    try:
        data = item.read_all(MAX_DUMP_BYTES)
        doc = decode_dump(data, item.format)
    except UnsafePickleError as exc:
        info["reason"] = f"unsafe pickle, not loaded: {exc}"
        return empty_events(), info
    except (CorruptPickleError, FlightRecorderError) as exc:
        info["reason"] = str(exc)
        return empty_events(), info
    except (ValueError, OSError, EOFError, zlib.error, DecompressionLimit) as exc:
        info["reason"] = f"cannot read: {exc}"
        return empty_events(), info
    try:
        events, summary = flight_recorder_events(doc, file=item.path, rank=rank)
    except FlightRecorderError as exc:
        info["reason"] = str(exc)
        return empty_events(), info
    info.update(summary)
    if rank is None:
        info["status"] = "partial"
        info["reason"] = "rank unknown: the file name carries no rank number"
    return events, info


def rank_from_name(path: str) -> int | None:
    """Global rank from a dump's file name: prefix + rank (`nccl_trace_rank_3`, `node12_..._rank_3`)."""
    name = PurePosixPath(path.split("!")[-1]).name
    stem = name
    for _ in range(3):  # `x_rank0.pkl.gz`
        lowered = stem.lower()
        suffix = next((s for s in _DUMP_SUFFIXES if lowered.endswith(s)), None)
        if suffix is None:
            break
        stem = stem[: -len(suffix)]
    words = _RANK_WORD.findall(stem)
    if words:
        return int(words[-1])  # host prefixes come first (`node12_nccl_trace_rank_3`): the last one is the rank
    match = _TRAILING_DIGITS.search(stem)
    return int(match.group(1)) if match else None


def decode_dump(data: bytes, fmt: str = "") -> object:
    """Bytes of a dump -> the Python document (pickle through the restricted loader, or JSON)."""
    if fmt == "pickle" or data[:1] == b"\x80":
        return load_untrusted_pickle(data, max_bytes=MAX_DUMP_BYTES)
    text = data.decode("utf-8", errors="replace")
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
    if isinstance(doc, list):
        if doc and not any(isinstance(e, Mapping) and ("profiling_name" in e or "seq_id" in e) for e in doc[:16]):
            raise FlightRecorderError("not a Flight Recorder dump: a list without collective entries")
        version, entries, pg_config, pg_status, comm_version = "pre-1.0 (bare list)", doc, {}, {}, None
    elif isinstance(doc, Mapping):
        if not any(key in doc for key in ("entries", "pg_config", "pg_status", "version")):
            raise FlightRecorderError("not a Flight Recorder dump: no entries, pg_config or version key")
        version = _text(doc.get("version"))
        entries = doc.get("entries") or []
        pg_config = doc.get("pg_config") or {}
        pg_status = doc.get("pg_status") or {}
        comm_version = _text(doc.get("comm_lib_version") or doc.get("nccl_version"))
    else:
        raise FlightRecorderError(f"not a Flight Recorder dump: top level is {type(doc).__name__}")
    if not isinstance(entries, list):
        raise FlightRecorderError("not a Flight Recorder dump: 'entries' is not a list")
    entries = [e for e in entries if isinstance(e, Mapping)]
    members = _pg_members(pg_config)
    frames = [_entry_events(entries, members, file=file, rank=rank), _status_events(pg_config, pg_status, members, file=file, rank=rank)]
    events = concat_events(frames)
    pgs = sorted(set(members) | {str(k) for k in pg_status} | set(events.get_column("pg").drop_nulls().unique().to_list()))
    summary = {
        "status": "parsed",
        "reason": "",
        "version": version,
        "comm_lib_version": comm_version,
        "rank": rank,
        "ranks": [rank] if rank is not None else [],
        "entries": len(entries),
        "pgs": pgs,
        "pg_ranks": {pg: ranks for pg, ranks in members.items()},
    }
    return events, summary


# --- entries ------------------------------------------------------------------------------------


def _entry_events(entries: list[Mapping], members: dict[str, list[int]], *, file: str, rank: int | None) -> pl.DataFrame:
    n = len(entries)
    if not n:
        return empty_events()
    names = [str(e.get("profiling_name") or "") for e in entries]
    bare = [name.split(":", 1)[1].strip() if ":" in name else name.strip() for name in names]
    bases = [b.split(" ", 1)[0].lower() for b in bare]
    ops = [OP_NAMES.get(b) or b.upper() for b in bases]
    is_p2p = [_is_p2p(e.get("is_p2p"), op) for e, op in zip(entries, ops)]
    coll_seq = [_int(e["collective_seq_id"] if "collective_seq_id" in e else e.get("seq_id")) for e in entries]
    p2p_seq = [_int(e.get("p2p_seq_id")) for e in entries]
    seq = [p if (flag and p is not None) else c for flag, p, c in zip(is_p2p, p2p_seq, coll_seq)]
    pgs = [_pg_of(e) for e in entries]
    states = [_text(e.get("state")) for e in entries]
    in_sizes = [e.get("input_sizes") or [] for e in entries]
    out_sizes = [e.get("output_sizes") or [] for e in entries]
    in_dtypes = _dtype_column(entries, "input_dtypes")
    out_dtypes = _dtype_column(entries, "output_dtypes")
    created = [_created_ns(e) for e in entries]
    timeout = [_int(e.get("timeout_ms")) for e in entries]
    pg_index = {pg: {g: i for i, g in enumerate(ranks)} for pg, ranks in members.items()}
    own_pg_rank = [pg_index.get(pg, {}).get(rank) if rank is not None else None for pg in pgs]
    peers = [_p2p_peer(b, members.get(pg)) if flag else None for b, flag, pg in zip(bare, is_p2p, pgs)]
    messages = [
        f"pg {pg} #{s} {op} state={st} in={_sizes_text(i)} {idt} out={_sizes_text(o)} {odt} ({name})"
        for pg, s, op, st, i, idt, o, odt, name in zip(pgs, seq, ops, states, in_sizes, in_dtypes, out_sizes, out_dtypes, names)
    ]
    frame = pl.DataFrame(
        {
            "line": range(1, n + 1),
            "ts_ns": created,
            "pg": pgs,
            "pg_rank": own_pg_rank,
            "nranks": [len(members[pg]) if pg in members else None for pg in pgs],
            "seq": seq,
            "op": ops,
            "numel_in": _numel_column(in_sizes),
            "numel_out": _numel_column(out_sizes),
            "timeout_ms": timeout,
            "code": states,
            "message": messages,
            "text": names,
            "peer": peers,
            "detail": _frames_column(entries),
        },
        schema_overrides={
            "line": pl.Int64, "ts_ns": pl.Int64, "pg": pl.String, "pg_rank": pl.Int64, "nranks": pl.Int64,
            "seq": pl.Int64, "op": pl.String, "numel_in": pl.Int64, "numel_out": pl.Int64, "timeout_ms": pl.Int64,
            "code": pl.String, "message": pl.String, "text": pl.String, "peer": pl.String, "detail": pl.String,
        },
        strict=False,
    )
    frame = frame.with_columns(
        _ns_to_ts(pl.col("ts_ns")).alias("ts"),
        pl.when(pl.col("ts_ns").is_not_null()).then(pl.lit("flight_recorder")).alias("ts_source"),
        pl.lit(file).alias("file"),
        pl.lit(rank, dtype=pl.Int64).alias("rank"),
        pl.lit("flight_recorder").alias("source"),
        pl.lit("fr.entry").alias("kind"),
        pl.lit("info").alias("severity"),
    )
    return conform(frame)


def _status_events(
    pg_config: Mapping, pg_status: Mapping, members: dict[str, list[int]], *, file: str, rank: int | None
) -> pl.DataFrame:
    """One event per process group named by pg_config or pg_status (membership even without status)."""
    names = sorted({str(k) for k in pg_config} | {str(k) for k in pg_status}, key=_pg_sort_key)
    if not names:
        return empty_events()
    status = {str(k): v for k, v in pg_status.items() if isinstance(v, Mapping)}
    config = {str(k): v for k, v in pg_config.items() if isinstance(v, Mapping)}
    rows = []
    for pg in names:  # one row per process group: a handful per dump
        st = status.get(pg, {})
        enq = _status_int(st.get("last_enqueued_collective"))
        started = _status_int(st.get("last_started_collective"))
        done = _status_int(st.get("last_completed_collective"))
        ranks = members.get(pg)
        desc = _text(config.get(pg, {}).get("desc"))
        pg_rank = ranks.index(rank) if ranks and rank in ranks else None
        label = f"pg {pg}" + (f" ({desc})" if desc else "")
        if st:
            message = (
                f"{label} last enqueued {_fmt_seq(enq)}, last started {_fmt_seq(started)}, "
                f"last completed {_fmt_seq(done)}"
            )
        else:
            message = f"{label} (no status in dump)"
        if ranks is not None:
            message += f"; ranks {_ranks_text(ranks)}"
        rows.append(
            {
                "file": file, "line": 0, "rank": rank, "source": "flight_recorder", "kind": "fr.pg_status",
                "severity": "info", "pg": pg, "pg_rank": pg_rank, "nranks": len(ranks) if ranks is not None else None,
                "last_enqueued": enq, "last_completed": done, "ranks_ref": ranks, "message": message, "detail": desc,
            }
        )
    return pl.DataFrame(rows, schema={k: EVENT_SCHEMA[k] for k in rows[0]}).pipe(conform)


# --- columns: a fast comprehension for well-formed dumps, a tolerant one when it trips -------------
# The fast paths matter: at 16k ranks x 2k entries every microsecond per entry is half a minute.


def _frames_column(entries: list[Mapping]) -> list[str | None]:
    try:
        return [" <- ".join([f"{f['name']} ({f['filename']}:{f['line']})" for f in e["frames"]]) or None for e in entries]
    except (KeyError, TypeError):
        return [_frames_text(e.get("frames")) for e in entries]


def _numel_column(sizes: list) -> list[int | None]:
    try:
        return [sum(map(math.prod, s)) for s in sizes]
    except TypeError:
        return [_numel(s) for s in sizes]


def _dtype_column(entries: list[Mapping], key: str) -> list[str]:
    try:
        return [",".join(e[key]) or "-" for e in entries]
    except (KeyError, TypeError):
        return [_dtypes(e.get(key)) for e in entries]


# --- field helpers (called once per entry: keep them cheap) ---------------------------------------


def _pg_of(entry: Mapping) -> str | None:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    if isinstance(group, str):
        return group
    pg_id = entry.get("pg_id")
    return None if pg_id is None else str(pg_id)  # pre-2.2 dumps: the local index, "0" = default PG


def _is_p2p(flag: object, op: str) -> bool:
    if flag is None:
        return op in P2P_OPS
    return bool(flag)


def _int(value: object) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(value)  # JSON dumps store some numbers as strings
    except (TypeError, ValueError):
        return None


def _status_int(value: object) -> int | None:
    number = _int(value)
    return None if number is None or number < 0 else number  # -1 = "none yet"


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _created_ns(entry: Mapping) -> int | None:
    ns = entry.get("time_created_ns")
    if ns is None and entry.get("time_created_us") is not None:
        us = _int(entry.get("time_created_us"))
        ns = us * 1000 if us else None
    ns = _int(ns)
    return ns if ns else None  # None and 0 both mean "unknown"


def _numel(sizes: object) -> int | None:
    if not isinstance(sizes, (list, tuple)):
        return None
    try:
        return sum(math.prod(shape) for shape in sizes)
    except TypeError:
        return None


def _sizes_text(sizes: object) -> str:
    return str(sizes).replace(" ", "").replace("(", "[").replace(")", "]")


def _dtypes(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


def _frames_text(frames: object) -> str | None:
    if not frames or not isinstance(frames, list):
        return None
    parts = []
    for frame in frames:
        if isinstance(frame, Mapping):
            line = frame.get("line")
            where = f"{frame.get('filename')}" if line is None else f"{frame.get('filename')}:{line}"
            parts.append(f"{frame.get('name')} ({where})")
    return " <- ".join(parts) or None


def _p2p_peer(bare_name: str, ranks: list[int] | None) -> str | None:
    match = _P2P_PEERS.match(bare_name)
    if not match:
        return None
    peer = int(match.group(2))  # `send me->peer`, `recv me<-peer`; PG ranks
    if ranks and 0 <= peer < len(ranks):
        return f"rank {ranks[peer]}"
    return f"pg rank {peer}"


def _pg_members(pg_config: Mapping) -> dict[str, list[int]]:
    members: dict[str, list[int]] = {}
    for key, config in pg_config.items():
        if not isinstance(config, Mapping):
            continue
        ranks = config.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                ranks = [int(r) for r in re.findall(r"-?\d+", ranks)]
        if isinstance(ranks, (list, tuple)):
            parsed = [r for r in (_int(x) for x in ranks) if r is not None]
            members[str(config.get("name", key))] = parsed
            members.setdefault(str(key), parsed)
    return members


def _pg_sort_key(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _fmt_seq(value: int | None) -> str:
    return "none" if value is None else f"#{value}"


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) <= 16:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return f"[{ranks[0]}, {ranks[1]}, ... {ranks[-1]}] ({len(ranks)} ranks)"


def _ns_to_ts(expr: pl.Expr) -> pl.Expr:
    # Epoch ns -> microsecond UTC datetimes, the canonical ts dtype.
    return (expr // 1000).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").cast(UTC_TS)
