"""Stage 6, render (fleet page): one self-contained HTML page for a scan's `FleetView`.

No script and nothing loaded from the network (incident machines are often offline); the style
is inline. Every string that came from a log or a path (host names, job paths, summaries, errors)
goes through `html.escape`; numbers are formatted, never interpolated raw. A long job path wraps
inside its cell, after a `/` where it can (`<wbr>`) and anywhere else where it must, so a table
never grows wider than the page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

import polars as pl

from analyzer import __version__
from analyzer.fleet.view import FleetView

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1b1f24;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}code,.path{font-family:ui-monospace,monospace;font-size:12.5px}
.muted{color:#57606a}.bar{display:inline-block;height:9px;background:#cf222e;margin-right:6px;vertical-align:middle}
.totals span{display:inline-block;margin-right:18px}.bad{color:#cf222e;font-weight:600}
td{overflow-wrap:anywhere}.path{overflow-wrap:anywhere;word-break:break-word}
"""

Cell = Callable[[dict], str]


def render_fleet_html(view: FleetView, title: str = "postmortem fleet view", top: int = 50) -> str:
    parts = [
        *_head(title, view.totals),
        *_hosts_section(view, top),
        *_gpus_section(view, top),
        *_signatures_section(view, top),
        *_jobs_sections(view),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


_TOTALS = (("jobs", "jobs"), ("failed", "failed"), ("no_failure", "no failure found"),
           ("cannot_analyse", "could not be analysed"), ("timed_out", "timed out"),
           ("over_memory", "over the memory budget"), ("crashed", "crashed the analyzer"))


def _head(title: str, t: dict[str, int]) -> list[str]:
    """The document head, the title and the line of totals."""
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">postmortem {escape(__version__)}: one row per job in the scan; a failed job is an '
        "analysed job whose verdict is not <code>none</code>.</p>",
        '<p class="totals">' + "".join(f"<span>{escape(label)}: <b>{t[key]}</b></span>" for key, label in _TOTALS) + "</p>",
    ]


def _hosts_section(view: FleetView, top: int) -> list[str]:
    max_jobs = max([1, *view.hosts.get_column("failed_jobs").to_list()])
    return [
        "<h2>Repeat-offender hosts</h2>",
        '<p class="muted">Hosts named by failed jobs\' verdicts (culprit hosts and the hosts of culprit ranks), '
        "ranked by distinct failed jobs, then by the sum of those verdicts' confidence. "
        "<i>seen in</i> counts every scanned job the host appears in.</p>",
        _table(
            view.hosts.head(top),
            ("host", "failed jobs", "seen in", "confidence sum", "mean conf.", "categories", "GPUs", "example jobs"),
            (
                lambda r: f'<span class="path">{escape(r["host"])}</span>',
                lambda r: f'<span class="bar" style="width:{80 * r["failed_jobs"] / max_jobs:.0f}px"></span>{r["failed_jobs"]}',
                lambda r: str(r["jobs_seen"] or 0),
                lambda r: f"{r['confidence_sum']:.2f}",
                lambda r: f"{r['mean_confidence']:.2f}",
                lambda r: escape(", ".join(r["categories"])),
                lambda r: escape(", ".join(r["gpus"])),
                lambda r: _paths(r["example_jobs"]),
            ),
            numeric=(1, 2, 3, 4),
            empty="No failed job named a host.",
        ),
    ]


def _gpus_section(view: FleetView, top: int) -> list[str]:
    return [
        "<h2>GPUs</h2>",
        '<p class="muted">Where the logs printed the culprit\'s CUDA device (as the process saw it).</p>',
        _table(
            view.gpus.head(top),
            ("GPU", "failed jobs", "confidence sum", "categories", "example jobs"),
            (
                lambda r: f'<span class="path">{escape(r["gpu"])}</span>',
                lambda r: str(r["failed_jobs"]),
                lambda r: f"{r['confidence_sum']:.2f}",
                lambda r: escape(", ".join(r["categories"])),
                lambda r: _paths(r["example_jobs"]),
            ),
            numeric=(1, 2),
            empty="No verdict named a GPU.",
        ),
    ]


def _signatures_section(view: FleetView, top: int) -> list[str]:
    return [
        "<h2>Recurring signatures</h2>",
        _table(
            view.signatures.head(top),
            ("rule", "category", "failed jobs", "fired in", "mean conf.", "hosts", "example jobs"),
            (
                lambda r: f"<code>{escape(r['rule_id'])}</code>",
                lambda r: escape(r["category"]),
                lambda r: str(r["failed_jobs"]),
                lambda r: str(r["jobs_fired"] or 0),
                lambda r: f"{r['mean_confidence']:.2f}",
                lambda r: escape(", ".join(r["hosts"][:12]) + (" ..." if len(r["hosts"]) > 12 else "")),
                lambda r: _paths(r["example_jobs"]),
            ),
            numeric=(2, 3, 4),
            empty="No failed job.",
        ),
    ]


def _jobs_sections(view: FleetView) -> list[str]:
    """Jobs by category, the failed jobs and the jobs that could not be analysed."""
    return [
        "<h2>Jobs by category</h2>",
        _table(view.categories, ("category", "jobs"),
               (lambda r: escape(r["category"] or "?"), lambda r: str(r["jobs"])), numeric=(1,), empty="No job."),
        "<h2>Failed jobs</h2>",
        _table(
            view.failed,
            ("job", "category", "culprit ranks", "culprit hosts", "confidence", "summary"),
            (
                lambda r: _path(r["job"]),
                lambda r: escape(r["category"]),
                lambda r: escape(_ranks(r["culprit_ranks"])),
                lambda r: escape(", ".join(r["culprit_hosts"] or [])),
                lambda r: f"{r['confidence']:.2f}",
                lambda r: escape((r["summary"] or "")[:400]),
            ),
            numeric=(4,),
            empty="No failed job.",
        ),
        "<h2>Jobs not analysed</h2>",
        _table(
            view.problems,
            ("job", "status", "error"),
            (
                lambda r: _path(r["job"]),
                lambda r: f'<span class="bad">{escape(r["status"])}</span>',
                lambda r: escape(r["error"] or ""),
            ),
            empty="Every job was analysed.",
        ),
    ]


def _table(frame: pl.DataFrame, headers: Sequence[str], cells: Sequence[Cell], *, numeric: Sequence[int] = (),
           empty: str) -> str:
    if not frame.height:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in frame.iter_rows(named=True):
        tds = "".join(f'<td{" class=n" if i in numeric else ""}>{cell(row)}</td>' for i, cell in enumerate(cells))
        body.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _path(path: str) -> str:
    """A path that wraps at its separators first (a break opportunity after every `/`)."""
    return f'<span class="path">{escape(path).replace("/", "/<wbr>")}</span>'


def _paths(paths: Sequence[str] | None) -> str:
    return "<br>".join(_path(p) for p in paths or [])


def _ranks(ranks: Sequence[int] | None) -> str:
    from analyzer.detect import format_ranks

    return format_ranks(list(ranks)) if ranks else ""
