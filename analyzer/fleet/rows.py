"""Batch (per job): the function a worker runs on one job, and the tables its results fill.

`analyse_job` is one call to `analyzer.api.analyze`, turned into plain values: a row of the jobs
table (the verdict fields exactly as `analyze --format json` reports them, plus the hosts and GPUs
they implicate), one row per finding for the findings table, and, when asked, the job's events
written to their own Parquet file by the worker (events can be millions of rows: they never travel
back through a pipe). It never raises: a job that cannot be analysed is a `cannot_analyse` row,
any other exception a `crashed` row with the error, except a MemoryError, which it leaves to the
engine. The engines add `timed_out` rows (a job past its time limit), `over_memory` rows (a job
past its memory budget) and `crashed` rows for a worker that died.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.fleet.store import engine_versions
from analyzer.io.budget import budget_active, is_refused_allocation

if TYPE_CHECKING:  # polars is imported where used, so that a worker starts light
    import polars as pl

STATUS_ANALYSED = "analysed"
STATUS_CANNOT_ANALYSE = "cannot_analyse"
STATUS_CRASHED = "crashed"
STATUS_TIMED_OUT = "timed_out"
STATUS_OVER_MEMORY = "over_memory"
MAX_ERROR_CHARS = 2000
MAX_INPUTS_NOT_READ = 20  # inputs named in a row's inputs_not_read (a job of 10^5 refused files stays one small row)
MAX_NOTE_CHARS = 400
WORKER_DIED = ("the analyzer process died while analysing this job (killed by a signal, a crash in native "
               "code, or out of memory); the other jobs were not affected")


@dataclass(frozen=True)
class JobSpec:
    """What a worker is asked: the job's path, and where to write its events (None: not wanted)."""

    job: str
    events_file: str | None = None


def display_path(path: str) -> str:
    """A path as a table can hold it: undecodable bytes (surrogate-escaped by the OS layer) as `\\xNN`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------------------------
# The tables: one row per job, one row per finding; each declared once.
# ---------------------------------------------------------------------------------------------


def row_schema() -> dict[str, pl.DataType]:
    import polars as pl

    ts = pl.Datetime("us", "UTC")
    return {
        "job": pl.String,  # absolute path of the job, as given to analyze
        "status": pl.String,  # analysed | cannot_analyse | crashed | timed_out
        "category": pl.String,  # verdict.category (null when the job was not analysed)
        "verdict": pl.String,  # verdict.title
        "rule_id": pl.String,  # verdict.rule_id
        "summary": pl.String,  # verdict.summary
        "outcome": pl.String,  # job.outcome: ok, crash, hang, slow, unknown
        "culprit_ranks": pl.List(pl.Int64),  # verdict.culprit_ranks
        "culprit_hosts": pl.List(pl.String),  # verdict.culprit_hosts
        "culprit_gpus": pl.List(pl.String),  # the culprits' physical GPUs: "host/gpuN", "host/<bus id>", "host/cudaN (logical only)"
        "implicated_hosts": pl.List(pl.String),  # culprit hosts plus the hosts of culprit ranks
        "confidence": pl.Float64,  # verdict.confidence
        "signatures": pl.List(pl.String),  # rule ids of every finding, cause before symptom
        "hosts": pl.List(pl.String),  # job.hosts
        "world_size": pl.Int64,
        "inputs": pl.Int64,  # files read
        "inputs_not_read": pl.List(pl.String),  # "file (status): reason" of each input skipped, in error or partial
        "job_start": ts,  # earliest timestamp in the job's logs
        "job_end": ts,  # latest timestamp in the job's logs
        "error": pl.String,  # why the job could not be analysed, the crash, or the time limit
        "elapsed_s": pl.Float64,  # analysis time of this job
        "analysed_at": ts,
        "fingerprint": pl.String,
        "analyzer_version": pl.String,
        "analyzer_hash": pl.String,
        "catalogue_hash": pl.String,
    }


def finding_schema() -> dict[str, pl.DataType]:
    import polars as pl

    return {
        "job": pl.String,
        "position": pl.Int64,  # 0 = the finding the verdict was decided from; then cause before symptom
        "rule_id": pl.String,
        "category": pl.String,
        "severity": pl.String,
        "title": pl.String,
        "summary": pl.String,
        "ranks": pl.List(pl.Int64),
        "hosts": pl.List(pl.String),
        "confidence": pl.Float64,
        "caused_by": pl.List(pl.String),  # rule ids this finding is a symptom of
        "evidence_lines": pl.Int64,  # evidence lines the JSON report quotes for it
    }


# Columns that differ between two runs over the same inputs (timing, not results).
VOLATILE_COLUMNS = ("elapsed_s", "analysed_at")


def rows_frame(rows: Iterable[dict]) -> pl.DataFrame:
    """The jobs table, one row per job, sorted by job path. Timestamps travel as epoch microseconds."""
    import polars as pl

    schema = row_schema()
    utc = pl.Datetime("us", "UTC")
    wire = {name: (pl.Int64 if dtype == utc else dtype) for name, dtype in schema.items()}
    frame = pl.from_dicts([{name: row.get(name) for name in schema} for row in rows], schema=wire)
    return frame.with_columns(pl.col(name).cast(dtype) for name, dtype in schema.items() if dtype == utc).sort("job")


def findings_frame(findings: Iterable[dict]) -> pl.DataFrame:
    """The findings table, one row per finding per job, in job then position order."""
    import polars as pl

    schema = finding_schema()
    frame = pl.from_dicts([{name: f.get(name) for name in schema} for f in findings], schema=schema)
    return frame.sort("job", "position")


# ---------------------------------------------------------------------------------------------
# Per-job work: runs in a worker process or a Ray task.
# ---------------------------------------------------------------------------------------------


def analyse_job(spec: JobSpec) -> dict:
    """Analyse one job; never raises. Returns {"row": ..., "findings": [...]}."""
    started = time.perf_counter()
    job = display_path(spec.job)
    row: dict[str, Any] = {"job": job, **engine_versions()}
    findings: list[dict] = []
    try:
        from analyzer.api import analyze
        from analyzer.io import DiscoveryError
        from analyzer.exits import CannotAnalyse

        try:
            analysis = analyze(spec.job)
        except (DiscoveryError, CannotAnalyse) as exc:
            row.update(status=STATUS_CANNOT_ANALYSE, error=str(exc)[:MAX_ERROR_CHARS])
        else:
            row.update(status=STATUS_ANALYSED, **_verdict_fields(analysis))
            findings = _finding_rows(job, analysis.report)
            if spec.events_file is not None:
                _write_events(job, analysis.events, spec.events_file)
    except BaseException as exc:  # noqa: BLE001 - a bug, or a library's panic (pyo3's PanicException is a
        # BaseException), on one job is that job's row, not the scan's end; an interrupt still stops the scan.
        # Under a job memory budget, a refused allocation is the budget's: the engine that set it makes the row.
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)) or (
                budget_active() and is_refused_allocation(exc)):
            raise
        row.update(status=STATUS_CRASHED, error=describe_exception(exc))
        findings = []
    row["elapsed_s"] = round(time.perf_counter() - started, 4)
    row["analysed_at"] = time.time_ns() // 1000
    return {"row": row, "findings": findings}


def describe_exception(exc: BaseException) -> str:
    """The exception and where it was raised (the innermost frames), for a crashed row."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    return text[:MAX_ERROR_CHARS]


