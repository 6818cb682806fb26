"""Stage 2, parse (Nsight Systems): `nsys export --type sqlite` databases and `nsys stats` CSVs.

An nsys profile usually wraps the whole launcher, so one export holds every process of a node:
each process with GPU activity becomes a timeline unit (its pid and CUDA device; the global rank
is filled in by correlate from NCCL's `host:pid` lines when the job's logs are there). Kernels,
memcpys and memsets come from the CUPTI tables with their names resolved through `StringIds`,
NVTX push/pop ranges give the steps (`step12`, `ProfilerStep#12`) and labels, and the CUDA
runtime table gives the allocator calls. The rows are read in batches into polars frames and
reduced by `analyzer.parse.trace_summary.summarize_timeline`, as Kineto traces are. The event a summary
cites is located by its row: `line` is the rowid in its table (kernel, memcpy, memset or NVTX
table) for an export, the line of the CSV report for `cuda_gpu_trace`.

sqlite3 needs a real file: a gzipped export or an archive member is copied, decompressed, into a
temporary file outside the analysed directory (which stays read-only) and deleted afterwards;
a plain `.sqlite` on disk is opened in place, read-only and immutable.

`nsys stats --format csv` reports: `cuda_gpu_trace` is a full per-device kernel/memcpy timeline
and is reduced like an export (the unit is the device); `cuda_gpu_kern_sum`, `cuda_api_sum` and
`nvtx_sum` become one summary event each (NCCL share of GPU time, allocator call counts, step
ranges); the other reports are recognised and skipped with the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from analyzer.bounds import cap_text, int64
from analyzer.io import InputFile, iter_text_chunks
from analyzer.events import empty_events, events_from_records
from analyzer.parse.budget import check_time, time_left
from analyzer.parse.trace_summary import FREE_CALLS, MALLOC_CALLS, NCCL_KERNEL, STEP_NAME, summarize_timeline

FETCH_ROWS = 100_000
# Rows read from one table: a GPU timeline of a few profiled steps is well under a million kernels;
# past this the export is cut (and the row says so) instead of growing memory without bound.
MAX_ROWS = 2_000_000
MAX_TEXT_CHARS = 4096  # kernel names, NVTX texts: cut inside the SELECT
MAX_SQLITE_BYTES = 16 << 30
_REQUIRED_TABLES = ("StringIds",)
_GPU_TABLES = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
    ("CUPTI_ACTIVITY_KIND_MEMSET", "memset"),
)
# nsys packs a process into globalTid/globalPid: (vm id << 56) | (pid << 24) | tid.
_TID_SPAN = 1 << 24
_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


class NotNsysExport(ValueError):
    """An SQLite database without the Nsight Systems tables."""


# --- SQLite export --------------------------------------------------------------------------------------


def parse_nsys_sqlite(item: InputFile) -> pl.DataFrame:
    with _sqlite_file(item) as path:
        # Read-only and immutable: sqlite writes no journal or lock file next to the export.
        con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro&immutable=1", uri=True)
        # Every query is interrupted once the input's time budget is spent (a crafted view, trigger
        # or expression cannot make one SELECT run for hours).
        con.set_progress_handler(_over_time, 20_000)
        try:
            return _read_export(con, item)
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                check_time()
            raise
        finally:
            con.close()


def _over_time() -> int:
    left = time_left()
    return 1 if left is not None and left <= 0 else 0


@contextlib.contextmanager
def _sqlite_file(item: InputFile) -> Iterator[str]:
    if item._disk_path is not None and item._codec is None:
        yield str(item._disk_path)
        return
    # Decompressed copy outside the job directory, removed whatever happens.
    fd, tmp = tempfile.mkstemp(prefix="postmortem-nsys-", suffix=".sqlite")
    try:
        with os.fdopen(fd, "wb") as out, item.open_bytes() as src:
            copied = 0
            while block := src.read(8 << 20):
                copied += len(block)
                if copied > MAX_SQLITE_BYTES:
                    raise ValueError(f"decompressed export larger than {MAX_SQLITE_BYTES} bytes")
                out.write(block)
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()


def _tables(con: sqlite3.Connection, notes: list[str]) -> set[str]:
    """The plain tables of the export. nsys writes no virtual tables and no generated columns: a
    table with either (computed by the reader, at any cost per row) is left unread, and noted."""
    tables = set()
    for name, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        if (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            notes.append(f"virtual table {name} not read")
            continue
        generated = [row[1] for row in con.execute("SELECT * FROM pragma_table_xinfo(?)", (name,)) if row[6] in (2, 3)]
        if generated:
            notes.append(f"table {name} has generated column(s) {', '.join(generated[:3])}: not read")
            continue
        tables.add(name)
    return tables


def _frame(con: sqlite3.Connection, sql: str, schema: dict[str, pl.DataType], params: tuple = (),
           notes: list[str] | None = None) -> pl.DataFrame:
    """A query's rows (at most MAX_ROWS), fetched in batches into polars (never one Python object
    per row kept). A value of another type than its column's (SQLite does not enforce them) is null."""
    cursor = con.execute(f"{sql} LIMIT {MAX_ROWS + 1}", params)
    frames, count = [], 0
    while rows := cursor.fetchmany(FETCH_ROWS):
        check_time()
        count += len(rows)
        frames.append(pl.DataFrame(rows, schema=schema, orient="row", strict=False))
    frame = pl.concat(frames) if frames else pl.DataFrame(schema=schema)
    if count > MAX_ROWS:
        if notes is not None:
            notes.append(f"read the first {MAX_ROWS:,} rows of a query: {sql.split(' FROM ')[-1].split()[0]} holds more")
        frame = frame.head(MAX_ROWS)
    return frame


