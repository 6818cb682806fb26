"""The `postmortem scan` and `postmortem fleet` commands: a thin shell over `analyzer.fleet`.

Only `analyzer.cli` imports this module (to register the commands). Errors the user can fix are
`CannotAnalyse` (exit 2); the command group maps anything else to an internal error (exit 3).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from analyzer.cli.consoles import report_console
from analyzer.exits import CannotAnalyse
from analyzer.outputs import check_writable

def _prepare_output(path: Path, what: str) -> None:
    """Create the output's folder and fail now, before a night of work, if the file cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CannotAnalyse(f"cannot write the {what} to {path}: {exc.strerror or exc}") from exc
    check_writable(path, what)


@click.command("scan")
@click.argument("roots", nargs=-1, type=click.Path(path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Parquet file of the jobs table (one row per job); OUT.findings.parquet is written beside it.")
@click.option("--jsonl", type=click.Path(path_type=Path, dir_okay=False), help="Also write the jobs table as JSON Lines.")
@click.option("--html", "html_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the fleet page (self-contained HTML).")
@click.option("--events", is_flag=True, help="Also write every job's events to OUT.events.parquet.")
@click.option("--glob", "pattern", help="Jobs are the paths matching this pattern under each ROOT (e.g. '*/slurm-*').")
@click.option("--manifest", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Jobs are the paths listed in this file, one per line (relative to the file's directory).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: processes on this machine; ray: tasks on a Ray cluster.")
@click.option("--workers", "-j", type=click.IntRange(min=1), help="Local worker processes [default: the usable cores].")
@click.option("--job-timeout", type=click.FloatRange(min=0), default=300, show_default=True,
              help="Seconds one job may take; past it the job is a timed_out row and its worker is replaced (0: no limit).")
@click.option("--job-memory", type=click.IntRange(min=0), default=8192, show_default=True, metavar="MB",
              help="Megabytes of new address space one job may take (local engine); past it the job is an "
                   "over_memory row and its worker is replaced (0: no limit).")
@click.option("--ray-address", help="Ray cluster address [default: RAY_ADDRESS, else a running local Ray].")
@click.option("--cache", "cache_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Store of finished rows (SQLite) [default: OUT's name with .scan.db].")
@click.option("--no-cache", is_flag=True, help="Analyse every job, and keep no store.")
@click.option("--content-hash", is_flag=True, help="Fingerprint inputs by content instead of size and mtime.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the terminal summary.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
def scan_command(roots: tuple[Path, ...], out: Path, jsonl: Path | None, html_out: Path | None, events: bool,
                 pattern: str | None, manifest: Path | None, engine: str, workers: int | None, job_timeout: float,
                 job_memory: int, ray_address: str | None, cache_path: Path | None, no_cache: bool, content_hash: bool, top: int,
                 quiet: bool) -> None:
    """Analyse every job under the ROOT directories; write one row per job to --out (Parquet).

    A job is a directory whose own files include a training log or dump (by content: a README or
    notes file does not make one), a torchrun run directory (attempt_N/), or a directory holding
    only one such run; other directories are searched. --glob or --manifest list the jobs instead.
    Every finished row is stored at once, so a killed scan, run again, analyses only the jobs it
    had not finished; jobs whose inputs and analyzer are unchanged are taken from the store.

    Exit status: 0 no failure found, 1 at least one failure identified, 2 nothing to scan,
    3 a job crashed the analyzer and none failed.
    """
    from analyzer.fleet import ScanError
    from analyzer.fleet.jobs import find_jobs
    from analyzer.fleet.scan import events_path, findings_path, scan, write_outputs
    from analyzer.fleet.store import default_store_path
    from analyzer.fleet.view import exit_status, fleet_view
    from analyzer.fleet.page_text import print_fleet_summary, print_job_search

    if not roots and manifest is None:
        raise CannotAnalyse("give at least one ROOT directory, or --manifest FILE")
    store = None if no_cache else (cache_path or default_store_path(out))
    outputs = [p for p in (out, findings_path(out), events_path(out), jsonl, html_out) if p is not None]
    for path, what in ((out, "scan table"), (jsonl, "JSON Lines"), (html_out, "fleet page"), (store, "scan store")):
        if path is not None:
            _prepare_output(path, what)
    stderr = Console(stderr=True, highlight=False, emoji=False)
    try:
        search = find_jobs(roots, pattern=pattern, manifest=manifest, exclude=[*outputs, *([store] if store else [])])
        if not quiet or not search.jobs:
            print_job_search(search, [str(r) for r in roots] or [str(manifest)], stderr)
        if not search.jobs:
            raise CannotAnalyse(f"no job found under {', '.join(map(str, roots)) or manifest}"
                                + (f" matching {pattern!r}" if pattern else ""))
        events_dir, scratch = _events_dir(events, store)
        try:
            result = scan(search.paths(), engine=engine, workers=workers, store_path=store, content_hash=content_hash,
                          ray_address=ray_address, job_timeout=job_timeout or None, job_memory_mb=job_memory or None,
                          events_dir=events_dir,
                          progress=None if quiet else _progress_bar(stderr))
            written = write_outputs(result, out, jsonl=jsonl, events=events)
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
    except ScanError as exc:
        raise CannotAnalyse(str(exc)) from exc
    view = fleet_view(result.frame)
    if html_out is not None:
        _write_html(view, html_out)
    if not quiet:
        console = report_console()
        console.print(f"{len(search.jobs)} jobs: {result.analysed} analysed, {result.reused} reused from the store, "
                      f"in {result.seconds:.1f} s ({engine} engine); wrote {', '.join(map(str, written))}", soft_wrap=True)
        print_fleet_summary(view, console, top=top)
    sys.exit(exit_status(view))


def _events_dir(events: bool, store: Path | None) -> tuple[Path | None, Path | None]:
    """Where workers write each job's events: beside the store (kept, reused), or a scratch folder."""
    from analyzer.fleet.store import Store

    if not events:
        return None, None
    if store is not None:
        return Store.events_dir_for(store), None
    scratch = Path(tempfile.mkdtemp(prefix="postmortem-events-"))
    return scratch, scratch


def _progress_bar(console: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), console=console, transient=False)
    task_id = None

    def advance(done: int, total: int) -> None:
        nonlocal task_id
        if task_id is None:
            task_id = bar.add_task("scan", total=total)
            bar.start()
        bar.update(task_id, completed=done)
        if done >= total:
            bar.stop()

    return advance


def _write_html(view, path: Path) -> None:
    from analyzer.fleet.page_html import render_fleet_html

    try:
        path.write_text(render_fleet_html(view), encoding="utf-8")
    except OSError as exc:
        raise CannotAnalyse(f"cannot write the fleet page to {path}: {exc.strerror or exc}") from exc


@click.command("fleet")
@click.argument("scan_file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--html", "html_out", type=click.Path(path_type=Path, dir_okay=False), help="Write the fleet page here.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the terminal summary.")
def fleet_command(scan_file: Path, html_out: Path | None, top: int) -> None:
    """Summarise a scan (Parquet or JSON Lines from `postmortem scan`): repeat-offender hosts and
    GPUs, recurring signatures, jobs not analysed.

    Exit status, as the scan's: 0 no failure found, 1 at least one failure identified, 2 not a
    scan table or no job in it, 3 a job crashed the analyzer and none failed.
    """
    from analyzer.fleet.rows import row_schema
    from analyzer.fleet.scan import read_scan
    from analyzer.fleet.view import exit_status, fleet_view
    from analyzer.fleet.page_text import print_fleet_summary

    if html_out is not None:
        _prepare_output(html_out, "fleet page")
    try:
        frame = read_scan(scan_file)
    except Exception as exc:  # noqa: BLE001 - polars raises several kinds for a file that is not a scan
        raise CannotAnalyse(f"{scan_file}: not a scan table ({type(exc).__name__}: {exc})") from exc
    missing = set(row_schema()) - set(frame.columns)
    if missing:
        raise CannotAnalyse(f"{scan_file}: not a scan table (missing columns {sorted(missing)})")
    view = fleet_view(frame)
    if html_out is not None:
        _write_html(view, html_out)
    print_fleet_summary(view, report_console(), top=top)
    sys.exit(exit_status(view))