def error_result(job: str, status: str, error: str) -> dict:
    """The result of a job that produced none of its own (timed out, worker died, task raised)."""
    row = {"job": display_path(job), "status": status, "error": error[:MAX_ERROR_CHARS], **engine_versions(),
           "analysed_at": time.time_ns() // 1000}
    return {"row": row, "findings": []}


def _finding_rows(job: str, report: dict) -> list[dict]:
    return [
        {
            "job": job,
            "position": position,
            **{key: f[key] for key in ("rule_id", "category", "severity", "title", "summary", "confidence")},
            "ranks": list(f["ranks"]),
            "hosts": list(f["hosts"]),
            "caused_by": list(f.get("caused_by") or []),
            "evidence_lines": len(f.get("evidence") or []),
        }
        for position, f in enumerate(report["findings"])
    ]


def _write_events(job: str, events: pl.DataFrame, path: str) -> None:
    """The job's events with its path in front, written whole or not at all (a kill leaves no half file)."""
    import polars as pl

    tmp = f"{path}.{os.getpid()}.tmp"
    events.select(pl.lit(job, dtype=pl.String).alias("job"), pl.all()).write_parquet(tmp)
    os.replace(tmp, path)


def _verdict_fields(analysis: Any) -> dict:
    import polars as pl

    report = analysis.report
    verdict, job = report["verdict"], report["job"]
    events = analysis.events
    span = events.select(pl.col("ts").min().dt.epoch("us").alias("start"), pl.col("ts").max().dt.epoch("us").alias("end"))
    return {
        "category": verdict["category"],
        "verdict": verdict["title"],
        "rule_id": verdict["rule_id"],
        "summary": verdict["summary"],
        "outcome": job["outcome"],
        "culprit_ranks": list(verdict["culprit_ranks"]),
        "culprit_hosts": list(verdict["culprit_hosts"]),
        "culprit_gpus": _culprit_gpus(verdict),
        "implicated_hosts": sorted(
            set(verdict["culprit_hosts"])
            | {analysis.facts.rank_hosts[r] for r in verdict["culprit_ranks"] if r in analysis.facts.rank_hosts}
        ),
        "confidence": verdict["confidence"],
        "signatures": [f["rule_id"] for f in report["findings"]],
        "hosts": list(job["hosts"]),
        "world_size": job["world_size"],
        "inputs": len(report["inputs"]),
        "inputs_not_read": _inputs_not_read(report["inputs"]),
        "job_start": span.item(0, "start"),
        "job_end": span.item(0, "end"),
    }


def _inputs_not_read(inputs: list[dict]) -> list[str]:
    """Each input the report did not read whole, with its reason: a file over its budget, refused or cut
    shows in the jobs table, not only in that job's report. At most MAX_INPUTS_NOT_READ, then a count."""
    shown = [f"{i['file']} ({i['status']}): {i.get('reason') or 'no reason given'}"[:MAX_NOTE_CHARS]
             for i in inputs if i["status"] != "parsed"]
    if len(shown) > MAX_INPUTS_NOT_READ:
        shown = [*shown[:MAX_INPUTS_NOT_READ], f"and {len(shown) - MAX_INPUTS_NOT_READ} more (see the job's report)"]
    return shown


def _culprit_gpus(verdict: dict) -> list[str]:
    """The culprits' physical GPUs as the report's verdict names them (analyzer/facts/gpus.py):
    `host/gpuN`, `host/<bus id>`, or `host/cudaN (logical only)` where nothing physical is known."""
    from analyzer.facts.gpus import gpu_label

    return [gpu_label(gpu) for gpu in verdict.get("culprit_gpus") or []]