def _read_export(con: sqlite3.Connection, item: InputFile) -> pl.DataFrame:
    notes: list[str] = []
    tables = _tables(con, notes)
    if not set(_REQUIRED_TABLES) <= tables or not any(t in tables for t, _ in _GPU_TABLES):
        raise NotNsysExport("; ".join(["SQLite database without Nsight Systems CUPTI tables (not an nsys export)", *notes]))
    names = _frame(con, f"SELECT id, substr(value, 1, {MAX_TEXT_CHARS}) FROM StringIds", {"name_id": pl.Int64, "name": pl.String},
                   notes=notes)
    gpu_schema = {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64, "gpid": pl.Int64, "name_id": pl.Int64,
                  "index": pl.Int64}
    parts = []
    for table, kind in _GPU_TABLES:
        if table not in tables:
            continue
        name_col = "shortName" if kind == "kernel" else "NULL"
        part = _frame(con, f"SELECT start, end, deviceId, streamId, globalPid, {name_col}, rowid - 1 FROM {table}", gpu_schema,
                      notes=notes)
        parts.append(part.with_columns(pl.lit(kind).alias("kind")))
    gpu = pl.concat(parts) if parts else pl.DataFrame(schema={**gpu_schema, "kind": pl.String})
    if gpu.height == 0:
        item.reason = "nsys export without GPU activity (was CUDA traced? nsys profile -t cuda)"
        return empty_events()
    gpu = gpu.join(names, on="name_id", how="left").with_columns(
        pl.when(pl.col("kind") == "kernel").then(pl.col("name")).otherwise(pl.col("kind")).alias("name")
    )
    processes = _processes(con, tables, gpu)
    gpu = gpu.join(processes.select("gpid", "unit"), on="gpid").select("unit", "kind", "name", "start", "end", "device", "stream", "index")
    marks = _nvtx(con, tables, names, processes)
    api = _alloc_calls(con, tables, names, processes)
    host = _host(con, tables)
    units = processes.select(
        "unit",
        pl.lit(None, dtype=pl.Int64).alias("rank"),
        pl.col("device").alias("local_rank"),
        "device",
        pl.lit(None, dtype=pl.Int64).alias("nranks"),
        "pid",
        pl.lit(host, dtype=pl.String).alias("host"),
        pl.lit(_session_start(con, tables), dtype=pl.Int64).alias("base_ns"),
    )
    if units.height == 1 and item.rank_hint is not None:
        units = units.with_columns(pl.lit(item.rank_hint, dtype=pl.Int64).alias("rank"))
    if notes:
        item.reason = "; ".join(notes)
    return summarize_timeline(gpu, marks, api, units, source="nsys", file=item.path)


