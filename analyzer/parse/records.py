"""Stage 2, parse (text logs): the rare structured records, parsed by the Lark grammars.

WorkNCCL records, process-group status, structured NCCL WARNs (IB completions, async events,
duplicate GPUs, refused connections, CUDA failures), a terminal-wrapped WorkNCCL on the next line,
and torchrun's ChildFailedError table. Each distinct segment is parsed once: a watchdog cascade
repeats one record on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from analyzer.events import conform
from analyzer.parse.grammars import parse_body

_TABLE_KINDS = ["torchrun.table_field", "torchrun.table_section", "torchrun.table_entry"]


def with_grammar_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """The rare structured lines: message segments found by a literal go through Lark."""
    segments = frame.select(
        pl.col("kind"),
        pl.col("message").str.extract(r"(WorkNCCL\((?:[^()]|\(ms\))*\))").alias("work"),
        pl.col("message").str.extract(r"((?:failure detected by|Exception \(either|Timeout at NCCL work:|Received a dump signal).*)").alias("status"),
        pl.when(pl.col("kind") == "nccl.warn").then(pl.col("message")).alias("warn"),
    )
    work_rows = _each_distinct_once(segments.get_column("work"), parse_work)
    status_rows = _each_distinct_once(segments.get_column("status"), _parse_status)
    warn_rows = _each_distinct_once(segments.get_column("warn"), _parse_warn)
    parsed = pl.DataFrame(
        {
            "g_seq": [w.get("seq") if w else s.get("seq") if s else None for w, s in zip(work_rows, status_rows)],
            "g_op": [w.get("op") if w else None for w in work_rows],
            "g_numel_in": [w.get("numel_in") if w else None for w in work_rows],
            "g_numel_out": [w.get("numel_out") if w else None for w in work_rows],
            "g_timeout": [w.get("timeout_ms") if w else None for w in work_rows],
            "g_enq": [s.get("last_enqueued") if s else None for s in status_rows],
            "g_done": [s.get("last_completed") if s else None for s in status_rows],
            "g_peer": [x.get("peer") if x else None for x in warn_rows],
            "g_code": [x.get("code") if x else None for x in warn_rows],
            "g_ranks": [x.get("ranks") if x else None for x in warn_rows],
        },
        schema={
            "g_seq": pl.Int64, "g_op": pl.String, "g_numel_in": pl.Int64, "g_numel_out": pl.Int64,
            "g_timeout": pl.Int64, "g_enq": pl.Int64, "g_done": pl.Int64, "g_peer": pl.String,
            "g_code": pl.String, "g_ranks": pl.List(pl.Int64),
        },
    )
    return pl.concat([frame, parsed], how="horizontal").with_columns(
        pl.coalesce("seq", "g_seq").alias("seq"),
        pl.coalesce("op", "g_op").alias("op"),
        pl.col("g_numel_in").alias("numel_in"),
        pl.col("g_numel_out").alias("numel_out"),
        pl.col("g_timeout").alias("timeout_ms"),
        pl.col("g_enq").alias("last_enqueued"),
        pl.col("g_done").alias("last_completed"),
        pl.coalesce("g_peer", "peer").alias("peer"),
        pl.coalesce("g_code", "code").alias("code"),
        pl.coalesce("ranks_ref", "g_ranks").alias("ranks_ref"),
    )


def _each_distinct_once(segments: pl.Series, parse: Callable[[str], dict | None]) -> list[dict | None]:
    """`parse` of each row's segment (None where it has none), each distinct segment parsed once:
    a watchdog cascade prints the same WorkNCCL record on every rank."""
    parsed = {segment: parse(segment) for segment in segments.drop_nulls().unique().to_list()}
    return [parsed.get(segment) for segment in segments.to_list()]


def parse_work(segment: str | None) -> dict | None:
    return parse_body("c10d", "work", segment) if segment else None


def _parse_status(segment: str | None) -> dict | None:
    return parse_body("c10d", "pg_status", segment) if segment else None


# The WARN families with structure; the literal picks the grammar start symbol.
_WARN_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Got completion from peer", "ib_completion"),
    ("async event", "ib_async"),
    ("Duplicate GPU detected", "duplicate_gpu"),
    ("Connection closed by remote peer", "peer_closed"),
    ("Connect to ", "connect_failed"),
    ("Cuda failure", "cuda_failure"),
)
_IBV_STATUS = {1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR", 4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR",
               9: "IBV_WC_REM_INV_REQ_ERR", 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR",
               12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR"}


def _parse_warn(message: str | None) -> dict | None:
    if not message:
        return None
    for literal, start in _WARN_FAMILIES:
        position = message.find(literal)
        if position < 0:
            continue
        segment = message[max(0, message.rfind("NET/IB", 0, position + 1)) :] if start.startswith("ib_") else message
        if start in ("connect_failed", "peer_closed"):
            segment = message[max(0, message.rfind(" ", 0, max(position - 1, 0)) + 1) :] if ":" in message[:position] else message
        fields = parse_body("nccl", start, segment.strip()) or parse_body("nccl", start, message[position:].strip())
        if not fields:
            return None
        if "status" in fields:
            fields["code"] = fields.get("status_name") or _IBV_STATUS.get(fields["status"], f"status {fields['status']}")
        elif "event" in fields:
            fields["code"] = fields["event"]
        elif "cuda_error" in fields:
            fields["code"] = fields["cuda_error"]
        return fields
    return None

def failure_table_entries(events: pl.DataFrame) -> pl.DataFrame:
    """torchrun's ChildFailedError table: field lines grouped per `[N]:` entry, parsed by the grammar.

    Table lines are a handful per job, so grouping them in Python costs nothing.
    """
    table = events.filter(pl.col("kind").is_in(_TABLE_KINDS)).sort("file", "line")
    entries: list[dict] = []
    section = "Failures"
    current: dict | None = None
    for row in table.iter_rows(named=True):
        body = (row["message"] or "").strip()
        if row["kind"] == "torchrun.table_section":
            section = body.rstrip(":")
            continue
        if body.startswith("[") and body.endswith("]:"):
            current = {"row": row, "fields": [], "section": section}
            entries.append(current)
        elif current is not None:
            current["fields"].append(body)
    records = []
    for entry in entries:
        fields = parse_body("torchrun", "entry", "\n".join(entry["fields"]))
        if not fields or "rank" not in fields:
            continue
        row = entry["row"]
        root = entry["section"].startswith("Root Cause")
        records.append({
            **{k: row[k] for k in ("file", "line", "text", "ts", "ts_source")},
            "source": "torchrun",
            "kind": "torchrun.root_cause" if root else "torchrun.failure",
            "severity": "error",
            "rank": fields["rank"],
            "local_rank": fields["local_rank"],
            "host": fields.get("host"),
            "pid": fields.get("pid"),
            "exitcode": fields.get("exitcode"),
            "code": fields.get("signal"),
            "message": f"{'Root Cause' if root else 'Failure'}: rank {fields['rank']} on {fields.get('host')} "
                       f"exitcode {fields.get('exitcode')}: {fields.get('traceback', '')}"[:2000],
        })
    return conform(pl.DataFrame(records)) if records else conform(events.head(0))


def merge_wrapped_work(events: pl.DataFrame) -> pl.DataFrame:
    """A terminal-wrapped watchdog line carries its WorkNCCL record on the next line."""
    needs = (pl.col("kind") == "watchdog.timeout") & pl.col("op").is_null() & pl.col("next_work").is_not_null()
    if events.filter(needs).height == 0:
        return events
    parsed = [
        parse_work(w) if n else None
        for w, n in zip(events.get_column("next_work").to_list(), events.select(needs).to_series().to_list())
    ]
    fill = pl.DataFrame(
        {
            "w_seq": [p.get("seq") if p else None for p in parsed],
            "w_op": [p.get("op") if p else None for p in parsed],
            "w_in": [p.get("numel_in") if p else None for p in parsed],
            "w_out": [p.get("numel_out") if p else None for p in parsed],
            "w_to": [p.get("timeout_ms") if p else None for p in parsed],
        },
        schema={"w_seq": pl.Int64, "w_op": pl.String, "w_in": pl.Int64, "w_out": pl.Int64, "w_to": pl.Int64},
    )
    return pl.concat([events, fill], how="horizontal").with_columns(
        pl.coalesce("seq", "w_seq").alias("seq"),
        pl.coalesce("op", "w_op").alias("op"),
        pl.coalesce("numel_in", "w_in").alias("numel_in"),
        pl.coalesce("numel_out", "w_out").alias("numel_out"),
        pl.coalesce("timeout_ms", "w_to").alias("timeout_ms"),
    )
