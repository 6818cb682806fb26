"""Batch scan: run the whole pipeline on every job under some roots, one row per job.

This module is the nightly batch around `analyzer.api.analyze`; it adds no analysis of its own.

- **Which directories are jobs** (`find_jobs`). A job is the directory that holds the logs of one
  run. Walking each ROOT top-down (never following symlinks, skipping names that start with `.`):
  1. a ROOT that is a file (a log, a `.gz`, a `.tar`) is one job;
  2. a directory that directly holds a file is a job, and everything below it belongs to it;
  3. a directory that directly holds torchrun `attempt_<N>/` directories (a torchrun run
     directory) is a job, and so is a directory whose only entry is such a run directory (the
     usual `--log-dir JOB` holding `<run_id>/attempt_0/`), which then names the job;
  4. any other directory holds only directories: the walk descends into them.
  `--glob PATTERN` (matched under each ROOT) or `--manifest FILE` (one path per line, relative to
  the manifest's directory, `#` comments) replace the rule with an explicit list. The scan's own
  output files never make their directory a job.
- **Per-job work** (`analyse_job`) is one call to `analyze`, turned into a small dict of plain
  values: the verdict fields exactly as `analyze --format json` reports them, plus the hosts and
  GPUs they implicate. A `DiscoveryError` is a "could not analyse" row; any other exception, or a
  worker process that dies, is a "crashed" row with the error: one bad job never aborts a scan.
- **Engines**: `local` (default) runs jobs in a `ProcessPoolExecutor` using the `spawn` start
  method (no fork of a process that has polars threads); `ray` submits the same function as Ray
  tasks to an existing cluster (`RAY_ADDRESS` or `--ray-address`); the rows are the same.
- **Incremental**: a JSON cache next to the output holds, per job, the key under which its row was
  made: the job path, a fingerprint of its inputs (every file's relative path, size and mtime, or
  its content hash with `content_hash=True`), the analyzer version, a hash of the analyzer's code
  (every module that can change a row: not the CLI, capture or renderers) and grammars, and a hash
  of the `rules/` catalogue (a row is stored under the versions of the
  process that made it, so a Ray node running other code never fills the cache with rows this
  analyzer would not give). A job whose key is unchanged is not analysed again. Crashed rows are
  not cached, so a re-run retries them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from analyzer import __version__

if TYPE_CHECKING:  # polars and rich are imported where used, so that a worker starts light
    import polars as pl
    from rich.console import Console

CACHE_FORMAT = 1
STATUS_ANALYSED = "analysed"
STATUS_CANNOT_ANALYSE = "cannot_analyse"
STATUS_CRASHED = "crashed"
MAX_ERROR_CHARS = 2000
WORKER_DIED = ("the analyzer process died while analysing this job (killed by a signal, a crash in native "
               "code, or out of memory); the other jobs were not affected")

_ATTEMPT_DIR = re.compile(r"attempt_\d+")

Task = Callable[[str], dict]


class ScanError(Exception):
    """The scan cannot start: a missing root, an unreadable manifest, an unavailable engine."""


# ---------------------------------------------------------------------------------------------
# The row: one job's result as plain values, declared once.
# ---------------------------------------------------------------------------------------------


def row_schema() -> dict[str, pl.DataType]:
    import polars as pl

    ts = pl.Datetime("us", "UTC")
    return {
        "job": pl.String,  # absolute path of the job, as given to analyze
        "status": pl.String,  # analysed | cannot_analyse | crashed
        "category": pl.String,  # verdict.category (null when the job was not analysed)
        "verdict": pl.String,  # verdict.title
        "rule_id": pl.String,  # verdict.rule_id
        "summary": pl.String,  # verdict.summary
        "outcome": pl.String,  # job.outcome: ok, crash, hang, slow, unknown
        "culprit_ranks": pl.List(pl.Int64),  # verdict.culprit_ranks
        "culprit_hosts": pl.List(pl.String),  # verdict.culprit_hosts
        "culprit_gpus": pl.List(pl.String),  # "host/gpuN" of the culprits, where the logs name the device
        "implicated_hosts": pl.List(pl.String),  # culprit hosts plus the hosts of culprit ranks
        "confidence": pl.Float64,  # verdict.confidence
        "signatures": pl.List(pl.String),  # rule ids of every finding, cause before symptom
        "hosts": pl.List(pl.String),  # job.hosts
        "world_size": pl.Int64,
        "inputs": pl.Int64,  # files read
        "job_start": ts,  # earliest timestamp in the job's logs
        "job_end": ts,  # latest timestamp in the job's logs
        "error": pl.String,  # why the job could not be analysed, or the crash
        "elapsed_s": pl.Float64,  # analysis time of this job
        "analysed_at": ts,
        "fingerprint": pl.String,
        "analyzer_version": pl.String,
        "analyzer_hash": pl.String,
        "catalogue_hash": pl.String,
    }


# Columns that differ between two runs over the same inputs (timing, not results).
VOLATILE_COLUMNS = ("elapsed_s", "analysed_at")


def rows_frame(rows: Iterable[dict]) -> pl.DataFrame:
    """The scan table, one row per job, sorted by job path. Timestamps travel as epoch microseconds."""
    import polars as pl

    schema = row_schema()
    wire = {name: (pl.Int64 if dtype == pl.Datetime("us", "UTC") else dtype) for name, dtype in schema.items()}
    frame = pl.from_dicts([{name: row.get(name) for name in schema} for row in rows], schema=wire)
    return frame.with_columns(
        pl.col(name).cast(dtype) for name, dtype in schema.items() if dtype == pl.Datetime("us", "UTC")
    ).sort("job")


# ---------------------------------------------------------------------------------------------
# Which directories are jobs.
# ---------------------------------------------------------------------------------------------


def find_jobs(
    roots: Sequence[str | os.PathLike[str]],
    *,
    pattern: str | None = None,
    manifest: str | os.PathLike[str] | None = None,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> list[str]:
    """Absolute paths of the jobs under `roots` (rules in the module docstring), sorted, unique."""
    excluded = {os.path.abspath(p) for p in exclude}
    jobs: list[str] = []
    if manifest is not None:
        jobs.extend(_read_manifest(Path(manifest)))
    for root in roots:
        root_path = Path(root)
        if not root_path.exists():
            raise ScanError(f"no such file or directory: {root}")
        if pattern:
            jobs.extend(str(p) for p in sorted(root_path.glob(pattern)) if not _hidden(p.name))
        else:
            jobs.extend(_walk_jobs(root_path, excluded))
    return sorted({os.path.abspath(j) for j in jobs} - excluded)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _read_manifest(manifest: Path) -> list[str]:
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScanError(f"cannot read the manifest {manifest}: {exc}") from exc
    base = manifest.resolve().parent
    lines = (line.strip() for line in text.splitlines())
    return [str(base / line) for line in lines if line and not line.startswith("#")]


def _walk_jobs(root: Path, excluded: set[str]) -> list[str]:
    if not root.is_dir():
        return [str(root)]
    jobs: list[str] = []
    stack = [str(root)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted((e for e in it if not _hidden(e.name)), key=lambda e: e.name)
        except OSError:
            jobs.append(directory)  # unreadable: analyze reports why, as a row
            continue
        files = [e for e in entries if (e.is_file(follow_symlinks=False) or e.is_symlink())
                 and os.path.abspath(e.path) not in excluded]
        dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
        if files or any(_ATTEMPT_DIR.fullmatch(d.name) for d in dirs):
            jobs.append(directory)
        elif len(dirs) == 1 and _is_torchrun_run_dir(dirs[0].path):
            jobs.append(directory)
        else:
            stack.extend(d.path for d in reversed(dirs))
    return jobs


def _is_torchrun_run_dir(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(_ATTEMPT_DIR.fullmatch(e.name) and e.is_dir(follow_symlinks=False) for e in it)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# What makes a row reusable: the inputs' fingerprint and the analyzer's identity.
# ---------------------------------------------------------------------------------------------


def fingerprint(job: str, *, content_hash: bool = False) -> str:
    """A digest of the job's inputs: relative path, size and mtime (or content) of every file."""
    digest = hashlib.sha256()
    root = Path(job)
    if root.is_dir() and not root.is_symlink():
        entries = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            entries.extend(Path(dirpath) / name for name in filenames)
    else:
        entries = [root]
    for path in sorted(entries):
        rel = path.relative_to(root).as_posix() if path != root else path.name
        try:
            stat = path.lstat()
            if content_hash and path.is_file():
                mark = _file_digest(path)
            else:
                mark = str(stat.st_mtime_ns)
            digest.update(f"{rel}\0{stat.st_size}\0{mark}\n".encode("utf-8", "surrogateescape"))
        except OSError as exc:
            digest.update(f"{rel}\0unreadable {exc.errno}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def engine_versions() -> dict[str, str]:
    """The analyzer's identity as this process first saw it (a worker's: the code it has loaded)."""
    return current_versions()


def current_versions() -> dict[str, str]:
    """The analyzer's identity: version, a hash of its code and grammars, a hash of the catalogue."""
    from analyzer.resources import data_dir

    package = Path(__file__).resolve().parent
    code = sorted(p for p in package.rglob("*.py") if not _outside_rows(p.relative_to(package)))
    grammars = sorted(data_dir("grammars").glob("*.lark"))
    rules = sorted(data_dir("rules").glob("*.toml"))
    return {
        "analyzer_version": __version__,
        "analyzer_hash": _tree_hash(code + grammars),
        "catalogue_hash": _tree_hash(rules),
    }


# Modules that never change a row: the command line, live capture, the renderers, the fleet view.
_NOT_ROW_CODE = frozenset({"cli.py", "capture.py", "fleet.py"})
_NOT_ROW_DIRS = frozenset({"render", "_data"})


def _outside_rows(relative: Path) -> bool:
    return relative.as_posix() in _NOT_ROW_CODE or relative.parts[0] in _NOT_ROW_DIRS


def _tree_hash(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_key(job: str, job_fingerprint: str, versions: dict[str, str]) -> str:
    parts = (job, job_fingerprint, versions["analyzer_version"], versions["analyzer_hash"], versions["catalogue_hash"])
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:32]


class ScanCache:
    """Per job path, the key its row was made under and the row. One small JSON file."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, dict] = {}
        if path is not None and path.exists():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                doc = {}  # a damaged cache only costs a full re-scan
            if isinstance(doc, dict) and doc.get("format") == CACHE_FORMAT and isinstance(doc.get("entries"), dict):
                self.entries = doc["entries"]

    def get(self, job: str, key: str) -> dict | None:
        entry = self.entries.get(job)
        if isinstance(entry, dict) and entry.get("key") == key and isinstance(entry.get("row"), dict):
            return dict(entry["row"])
        return None

    def put(self, job: str, key: str, row: dict) -> None:
        self.entries[job] = {"key": key, "row": row}

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "entries": self.entries}), encoding="utf-8")
        os.replace(tmp, self.path)


def default_cache_path(out: Path) -> Path:
    return out.with_name(out.stem + ".cache.json")


# ---------------------------------------------------------------------------------------------
# Per-job work: runs in a worker process or a Ray task, returns a small dict.
# ---------------------------------------------------------------------------------------------


def analyse_job(job: str) -> dict:
    """Analyse one job; never raises. The row's verdict fields are the JSON report's."""
    started = time.perf_counter()
    row: dict[str, Any] = {"job": job, **engine_versions()}
    try:
        from analyzer.api import analyze
        from analyzer.discover import DiscoveryError

        try:
            analysis = analyze(job)
        except DiscoveryError as exc:
            row.update(status=STATUS_CANNOT_ANALYSE, error=str(exc)[:MAX_ERROR_CHARS])
        else:
            row.update(status=STATUS_ANALYSED, **_verdict_fields(analysis))
    except Exception as exc:  # noqa: BLE001 - an analyzer bug on one job is that job's row, not the scan's end
        row.update(status=STATUS_CRASHED, error=describe_exception(exc))
    row["elapsed_s"] = round(time.perf_counter() - started, 4)
    row["analysed_at"] = time.time_ns() // 1000
    return row


def describe_exception(exc: BaseException) -> str:
    """The exception and where it was raised (the innermost frames), for a crashed row."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
    text = f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
    return text[:MAX_ERROR_CHARS]


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
        "culprit_gpus": _culprit_gpus(analysis, verdict),
        "implicated_hosts": sorted(
            set(verdict["culprit_hosts"])
            | {analysis.facts.rank_hosts[r] for r in verdict["culprit_ranks"] if r in analysis.facts.rank_hosts}
        ),
        "confidence": verdict["confidence"],
        "signatures": [f["rule_id"] for f in report["findings"]],
        "hosts": list(job["hosts"]),
        "world_size": job["world_size"],
        "inputs": len(report["inputs"]),
        "job_start": span.item(0, "start"),
        "job_end": span.item(0, "end"),
    }