def _processes(con: sqlite3.Connection, tables: set[str], gpu: pl.DataFrame) -> pl.DataFrame:
    """One unit per process with GPU activity: its pid and the CUDA device it mostly ran on."""
    per = (
        gpu.group_by("gpid")
        .agg(pl.col("device").mode().min().alias("device"))
        .with_columns(((pl.col("gpid") // _TID_SPAN) % _TID_SPAN).alias("pid"))
        .sort("device", "pid")
        .with_row_index("unit")
        .with_columns(pl.col("unit").cast(pl.Int64))
    )
    if "PROCESSES" in tables:
        known = _frame(con, "SELECT globalPid, pid FROM PROCESSES", {"gpid": pl.Int64, "real_pid": pl.Int64})
        per = per.join(known.unique("gpid"), on="gpid", how="left").with_columns(
            pl.coalesce("real_pid", "pid").alias("pid")
        ).drop("real_pid")
    return per


def _nvtx(con: sqlite3.Connection, tables: set[str], names: pl.DataFrame, processes: pl.DataFrame) -> pl.DataFrame:
    schema = {"start": pl.Int64, "end": pl.Int64, "gtid": pl.Int64, "text": pl.String, "text_id": pl.Int64, "index": pl.Int64}
    if "NVTX_EVENTS" not in tables:
        return pl.DataFrame(schema={"unit": pl.Int64, "name": pl.String, "start": pl.Int64, "end": pl.Int64, "index": pl.Int64})
    rows = _frame(
        con,
        f"SELECT start, end, globalTid, substr(text, 1, {MAX_TEXT_CHARS}), textId, rowid - 1 FROM NVTX_EVENTS "
        "WHERE end IS NOT NULL AND eventType IN (?, ?)",
        schema,
        _NVTX_RANGES,
    )
    return (
        rows.join(names.rename({"name_id": "text_id", "name": "by_id"}), on="text_id", how="left")
        .with_columns(
            pl.coalesce("text", "by_id").alias("name"),
            ((pl.col("gtid") // _TID_SPAN) * _TID_SPAN).alias("gpid"),
        )
        .join(processes.select("gpid", "unit"), on="gpid")
        .select("unit", "name", "start", "end", "index")
        .filter(pl.col("name").is_not_null())
    )


def _alloc_calls(con: sqlite3.Connection, tables: set[str], names: pl.DataFrame, processes: pl.DataFrame) -> pl.DataFrame:
    empty = pl.DataFrame(schema={"unit": pl.Int64, "name": pl.String, "start": pl.Int64, "end": pl.Int64})
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return empty
    wanted = names.filter(pl.col("name").str.contains(f"{MALLOC_CALLS}|{FREE_CALLS}"))
    if wanted.height == 0:
        return empty
    ids = wanted.get_column("name_id").to_list()
    marks = ",".join("?" * len(ids))
    rows = _frame(
        con,
        f"SELECT start, end, globalTid, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN ({marks})",
        {"start": pl.Int64, "end": pl.Int64, "gtid": pl.Int64, "name_id": pl.Int64},
        tuple(ids),
    )
    return (
        rows.join(wanted, on="name_id")
        .with_columns(((pl.col("gtid") // _TID_SPAN) * _TID_SPAN).alias("gpid"))
        .join(processes.select("gpid", "unit"), on="gpid")
        .select("unit", "name", "start", "end")
    )


def _host(con: sqlite3.Connection, tables: set[str]) -> str | None:
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        row = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
        if row and row[0]:
            return cap_text(str(row[0]), 256)
    return None


def _session_start(con: sqlite3.Connection, tables: set[str]) -> int | None:
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and row[0]:
            return int64(row[0])
    return None


# --- nsys stats CSV reports -------------------------------------------------------------------------------

_REPORTS = (
    # (report, columns that identify it)
    ("cuda_gpu_trace", ("Start (ns)", "Duration (ns)", "Device", "Strm", "Name")),
    ("cuda_gpu_kern_sum", ("Time (%)", "Total Time (ns)", "Instances", "Name")),
    ("cuda_api_sum", ("Time (%)", "Total Time (ns)", "Num Calls", "Name")),
    ("nvtx_sum", ("Time (%)", "Total Time (ns)", "Instances", "Range")),
    ("nvtx_gpu_proj_trace", ("Name", "Projected Start (ns)", "Projected Duration (ns)")),
)


def report_kind(header: list[str]) -> str | None:
    for name, columns in _REPORTS:
        if all(c in header for c in columns):
            return name
    return None


def parse_nsys_stats_csv(item: InputFile) -> pl.DataFrame:
    head = item.read_head(64 << 10).decode("utf-8", errors="replace")
    header = pl.read_csv(io.StringIO(head.split("\n", 1)[0] + "\n"), n_rows=0).columns
    kind = report_kind(header)
    if kind == "cuda_gpu_trace":
        return _gpu_trace(item)
    if kind in ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum"):
        table = pl.read_csv(io.BytesIO(item.read_all(256 << 20)), infer_schema_length=None)
        return {"cuda_gpu_kern_sum": _kernel_summary, "cuda_api_sum": _api_summary, "nvtx_sum": _nvtx_summary}[kind](table, item)
    item.skip(f"nsys stats report {kind or 'of an unknown kind'}: not used by the trace analyses")
    return empty_events()


def _gpu_trace(item: InputFile) -> pl.DataFrame:
    """cuda_gpu_trace: every kernel/memcpy/memset with its device; read chunk by chunk."""
    frames = []
    header = None
    rows = 1  # lines read so far (the header): a row's index is its 0-based line, cited as its line number
    for chunk in iter_text_chunks(item):
        if header is None:
            header, _, chunk = chunk.partition("\n")
        if not chunk.strip():
            continue
        table = pl.read_csv(
            io.StringIO(header + "\n" + chunk),
            columns=["Start (ns)", "Duration (ns)", "Device", "Strm", "Name"],
            schema_overrides={"Start (ns)": pl.Int64, "Duration (ns)": pl.Int64, "Device": pl.String, "Strm": pl.Int64, "Name": pl.String},
        )
        frames.append(
            table.select(
                pl.col("Device").str.extract(r"\((\d+)\)\s*$").cast(pl.Int64).alias("device"),
                pl.when(pl.col("Name").str.starts_with("[CUDA memcpy"))
                .then(pl.lit("memcpy"))
                .when(pl.col("Name").str.starts_with("[CUDA memset"))
                .then(pl.lit("memset"))
                .otherwise(pl.lit("kernel"))
                .alias("kind"),
                pl.col("Name").alias("name"),
                pl.col("Start (ns)").alias("start"),
                (pl.col("Start (ns)") + pl.col("Duration (ns)")).alias("end"),
                pl.col("Strm").alias("stream"),
                (pl.int_range(pl.len(), dtype=pl.Int64) + rows).alias("index"),
            )
        )
        rows += table.height
    gpu = pl.concat(frames).filter(pl.col("device").is_not_null()) if frames else None
    if gpu is None or gpu.height == 0:
        item.reason = "cuda_gpu_trace report without device rows"
        return empty_events()
    gpu = gpu.with_columns(pl.col("device").alias("unit"))
    units = gpu.select(pl.col("unit").unique().sort()).with_columns(
        pl.lit(None, dtype=pl.Int64).alias("rank"),
        pl.col("unit").alias("local_rank"),
        pl.col("unit").alias("device"),
        pl.lit(None, dtype=pl.Int64).alias("nranks"),
        pl.lit(None, dtype=pl.Int64).alias("base_ns"),
    )
    empty = pl.DataFrame(schema={"unit": pl.Int64, "name": pl.String, "start": pl.Int64, "end": pl.Int64})
    # Its own source name: a stats report of the same profile must not be averaged with the export.
    return summarize_timeline(gpu.select("unit", "kind", "name", "start", "end", "device", "stream", "index"), empty, empty, units,
                              source="nsys_stats", file=item.path)


def _summary_event(item: InputFile, kind: str, message: str, detail: str) -> pl.DataFrame:
    return events_from_records(
        [{"file": item.path, "line": 0, "source": "nsys", "kind": kind, "severity": "info", "message": message, "text": message, "detail": detail}]
    )


def _kernel_summary(table: pl.DataFrame, item: InputFile) -> pl.DataFrame:
    nccl = pl.col("Name").str.contains(NCCL_KERNEL)
    sums = table.select(
        pl.col("Total Time (ns)").sum().alias("total"),
        pl.col("Total Time (ns)").filter(nccl).sum().alias("nccl"),
        pl.col("Instances").filter(nccl).sum().alias("nccl_instances"),
    ).row(0, named=True)
    share = sums["nccl"] / sums["total"] if sums["total"] else 0.0
    message = (
        f"nsys kernel summary: {sums['total'] / 1e6:.1f} ms of GPU kernels on all devices, NCCL "
        f"{sums['nccl'] / 1e6:.1f} ms ({share:.0%}) in {sums['nccl_instances'] or 0} kernels"
    )
    detail = json.dumps({"kernel_us": sums["total"] / 1e3, "nccl_us": (sums["nccl"] or 0) / 1e3, "nccl_share": round(share, 4)})
    return _summary_event(item, "trace.kernel_summary", message, detail)


def _api_summary(table: pl.DataFrame, item: InputFile) -> pl.DataFrame:
    if not table.get_column("Name").str.starts_with("cu").any():
        item.skip("nsys stats API summary of another library (osrt, nvtx, ...): not used by the trace analyses")
        return empty_events()
    calls = table.select(
        pl.col("Num Calls").filter(pl.col("Name").str.contains(MALLOC_CALLS)).sum().alias("mallocs"),
        pl.col("Num Calls").filter(pl.col("Name").str.contains(FREE_CALLS)).sum().alias("frees"),
    ).row(0, named=True)
    message = (
        f"nsys CUDA API summary: {calls['mallocs'] or 0} device allocation calls and {calls['frees'] or 0} "
        "release calls over the whole profile (initialisation included)"
    )
    detail = f'{{"mallocs": {calls["mallocs"] or 0}, "frees": {calls["frees"] or 0}}}'
    return _summary_event(item, "trace.api_summary", message, detail)


def _nvtx_summary(table: pl.DataFrame, item: InputFile) -> pl.DataFrame:
    steps = table.filter(pl.col("Range").str.contains(STEP_NAME))
    if steps.height == 0:
        message = f"nsys NVTX summary: {table.height} ranges, none named like a training step"
        return _summary_event(item, "trace.nvtx_summary", message, '{"steps": 0}')
    stats = steps.select(
        pl.col("Instances").sum().alias("n"),
        pl.col("Med (ns)").median().alias("median"),
        pl.col("Max (ns)").max().alias("max"),
    ).row(0, named=True)
    message = (
        f"nsys NVTX summary: {stats['n']} step ranges, median {stats['median'] / 1e6:.1f} ms, "
        f"longest {stats['max'] / 1e6:.1f} ms"
    )
    detail = f'{{"steps": {stats["n"]}, "median_us": {stats["median"] / 1e3:.1f}, "max_us": {stats["max"] / 1e3:.1f}}}'
    return _summary_event(item, "trace.nvtx_summary", message, detail)


__all__ = ["NotNsysExport", "parse_nsys_sqlite", "parse_nsys_stats_csv", "report_kind"]
