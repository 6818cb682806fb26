"""Batch (fleet, terminal): the summary of a scan's `FleetView`, and what a scan found.

Names on disk and in logs are data, never terminal input: `shown` escapes every C0/C1 control
character (ESC starts CSI and OSC sequences: OSC 52 writes the clipboard, OSC 0 the window title),
DEL, Unicode bidi overrides and isolates (U+202E makes a name read backwards), line and paragraph
separators and undecodable bytes as visible `\\xNN` / `\\uNNNN`, and rich markup is escaped.

Identifiers (hosts, rule ids, categories, GPUs) are never cut: lists stack one per line in their
cell, and a table whose narrowest layout does not fit the terminal is printed as one line per row
instead, left to the terminal to wrap (so `| grep` and copy-paste see whole lines).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from analyzer.fleet.jobs import JobSearch
from analyzer.fleet.view import FleetView
from analyzer.render.text import escape

MAX_LISTED = 4  # hosts or categories in one cell
MAX_ERROR_CHARS = 300
PIPE_WIDTH = 4096  # wider than any table: the width at which nothing is cut


def shown(text: object) -> str:
    """`text` safe to print through rich as one line: controls and bidi marks escaped, markup escaped."""
    return escape(text, one_line=True)


def _stack(values: Sequence[str] | None) -> str:
    values = list(values or [])
    more = f"\n+{len(values) - MAX_LISTED} more" if len(values) > MAX_LISTED else ""
    return "\n".join(shown(v) for v in values[:MAX_LISTED]) + more


def print_job_search(search: JobSearch, roots: Sequence[str], console: Console) -> None:
    """How many jobs were found and by which rule, what was read and left aside, and the warnings."""
    counts = search.by_rule()
    rules = "; ".join(f"{n} {rule}" for rule, n in counts.most_common())
    console.print(f"found {_count(len(search.jobs), 'job', 'jobs')} under {', '.join(shown(r) for r in roots)}: {rules or 'none'}",
                  soft_wrap=True)
    if search.not_jobs_count:
        names = ", ".join(f"{shown(d)} ({shown(f)})" for d, f in search.not_jobs[:3])
        more = f" and {search.not_jobs_count - 3} more" if search.not_jobs_count > 3 else ""
        console.print(f"not jobs: {_count(search.not_jobs_count, 'directory', 'directories')} holding files but no "
                      f"training log or dump: {names}{more}", soft_wrap=True)
    for job, nested in search.nested.items():
        console.print(f"[yellow]warning[/yellow]: the job {shown(job)} holds {len(nested)} subdirectories that look "
                      f"like jobs of their own ({', '.join(shown(n) for n in nested[:5])}"
                      f"{' ...' if len(nested) > 5 else ''}); they are analysed as one job. If they are separate "
                      "runs, list them with --glob or --manifest.", soft_wrap=True)
    if search.too_deep:
        console.print(f"[yellow]warning[/yellow]: {search.too_deep} directories deeper than the search's depth cap "
                      "were not searched", soft_wrap=True)
    for path in search.unlistable[:5]:
        console.print(f"[yellow]warning[/yellow]: cannot list {shown(path)}; not searched", soft_wrap=True)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def print_fleet_summary(view: FleetView, console: Console, top: int = 10) -> None:
    t = view.totals
    console.print(
        f"[bold]{t['jobs']} jobs[/bold]: {t['failed']} failed, {t['no_failure']} no failure found, "
        f"{t['cannot_analyse']} could not be analysed, {t['timed_out']} timed out, "
        + (f"{t['over_memory']} over the memory budget, " if t["over_memory"] else "")
        + f"{t['crashed']} crashed the analyzer", soft_wrap=True
    )
    hosts = _table("Repeat-offender hosts (cordon candidates)", ("host", "failed", "seen in", "conf. sum", "categories"))
    for row in view.hosts.head(top).iter_rows(named=True):
        hosts.add_row(shown(row["host"]), str(row["failed_jobs"]), str(row["jobs_seen"]), f"{row['confidence_sum']:.2f}",
                      _stack(row["categories"]))
    _print(hosts, console) if view.hosts.height else console.print("No failed job named a host.")
    gpus = _table("GPUs named by failed jobs", ("GPU", "failed", "conf. sum", "categories"))
    for row in view.gpus.head(top).iter_rows(named=True):
        gpus.add_row(shown(row["gpu"]), str(row["failed_jobs"]), f"{row['confidence_sum']:.2f}", _stack(row["categories"]))
    if view.gpus.height:
        _print(gpus, console)
    signatures = _table("Recurring signatures", ("rule / category", "failed", "fired in", "conf.", "hosts"))
    for row in view.signatures.head(top).iter_rows(named=True):
        signatures.add_row(f"{shown(row['rule_id'])}\n[dim]{shown(row['category'])}[/dim]", str(row["failed_jobs"]),
                           str(row["jobs_fired"]), f"{row['mean_confidence']:.2f}", _stack(row["hosts"]))
    if view.signatures.height:
        _print(signatures, console)
    for row in view.problems.head(top).iter_rows(named=True):
        error = shown((row["error"] or "")[:MAX_ERROR_CHARS])
        console.print(f"[yellow]{shown(row['status'])}[/yellow] {shown(row['job'])}: {error}", soft_wrap=True)
    if view.problems.height > top:
        console.print(f"... and {view.problems.height - top} more jobs not analysed (see the error column)")


def _natural_width(table: Table) -> int:
    """The width the table takes with every cell whole (rich's measure is clamped to the console)."""
    wide = Console(file=io.StringIO(), width=PIPE_WIDTH, color_system=None)
    wide.print(table)
    return max((len(line.rstrip()) for line in wide.file.getvalue().splitlines()), default=0)


def _table(title: str, headers: Sequence[str]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), title_justify="left")
    for header in headers:
        table.add_column(header, no_wrap=True)
    return table


def _print(table: Table, console: Console) -> None:
    """The table when it fits whole, else each row as a block: its first cell on a line, then one
    line per other column, a list one item per line when it does not fit on one (no identifier cut)."""
    if _natural_width(table) <= console.width:
        console.print(table)
        return
    console.print(f"[italic]{table.title}[/italic]")
    first, *rest = table.columns
    for index, name in enumerate(first.cells):
        _print_items(console, "  ", str(name).split("\n"))
        for column in rest:
            _print_items(console, f"    {column.header}: ", str(list(column.cells)[index]).split("\n"))


def _print_items(console: Console, label: str, items: list[str]) -> None:
    """`label` and the items on one line when that fits, else the label and one item per line."""
    line = label + ", ".join(items)
    if len(items) == 1 or Text.from_markup(line).cell_len <= console.width:
        console.print(line, soft_wrap=True)
        return
    if label.strip():
        console.print(label.rstrip())
    for item in items:
        console.print(" " * (len(label) - len(label.lstrip()) + 2) + item, soft_wrap=True)
