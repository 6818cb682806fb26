"""Batch (the scan): every job through the engine, each finished row kept at once, three tables out.

`scan` fingerprints each job, takes from the store every row already made under the same key
(see `store`), runs the rest on an engine under the job time limit, and stores each result the
moment it arrives. It returns the jobs table (one row per job), the findings table (one row per
finding per job) and, when events were asked for, the per-job events files. `write_outputs`
writes them as Parquet for polars or DuckDB: `OUT`, `OUT.findings.parquet`, and with events
`OUT.events.parquet` (streamed from the per-job files, never held whole).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.fleet import ScanError
from analyzer.fleet.engines import Task, default_workers, run_local, run_ray
from analyzer.fleet.rows import (
    STATUS_ANALYSED,
    STATUS_CRASHED,
    STATUS_OVER_MEMORY,
    STATUS_TIMED_OUT,
    JobSpec,
    analyse_job,
    display_path,
    findings_frame,
    row_schema,
    rows_frame,
)
from analyzer.fleet.store import Store, cache_key, current_versions, fingerprint

if TYPE_CHECKING:
    import polars as pl

DEFAULT_JOB_TIMEOUT_S = 300.0
# New address space one job may take in a local worker: several times what the largest recorded
# jobs need (polars reserves more address space than it touches), far below a node's memory.
DEFAULT_JOB_MEMORY_MB = 8192
Progress = Callable[[int, int], None]  # (jobs done, jobs in all)


@dataclass
class ScanResult:
    frame: pl.DataFrame  # the jobs table
    findings: pl.DataFrame  # the findings table
    events_files: list[str]  # per-job events Parquet of the analysed jobs (empty unless events were asked)
    analysed: int  # jobs run through the analyzer this time
    reused: int  # rows taken from the store
    seconds: float


def scan(
    jobs: Sequence[str],
    *,
    engine: str = "local",
    workers: int | None = None,
    store_path: Path | None = None,
    content_hash: bool = False,
    ray_address: str | None = None,
    job_timeout: float | None = DEFAULT_JOB_TIMEOUT_S,
    job_memory_mb: int | None = DEFAULT_JOB_MEMORY_MB,
    events_dir: Path | None = None,
    task: Task = analyse_job,
    progress: Progress | None = None,
) -> ScanResult:
    """Analyse `jobs` (absolute paths) with `engine`, reusing stored rows and storing each new one.
    `job_memory_mb` (local engine; None: no budget) is the new address space a job may take."""
    if engine not in ("local", "ray"):
        raise ScanError(f"unknown engine {engine!r}: use local or ray")
    started = time.perf_counter()
    versions = current_versions()
    store = Store(store_path)
    if events_dir is not None:
        events_dir.mkdir(parents=True, exist_ok=True)
    try:
        results: list[dict] = []
        todo: list[JobSpec] = []
        fingerprints: dict[str, str] = {}
        for job in jobs:
            shown = display_path(job)
            fingerprints[job] = fingerprint(job, content_hash=content_hash)
            key = cache_key(shown, fingerprints[job], versions)
            stored = store.get(shown, key, job_timeout=job_timeout, want_events=events_dir is not None)
            if stored is not None:
                results.append(stored)
            else:
                todo.append(JobSpec(job, str(events_dir / f"{key}.parquet") if events_dir is not None else None))
        if progress is not None:
            progress(len(results), len(jobs))

        def on_result(spec: JobSpec, result: dict) -> None:
            row = result["row"]
            row["fingerprint"] = fingerprints[spec.job]
            status = row["status"]
            result["events_file"] = spec.events_file if status == STATUS_ANALYSED else None
            results.append(result)
            if status not in (STATUS_CRASHED, STATUS_OVER_MEMORY):  # retried by the next scan (perhaps with more memory)
                # Keyed by the versions of the analyzer that made the row (a worker's, on Ray another node's).
                made_by = {name: row.get(name) or "" for name in versions}
                store.put(row["job"], cache_key(row["job"], row["fingerprint"], made_by), result,
                          limit_s=job_timeout if status == STATUS_TIMED_OUT else None,
                          events_file=result["events_file"])
            if progress is not None:
                progress(len(results), len(jobs))

        if todo and engine == "local":
            run_local(todo, task, workers or default_workers(), job_timeout, on_result,
                      job_memory=job_memory_mb << 20 if job_memory_mb else None)
        elif todo:
            run_ray(todo, task, ray_address, job_timeout, on_result)
    finally:
        store.close()
    return ScanResult(
        frame=rows_frame(r["row"] for r in results),
        findings=findings_frame(f for r in results for f in r["findings"]),
        events_files=sorted(r["events_file"] for r in results if r.get("events_file")),
        analysed=len(todo),
        reused=len(jobs) - len(todo),
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------------------------
# Outputs.
# ---------------------------------------------------------------------------------------------


def findings_path(out: Path) -> Path:
    return out.with_name(out.stem + ".findings.parquet")


def events_path(out: Path) -> Path:
    return out.with_name(out.stem + ".events.parquet")


def write_outputs(result: ScanResult, out: Path, *, jsonl: Path | None = None, events: bool = False) -> list[Path]:
    """Write the tables next to `out`; returns the paths written. Each file appears whole or not at all."""
    import polars as pl

    written = [out, findings_path(out)]
    _atomic(out, result.frame.write_parquet)
    _atomic(findings_path(out), result.findings.write_parquet)
    if jsonl is not None:
        _atomic(jsonl, result.frame.write_ndjson)
        written.append(jsonl)
    if events:
        if result.events_files:
            _atomic(events_path(out), pl.scan_parquet(result.events_files).sink_parquet)
        else:
            from analyzer.events import EVENT_SCHEMA

            _atomic(events_path(out), pl.DataFrame(schema={"job": pl.String, **EVENT_SCHEMA}).write_parquet)
        written.append(events_path(out))
    return written


def _atomic(path: Path, write: Callable[[str], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(str(tmp))
    os.replace(tmp, path)


def read_scan(path: Path) -> pl.DataFrame:
    """A jobs table written by `write_outputs` (Parquet, or JSON Lines by extension)."""
    import polars as pl

    if path.suffix in (".jsonl", ".ndjson", ".json"):
        return pl.read_ndjson(path, schema=row_schema())
    return pl.read_parquet(path)