def _culprit_gpus(analysis: Any, verdict: dict) -> list[str]:
    """GPUs of the culprits where the logs say: every device a culprit rank's lines print, and the
    devices on the verdict's own evidence lines from a culprit host. None when no culprit is named."""
    import polars as pl

    ranks, hosts = verdict["culprit_ranks"], verdict["culprit_hosts"]
    if not (ranks or hosts) or not analysis.findings.height:
        return []
    evidence = analysis.findings.get_column("evidence")[0]
    named = pl.col("rank").is_in(ranks) | (pl.col("event_id").is_in(evidence.implode()) & pl.col("host").is_in(hosts))
    return (
        analysis.events.filter(pl.col("host").is_not_null() & pl.col("device").is_not_null() & named)
        .select(pl.format("{}/gpu{}", "host", "device").alias("gpu"))
        .unique()
        .sort("gpu")
        .get_column("gpu")
        .to_list()
    )


def error_row(job: str, status: str, error: str) -> dict:
    return {"job": job, "status": status, "error": error[:MAX_ERROR_CHARS], **engine_versions(),
            "analysed_at": time.time_ns() // 1000}


# ---------------------------------------------------------------------------------------------
# Engines: the same task, on local processes or on Ray.
# ---------------------------------------------------------------------------------------------


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _init_worker(polars_threads: int) -> None:
    # Several worker processes on few cores: each polars gets its share of threads, not all of them.
    os.environ.setdefault("POLARS_MAX_THREADS", str(polars_threads))


def run_local(jobs: Sequence[str], task: Task, workers: int, on_row: Callable[[dict], None]) -> None:
    """Run `task` on every job in `workers` spawned processes; a dead worker costs one job, not the scan.

    At most 2 x workers jobs are in flight. When a worker dies the pool breaks: the rest of the
    queue continues in a fresh pool, and the jobs that were in flight are re-run afterwards one at
    a time in a single-process pool, where a death names its job.
    """
    queue = deque(jobs)
    suspects: deque[str] = deque()
    while queue:
        suspects.extend(_pool_pass(queue, task, workers, 2 * workers, on_row))
    while suspects:
        for job in _pool_pass(suspects, task, 1, 1, on_row):
            on_row(error_row(job, STATUS_CRASHED, WORKER_DIED))


def _pool_pass(queue: deque[str], task: Task, workers: int, window: int, on_row: Callable[[dict], None]) -> list[str]:
    """Drain `queue` through one pool, `window` jobs in flight; if the pool breaks, return the jobs
    that were in flight (the rest stay queued)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    threads = max(1, default_workers() // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(threads,)) as pool:
        in_flight: dict[Any, str] = {}
        while queue or in_flight:
            while queue and len(in_flight) < window:
                job = queue.popleft()
                in_flight[pool.submit(task, job)] = job
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            broken: list[str] = []
            for future in done:
                job = in_flight.pop(future)
                try:
                    row = future.result()
                except BrokenProcessPool:
                    broken.append(job)
                    continue
                except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be sent back
                    row = error_row(job, STATUS_CRASHED, describe_exception(exc))
                on_row(row)
            if broken:
                return broken + list(in_flight.values())
    return []


def run_ray(jobs: Sequence[str], task: Task, address: str | None, on_row: Callable[[dict], None]) -> None:
    """Run `task` on every job as Ray tasks (one CPU each). Uses the running Ray if this process has
    one, else `ray.init(address)`, which reads RAY_ADDRESS when address is None. The workers import
    this package, so every node needs postmortem installed and the job paths readable."""
    try:
        import ray
    except ImportError as exc:
        raise ScanError("the Ray engine needs ray: pip install 'postmortem[ray]'") from exc
    import logging

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError... all mean the same here
            raise ScanError(f"cannot connect to Ray at {address or os.environ.get('RAY_ADDRESS') or 'auto'}: {exc}") from exc
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(task)
        window = max(4, 2 * int(ray.cluster_resources().get("CPU", 1)))
        queue = deque(jobs)
        in_flight: dict[Any, str] = {}
        while queue or in_flight:
            while queue and len(in_flight) < window:
                job = queue.popleft()
                in_flight[remote.remote(job)] = job
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                job = in_flight.pop(ref)
                try:
                    row = ray.get(ref)
                except ray.exceptions.WorkerCrashedError:
                    row = error_row(job, STATUS_CRASHED, WORKER_DIED)
                except Exception as exc:  # noqa: BLE001 - RayTaskError and friends: this job's row
                    row = error_row(job, STATUS_CRASHED, describe_exception(exc))
                on_row(row)
    finally:
        if started_here:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------
# The scan.
# ---------------------------------------------------------------------------------------------


@dataclass
class ScanResult:
    frame: pl.DataFrame
    analysed: int  # jobs run through the analyzer this time
    reused: int  # rows taken from the cache
    seconds: float


def scan(
    jobs: Sequence[str],
    *,
    engine: str = "local",
    workers: int | None = None,
    cache_path: Path | None = None,
    content_hash: bool = False,
    ray_address: str | None = None,
    task: Task = analyse_job,
    console: Console | None = None,
) -> ScanResult:
    """Analyse `jobs` (absolute paths) with `engine`, reusing cached rows; `console` shows progress."""
    if engine not in ("local", "ray"):
        raise ScanError(f"unknown engine {engine!r}: use local or ray")
    started = time.perf_counter()
    versions = current_versions()
    store = ScanCache(cache_path)
    rows: list[dict] = []
    todo: dict[str, str] = {}  # job -> fingerprint
    for job in jobs:
        job_fingerprint = fingerprint(job, content_hash=content_hash)
        cached = store.get(job, cache_key(job, job_fingerprint, versions))
        if cached is not None:
            rows.append(cached)
        else:
            todo[job] = job_fingerprint

    progress, task_id = _progress(console, len(jobs), len(rows))

    def on_row(row: dict) -> None:
        row["fingerprint"] = todo[row["job"]]
        rows.append(row)
        if row.get("status") != STATUS_CRASHED:
            # Keyed by the versions of the analyzer that made the row (a worker's, on Ray another node's).
            made_by = {name: row.get(name) or "" for name in versions}
            store.put(row["job"], cache_key(row["job"], row["fingerprint"], made_by), row)
        if progress is not None:
            progress.advance(task_id)

    try:
        if todo and engine == "local":
            run_local(list(todo), task, workers or default_workers(), on_row)
        elif todo:
            run_ray(list(todo), task, ray_address, on_row)
    finally:
        if progress is not None:
            progress.stop()
        store.save()  # what finished is kept even if the scan was interrupted
    return ScanResult(rows_frame(rows), analysed=len(todo), reused=len(jobs) - len(todo),
                      seconds=time.perf_counter() - started)


def _progress(console: Console | None, total: int, done: int) -> tuple[Any, Any]:
    if console is None:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    progress = Progress(TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=console, transient=False)
    task_id = progress.add_task("scan", total=total, completed=done)
    progress.start()
    return progress, task_id


def write_outputs(frame: pl.DataFrame, out: Path, jsonl: Path | None = None) -> None:
    frame.write_parquet(out)
    if jsonl is not None:
        frame.write_ndjson(jsonl)


def read_scan(path: Path) -> pl.DataFrame:
    """A scan table written by `write_outputs` (Parquet, or JSON Lines by extension)."""
    import polars as pl

    if path.suffix in (".jsonl", ".ndjson", ".json"):
        return pl.read_ndjson(path, schema=row_schema())
    return pl.read_parquet(path)


# ---------------------------------------------------------------------------------------------
# Command line: `postmortem scan` and `postmortem fleet` (registered in analyzer/cli.py).
# ---------------------------------------------------------------------------------------------


@click.command("scan")
@click.argument("roots", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Parquet file to write, one row per job.")
@click.option("--jsonl", type=click.Path(path_type=Path, dir_okay=False), help="Also write the rows as JSON Lines.")
@click.option("--html", "html_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the fleet page (self-contained HTML).")
@click.option("--glob", "pattern", help="Jobs are the paths matching this pattern under each ROOT (e.g. '*/slurm-*').")
@click.option("--manifest", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Jobs are the paths listed in this file, one per line (relative to the file's directory).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: processes on this machine; ray: tasks on a Ray cluster.")
@click.option("--workers", "-j", type=click.IntRange(min=1), help="Local worker processes [default: the usable cores].")
@click.option("--ray-address", help="Ray cluster address [default: RAY_ADDRESS, else a running local Ray].")
@click.option("--cache", "cache_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Incremental cache file [default: OUT's name with .cache.json].")
@click.option("--no-cache", is_flag=True, help="Analyse every job, and keep no cache.")
@click.option("--content-hash", is_flag=True, help="Fingerprint inputs by content instead of size and mtime.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the terminal summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
def scan_command(roots: tuple[Path, ...], out: Path, jsonl: Path | None, html_out: Path | None, pattern: str | None,
                 manifest: Path | None, engine: str, workers: int | None, ray_address: str | None,
                 cache_path: Path | None, no_cache: bool, content_hash: bool, top: int, quiet: bool) -> None:
    """Analyse every job under the ROOT directories; write one row per job to --out (Parquet).

    A job is a directory that directly holds a file or torchrun attempt_N/ directories (or holds
    only one such run directory); directories holding only directories are searched. --glob or
    --manifest list the jobs instead. Jobs whose inputs and analyzer are unchanged since the last
    scan are taken from the cache.

    Exit status: 0 no failure found, 1 at least one failure identified, 2 nothing to scan.
    """
    from rich.console import Console

    from analyzer.cli import EXIT_FAILURE_FOUND, EXIT_NOTHING_FOUND, CannotAnalyse
    from analyzer.fleet import fleet_view, print_fleet_summary

    if not roots and manifest is None:
        raise CannotAnalyse("give at least one ROOT directory, or --manifest FILE")
    outputs = [p for p in (out, jsonl, html_out) if p is not None]
    cache_file = None if no_cache else (cache_path or default_cache_path(out))
    for path in [*outputs, *([cache_file] if cache_file else [])]:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        jobs = find_jobs(roots, pattern=pattern, manifest=manifest, exclude=outputs + ([cache_file] if cache_file else []))
        if not jobs:
            raise CannotAnalyse(f"no job found under {', '.join(map(str, roots)) or manifest}"
                                + (f" matching {pattern!r}" if pattern else ""))
        result = scan(jobs, engine=engine, workers=workers, cache_path=cache_file, content_hash=content_hash,
                      ray_address=ray_address, console=None if quiet else Console(stderr=True))
    except ScanError as exc:
        raise CannotAnalyse(str(exc)) from exc
    write_outputs(result.frame, out, jsonl)
    view = fleet_view(result.frame)
    if html_out is not None:
        from analyzer.render.fleet_html import render_fleet_html

        html_out.write_text(render_fleet_html(view), encoding="utf-8")
    if not quiet:
        console = summary_console()
        console.print(f"{len(jobs)} jobs: {result.analysed} analysed, {result.reused} reused from the cache, "
                      f"in {result.seconds:.1f} s ({engine} engine); wrote {out}")
        print_fleet_summary(view, console, top=top)
    sys.exit(EXIT_FAILURE_FOUND if view.totals["failed"] else EXIT_NOTHING_FOUND)


@click.command("fleet")
@click.argument("scan_file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--html", "html_out", type=click.Path(path_type=Path, dir_okay=False), help="Write the fleet page here.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the terminal summary.")
def fleet_command(scan_file: Path, html_out: Path | None, top: int) -> None:
    """Summarise a scan (Parquet or JSON Lines from `postmortem scan`): repeat-offender hosts and
    GPUs, recurring signatures, jobs not analysed."""
    from analyzer.cli import CannotAnalyse
    from analyzer.fleet import fleet_view, print_fleet_summary

    try:
        frame = read_scan(scan_file)
    except Exception as exc:  # noqa: BLE001 - polars raises several kinds for a file that is not a scan
        raise CannotAnalyse(f"{scan_file}: not a scan table ({type(exc).__name__}: {exc})") from exc
    missing = set(row_schema()) - set(frame.columns)
    if missing:
        raise CannotAnalyse(f"{scan_file}: not a scan table (missing columns {sorted(missing)})")
    view = fleet_view(frame)
    if html_out is not None:
        from analyzer.render.fleet_html import render_fleet_html

        html_out.write_text(render_fleet_html(view), encoding="utf-8")
    print_fleet_summary(view, summary_console(), top=top)


def summary_console() -> Console:
    """Standard output; wide enough for the tables when it is a file or a pipe (rich assumes 80)."""
    from rich.console import Console

    console = Console(highlight=False, emoji=False)
    return console if console.is_terminal else Console(highlight=False, emoji=False, width=160)
