"""Stage 7, render (HTML): one self-contained incident report with a cross-rank timeline.

The page reads top-down like the terminal report: the verdict (category, culprits, confidence,
evidence with file:line, remediation), the other findings cause before symptom, the per-host
facts table (folded by `analyzer.render.tables`, differing cells marked), the checkpoint audit,
the timeline, then the inputs table. The timeline's frames come from `analyzer.render.timeline`;
`analyzer.render.timeline_payload` turns them into a compact columnar payload (string tables,
gzip+base64 when large) that the page's script (`assets/report.js`) draws with the vendored plotly.js.

Offline and safe by construction: plotly.js and the script are inlined, a Content-Security-Policy
admits exactly those two scripts (by hash) and no network, every string from the logs is escaped
in the HTML and again by the script before plotly renders it, and the output is deterministic
(no clock, sorted frames, gzip with mtime 0).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from functools import cache
from importlib import resources

import polars as pl

from analyzer.detect import format_ranks
from analyzer.render.tables import VARIES, HostTable, cell_note, checkpoint_parts, host_table, human_size, per_rank_text
from analyzer.render.timeline import CLASSES, FOLD_THRESHOLD, MAX_LANES, Timeline, build_timeline, step_times
from analyzer.render.timeline_payload import (STYLE, Style, columns, data_element, inputs_payload, present_classes,
                                             timeline_payload)

INPUTS_INLINE = 500  # inputs listed as HTML rows; beyond, problems in HTML and all files in the payload
EVIDENCE_SHOWN = 3  # evidence lines of a secondary finding shown before "more"
FINDINGS_FULL_PER_RULE = 3  # findings of one signature shown in full; the rest one line each
FINDINGS_LISTED_PER_RULE = 50


def _polygon(corners: int, radius: float, rotate: float = -90.0, inner: float | None = None) -> str:
    """SVG points of a regular polygon (a star when `inner` gives the inner radius), centred at 0,0."""
    count = corners * (2 if inner else 1)
    points = []
    for i in range(count):
        r = inner if inner and i % 2 else radius
        angle = math.radians(rotate + 360.0 * i / count)
        points.append(f"{r * math.cos(angle):.2f},{r * math.sin(angle):.2f}")
    return " ".join(points)


# The legend's glyphs, drawn as the plot draws its markers (plotly symbol names), in a 12x12 box.
_SVG_SHAPES = {
    "circle": '<circle r="4.5"/>',
    "pentagon": f'<polygon points="{_polygon(5, 5.2)}"/>',
    "triangle-up": '<polygon points="0,-5 5,4 -5,4"/>',
    "triangle-down": '<polygon points="0,5 5,-4 -5,-4"/>',
    "triangle-right": '<polygon points="-4,-5 5,0 -4,5"/>',
    "x": '<path d="M-4,-4L4,4M4,-4L-4,4" fill="none" stroke="currentColor" stroke-width="2.4"/>',
    "hourglass": '<polygon points="-4.5,-5 4.5,-5 -4.5,5 4.5,5"/>',
    "star": f'<polygon points="{_polygon(5, 5.8, inner=2.4)}"/>',
    "diamond": '<polygon points="0,-5.5 5.5,0 0,5.5 -5.5,0"/>',
    "circle-cross": '<circle r="4.8"/><path d="M0,-4.8V4.8M-4.8,0H4.8" stroke="#fff" stroke-width="1.4"/>',
    "square": '<rect x="-4.2" y="-4.2" width="8.4" height="8.4"/>',
    "hexagon": f'<polygon points="{_polygon(6, 5.2)}"/>',
}


def _glyph_svg(style: Style) -> str:
    return (f'<svg class="glyph" viewBox="-6 -6 12 12" width="14" height="14" aria-hidden="true" '
            f'style="color:{style.color}" fill="currentColor">{_SVG_SHAPES[style.symbol]}</svg>')


CLOCK_NOTES = {
    "c10d-year-inferred": "PyTorch C++ log headers carry no year; it was taken from the file's modification time",
    "flight_recorder": "Flight Recorder entry creation times",
    "error.json": "torchelastic error file timestamps",
    "collector": "timestamps added by the log collector",
}

_CONFIDENCE_WORDS = ((0.85, "high"), (0.6, "medium"), (0.0, "low"))


# --- assets ----------------------------------------------------------------------------------------


@cache
def _asset(*parts: str) -> str:
    return resources.files("analyzer.render").joinpath(*parts).read_text(encoding="utf-8")


def plotly_js() -> str:
    return _asset("vendor", "plotly-basic.min.js")


def _script_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


def _inline_script(source: str) -> str:
    # A script element ends at the first "</script" whatever the JS means by it.
    if "</script" in source.lower():
        raise ValueError("inline script contains '</script'")
    return f"<script>{source}</script>"


# --- public ----------------------------------------------------------------------------------------


def write_html(analysis, path: str | os.PathLike[str], **options) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(render_html(analysis, **options))


def render_html(analysis, *, fold_threshold: int = FOLD_THRESHOLD, max_lanes: int = MAX_LANES) -> str:
    """The report page for an `analyzer.api.Analysis` (events with event_id, findings, report)."""
    report = analysis.report
    verdict = report["verdict"]
    evidence = analysis.findings.get_column("evidence").to_list() if analysis.findings.height else []
    has_verdict = verdict["category"] != "none" and bool(evidence)
    timeline = build_timeline(
        analysis.events,
        culprit_ranks=verdict["culprit_ranks"],
        culprit_hosts=verdict["culprit_hosts"],
        verdict_evidence=evidence[0] if has_verdict else (),
        other_evidence=[e for ids in evidence[1 if has_verdict else 0:] for e in ids],
        fold_threshold=fold_threshold,
        max_lanes=max_lanes,
    )
    payload = timeline_payload(timeline, analysis.events)
    steps, step_ranks = step_times(analysis.events, verdict["culprit_ranks"])
    if steps.height:
        payload["steps"] = columns(steps.with_columns(pl.col("culprit").cast(pl.Int8)))
    if len(report["inputs"]) > INPUTS_INLINE:
        payload["inputs"] = inputs_payload(report["inputs"])
    data_script = data_element(payload)
    plotly = plotly_js()
    script = _asset("assets", "report.js")
    busbw_section = _busbw_html(analysis)
    # The busbw curve's script only rides along with a curve to draw: every script is hashed in the CSP.
    scripts = [plotly, script] + ([_asset("assets", "busbw.js")] if busbw_section else [])
    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(_script_hash(s) for s in scripts)}; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'; "
        "base-uri 'none'; form-action 'none'"
    )
    job = report["job"]
    title = f"postmortem: {verdict['category']} - {job['path']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(csp, quote=False)}">',  # ours: no " inside
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{_e(title)}</title>",
        f"<style>{_asset('assets', 'report.css')}</style>",
        "</head>",
        "<body>",
        _header_html(report),
        "<main>",
        _verdict_html(report),
        _findings_html(report),
        _hosts_html(report),
        _checkpoints_html(report),
        busbw_section,
        _timeline_html(timeline, steps, step_ranks),
        _inputs_html(report),
        _problems_html(report),
        "</main>",
        data_script,
        *map(_inline_script, scripts),
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


# --- static sections -------------------------------------------------------------------------------


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _confidence(value: float) -> str:
    word = next(w for threshold, w in _CONFIDENCE_WORDS if value >= threshold)
    return f"{value:.2f} ({word})"


def _header_html(report: dict) -> str:
    job = report["job"]
    meta = [
        f"outcome: <b>{_e(job['outcome'])}</b>",
        f"world size: {_e(job['world_size'] if job['world_size'] is not None else '?')}",
        f"ranks seen: {len(job['ranks'])}",
        f"hosts: {len(job['hosts'])}",
        f"analyzer {_e(report['analyzer_version'])}, report schema {_e(report['schema_version'])}",
    ]
    return (
        "<header>"
        f"<h1>postmortem report: <span class=\"mono\">{_e(job['path'])}</span></h1>"
        f"<p class=\"meta\">{''.join(f'<span>{m}</span>' for m in meta)}</p>"
        "</header>"
    )


def _evidence_html(evidence: list[dict], shown: int | None = None) -> str:
    if not evidence:
        return ""

    def item(ev: dict) -> str:
        rank = f'<span class="rank">rank {_e(ev["rank"])}</span>' if ev.get("rank") is not None else ""
        return (f'<li><code class="loc">{_e(ev["file"])}:{_e(ev["line"])}</code>{rank}'
                f'<pre>{_e(ev["text"])}</pre></li>')

    head = evidence if shown is None else evidence[:shown]
    rest = [] if shown is None else evidence[shown:]
    out = '<ul class="evidence">' + "".join(item(ev) for ev in head) + "</ul>"
    if rest:
        out += (f"<details><summary>{len(rest)} more evidence line(s)</summary>"
                f'<ul class="evidence">{"".join(item(ev) for ev in rest)}</ul></details>')
    return out


def _verdict_html(report: dict) -> str:
    verdict = report["verdict"]
    findings = report["findings"]
    none = verdict["category"] == "none"
    facts = []
    if not none:
        ranks = format_ranks(verdict["culprit_ranks"]) if verdict["culprit_ranks"] else ""
        hosts = ", ".join(verdict["culprit_hosts"])
        facts.append(("culprit rank(s)", f'<span class="culprit">{_e(ranks)}</span>' if ranks else "not named by the evidence"))
        facts.append(("culprit host(s)", f'<span class="culprit">{_e(hosts)}</span>' if hosts else "not named by the evidence"))
        facts.append(("confidence", _e(_confidence(verdict["confidence"]))))
        facts.append(("signature", f'<code>{_e(verdict["rule_id"])}</code>'))
    body = [
        f'<section id="verdict" class="verdict{" none" if none else ""}">',
        f'<h2>Verdict</h2><div><span class="category">{_e(verdict["category"])}</span>'
        f'<span class="title">{_e(verdict["title"])}</span></div>',
        f'<p class="summary">{_e(verdict["summary"])}</p>',
    ]
    if facts:
        body.append('<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>")
    if verdict["evidence"]:
        body.append("<h3>Evidence</h3>" + _evidence_html(verdict["evidence"]))
    if findings and not none:
        body.append(f'<h3>What to do</h3><div class="remediation">{_e(findings[0]["remediation"])}</div>')
    body.append("</section>")
    return "\n".join(body)


def _findings_html(report: dict) -> str:
    """Findings after the verdict, in the report's order (cause before symptom).

    A signature that fired many times (one finding per host, say) shows its first
    FINDINGS_FULL_PER_RULE findings in full; the others become one line each in a collapsed list
    right after them (at most FINDINGS_LISTED_PER_RULE; the JSON report has every one).
    """
    findings = report["findings"][1:] if report["verdict"]["category"] != "none" else report["findings"]
    if not findings:
        return '<section id="findings"><h2>Other findings</h2><p class="muted">None.</p></section>'
    blocks: list[str | list[dict]] = []
    overflow: dict[str, list[dict]] = {}
    seen: dict[str, int] = {}
    for f in findings:
        seen[f["rule_id"]] = seen.get(f["rule_id"], 0) + 1
        if seen[f["rule_id"]] <= FINDINGS_FULL_PER_RULE:
            blocks.append(_finding_html(f))
            if seen[f["rule_id"]] == FINDINGS_FULL_PER_RULE:
                blocks.append(overflow.setdefault(f["rule_id"], []))
        else:
            overflow[f["rule_id"]].append(f)
    items = [block if isinstance(block, str) else _more_findings_html(block) for block in blocks]
    return ('<section id="findings"><h2>Other findings <span class="muted">(cause before symptom)</span></h2>'
            + "".join(items) + "</section>")


def _who(f: dict) -> list[str]:
    who = []
    if f["ranks"]:
        who.append(f"ranks {_e(format_ranks(f['ranks']))}")
    if f["hosts"]:
        who.append(f"hosts {_e(', '.join(f['hosts'][:16]))}" + (" ..." if len(f["hosts"]) > 16 else ""))
    return who


def _finding_html(f: dict) -> str:
    symptom = (f'<span class="tag">symptom of {_e(", ".join(f["caused_by"]))}</span>' if f["caused_by"] else "")
    tags = " \u00b7 ".join([_e(f["category"]), f"confidence {_e(_confidence(f['confidence']))}",
                             f"<code>{_e(f['rule_id'])}</code>", *_who(f)])
    return (
        '<article class="finding">'
        f'<div><span class="sev {_e(f["severity"])}">{_e(f["severity"])}</span><b>{_e(f["title"])}</b>{symptom}'
        f'<span class="tag">{tags}</span></div>'
        f'<p class="summary">{_e(f["summary"])}</p>'
        f"{_evidence_html(f['evidence'], EVIDENCE_SHOWN)}"
        f'<details><summary>What to do</summary><div class="remediation">{_e(f["remediation"])}</div></details>'
        "</article>"
    )


def _more_findings_html(more: list[dict]) -> str:
    if not more:
        return ""
    listed = more[:FINDINGS_LISTED_PER_RULE]
    dot = " \u00b7 "
    rows = "".join(f'<li>{dot.join(_who(f)) or "(no rank or host named)"}: {_e(f["summary"])}</li>' for f in listed)
    rest = len(more) - len(listed)
    tail = f'<p class="muted">and {rest} more; `--format json` lists every finding.</p>' if rest else ""
    return (f'<details class="finding"><summary>{len(more)} more finding(s) of <code>{_e(more[0]["rule_id"])}</code>'
            f"</summary><ul>{rows}</ul>{tail}</details>")


def _hosts_html(report: dict) -> str:
    """Per-host facts: one row per host (identical hosts folded), differing cells marked with a
    glyph, bold text and a tooltip naming the majority value; duplicate names and ranks that
    disagree within a host flagged on the host's row."""
    table = host_table(report)
    if table is None:
        return ('<section id="hosts"><h2>Hosts</h2><p class="muted">No per-host facts: no line states an NCCL '
                "version, driver, GPU or NCCL_*/TORCH_* variable (NCCL_DEBUG=INFO prints them).</p></section>")
    differ = (f"{table.differing_hosts} with a value that differs or a duplicate name" if table.differing_hosts else "all alike")
    head = "".join(f'<th data-col="{_e(c.key)}">{_e(c.label)}</th>' for c in table.columns)
    rows = "".join(_host_row_html(table, row) for row in table.rows)
    legend = ('<p class="legend"><span class="mark">\u2260</span> <b>bold</b>: a value that differs across hosts, '
              "not the one most hosts have or one side of an even split (hover the cell for the majority value); <span class=\"flag\">\u26a0 duplicate name</span>: several "
              "machines report under one host name; <span class=\"flag culprit-flag\">verdict</span>: a host the "
              "verdict names. Hosts whose facts are identical are folded into one row.</p>") if table.marked else ""
    notes = []
    if table.omitted:
        notes.append(f"{len(table.omitted)} more host(s) not shown as rows: {table.omitted_names}; "
                     "`--format json` lists every host.")
    if table.common_env:
        notes.append("Alike on every host that reports it: "
                     + ", ".join(f"{name}={value}" for name, value, _ in table.common_env) + ".")
    if table.per_host_env:
        notes.append("Set per host by design (not compared): " + ", ".join(table.per_host_env) + ".")
    return (
        f'<section id="hosts"><h2>Hosts <span class="muted">({table.hosts} host{"s" if table.hosts != 1 else ""}: '
        f"{_e(differ)})</span></h2>{legend}"
        f'<div class="wide"><table class="hosts"><tr><th>host</th>{head}</tr>{rows}</table></div>'
        + "".join(f'<p class="muted">{_e(n)}</p>' for n in notes)
        + "</section>"
    )


_CELL_CHARS = 160  # of one cell's text; the tooltip has the rest


def _host_row_html(table: HostTable, row) -> str:
    if row.folded:
        label = f"{len(row.hosts)} hosts alike" if row.alike else f"{len(row.hosts)} hosts"
        names = f'<span class="mono names">{_e(row.names)}</span>'
        host = (f'<span class="fold">{_e(label)}</span> '
                + (names if len(row.names) <= 120 else f"<details><summary>names</summary>{names}</details>"))
        attrs = f' data-fold="{len(row.hosts)}"'
    else:
        host = f'<span class="mono name">{_e(row.hosts[0])}</span>'
        attrs = f' data-host="{_e(row.hosts[0])}"'
    if row.duplicate_name:
        host += ' <span class="flag dup" title="processes under this name report different addresses on one interface">\u26a0 duplicate name</span>'
    if row.culprit:
        host += ' <span class="flag culprit-flag" title="named by the verdict">verdict</span>'
    cells = []
    for column in table.columns:
        if column.key == "ranks":
            cells.append(f'<td data-col="ranks">{_e(format_ranks(list(row.ranks)))}</td>')
            continue
        value = row.cells.get(column.key)
        if value is VARIES:
            cells.append(f'<td data-col="{_e(column.key)}" class="varies">(one per host)</td>')
            continue
        if value is None:
            cells.append(f'<td data-col="{_e(column.key)}" class="unstated" title="no line of this host states it">\u2013</td>')
            continue
        text = value if len(value) <= _CELL_CHARS else value[:_CELL_CHARS] + "\u2026"
        if column.key in row.marked:
            title = cell_note(table, row, column.key) + (f"\nfull value: {value}" if text != value else "")
            cells.append(f'<td data-col="{_e(column.key)}" class="differs" title="{_e(title)}">'
                         f'<span class="mark">\u2260</span>\u00a0<b>{_e(text)}</b></td>')
        elif row.known_for(column.key):  # an affected version: a known issue of the table applies
            notes = [column.other_side_note()] if column.key in row.other_side else []
            title = "\n".join([*notes, cell_note(table, row, column.key)])
            cells.append(f'<td data-col="{_e(column.key)}" class="known-issue" title="{_e(title)}">{_e(text)}</td>')
        else:
            notes = [column.other_side_note()] if column.key in row.other_side else []
            notes += [f"full value: {value}"] if text != value else []
            title = f' title="{_e(chr(10).join(notes))}"' if notes else ""
            cells.append(f'<td data-col="{_e(column.key)}"{title}>{_e(text)}</td>')
    classes = " ".join(c for c in ("host-row", "marked" if row.marked else "", "dup" if row.duplicate_name else "",
                                   "alike" if row.alike else "") if c)
    out = f'<tr class="{classes}"{attrs}><td class="host">{host}</td>{"".join(cells)}</tr>'
    if row.per_rank:
        listed = "; ".join(per_rank_text(entry) for entry in row.per_rank)
        more = f"; and {row.per_rank_more} more" if row.per_rank_more else ""
        out += (f'<tr class="per-rank"><td></td><td colspan="{len(table.columns)}"><span class="mark">\u2260</span> '
                f"ranks of this host disagree: {_e(listed + more)}</td></tr>")
    return out


CHECKPOINTS_SHOWN = 200


def _checkpoints_html(report: dict) -> str:
    """The checkpoint audit: where to resume from, then every checkpoint newest first."""
    if "checkpoints" not in report:
        return ""
    checkpoints = report["checkpoints"] or []
    if not checkpoints:
        return ('<section id="checkpoints"><h2>Checkpoints</h2><p class="muted">No checkpoint found in or next to the job '
                "(`--checkpoint PATH` audits one elsewhere).</p></section>")
    newest = next((c for c in checkpoints if c.get("newest_resumable")), None)
    if newest is not None:
        step = f" (step {newest['step']})" if newest.get("step") is not None else ""
        exact = ("; it holds every component an exact resume needs" if newest.get("exact_resume") else
                 f"; for an exact resume it lacks {', '.join(newest.get('missing_components') or []) or 'some state'}")
        resume = (f'<p class="resume">\u25b6 Resume from <b class="mono">{_e(newest["path"])}</b>{_e(step)}: the newest '
                  f"checkpoint that is complete and readable{_e(exact)}.</p>")
    else:
        resume = '<p class="resume none">\u2717 No checkpoint is complete and readable: none can be resumed from.</p>'
    head = "".join(f"<th>{h}</th>" for h in ("path", "format", "step", "saved (UTC)", "size", "readable", "complete", "resume"))
    rows = "".join(_checkpoint_row_html(c) for c in checkpoints[:CHECKPOINTS_SHOWN])
    more = (f'<p class="muted">and {len(checkpoints) - CHECKPOINTS_SHOWN} more; `--format json` lists every one.</p>'
            if len(checkpoints) > CHECKPOINTS_SHOWN else "")
    return (f'<section id="checkpoints"><h2>Checkpoints <span class="muted">({len(checkpoints)} found, newest first)</span></h2>'
            f'{resume}<div class="wide"><table class="checkpoints"><tr>{head}</tr>{rows}</table></div>{more}</section>')


def _checkpoint_row_html(c: dict) -> str:
    readable, complete, resume = checkpoint_parts(c)
    mark = "\u2713 " if c.get("readable") else "\u2717 "
    classes = " ".join(x for x in ("newest" if c.get("newest_resumable") else "", "" if c.get("readable") else "bad") if x)
    saved = (c.get("mtime") or "").replace("T", " ")[:19]
    resume_html = f"<b>\u25b6 {_e(resume)}</b>" if c.get("newest_resumable") else _e(resume)
    return (f'<tr class="{classes}"><td class="mono">{_e(c["path"])}</td><td>{_e(c["format"])}</td>'
            f'<td class="num">{_e(c["step"] if c.get("step") is not None else "")}</td><td>{_e(saved)}</td>'
            f'<td class="num">{_e(human_size(c.get("size_bytes")))}</td><td>{mark}{_e(readable)}</td><td>{_e(complete)}</td>'
            f"<td>{resume_html}</td></tr>")


BUSBW_MAX_RUNS = 64  # curves drawn; a bigger set is summarised in the section's note
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def _busbw_html(analysis) -> str:
    """nccl-tests runs: busbw by size per run (or host) against the line its transport should reach."""
    from analyzer.analyses.bandwidth import judged_runs
    from analyzer.parse.nccltests import results_frame

    results = results_frame(analysis.events)
    if results.height == 0:
        return ""
    runs = judged_runs(analysis.events)
    flagged = {e for ids in (analysis.findings.get_column("evidence").to_list() if analysis.findings.height else []) for e in ids}
    curves = (
        results.with_columns(pl.max_horizontal("oop_busbw", "ip_busbw").fill_nan(None).alias("busbw")).sort("run", "size")
        .group_by("run", maintain_order=True).agg("size", "busbw", pl.col("event_id").alias("ids"))
        .join(runs.select("run", "test", "file", "hosts", "expected", "basis"), on="run", how="left")
    )
    payload = {"palette": _PALETTE, "runs": []}
    for row in curves.head(BUSBW_MAX_RUNS).iter_rows(named=True):
        hosts = ", ".join((row["hosts"] or [])[:4])
        label = f"{row['test'] or 'nccl-tests'} {hosts or row['file'] or row['run']}".strip()
        payload["runs"].append({
            "label": label, "size": row["size"], "busbw": row["busbw"],
            "expected": row["expected"] if row["expected"] == row["expected"] else None,
            "basis": row["basis"] or "", "flagged": bool(flagged.intersection(row["ids"])),
        })
    note = f"{curves.height} run(s)" + (f"; the first {BUSBW_MAX_RUNS} drawn" if curves.height > BUSBW_MAX_RUNS else "")
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    safe = raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return (
        '<section id="busbw"><h2>nccl-tests bus bandwidth <span class="muted">('
        + _e(note) + ', dashed: the expectation for the transport, hardware/bandwidth.toml)</span></h2>'
        + '<noscript><p>The curve needs JavaScript (inlined in this file; nothing is downloaded).</p></noscript>'
        + '<div id="busbw-plot"></div>'
        + f'<script type="application/json" id="pm-busbw">{safe}</script></section>'
    )


def _timeline_html(timeline: Timeline, steps: pl.DataFrame, step_ranks: int) -> str:
    notes = timeline_notes(timeline)
    return (
        '<section id="timeline"><h2>Cross-rank timeline</h2>'
        + ('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else "")
        + '<p id="timeline-error"></p>'
        + '<noscript><p>The timeline needs JavaScript (inlined in this file; nothing is downloaded).</p></noscript>'
        + _legend_html(timeline)
        + '<ul id="timeline-folds" class="folds"></ul>'
        + '<div id="timeline-plot"></div>'
        + _steps_html(steps, step_ranks)
        + "</section>"
    )


def _legend_html(timeline: Timeline) -> str:
    """Every glyph the timeline draws, by shape and name (readable without colour), and what it means."""
    classes = present_classes(timeline)
    if not classes:
        return ""
    items = "".join(
        f'<li data-cls="{_e(c)}" data-symbol="{_e(STYLE[c].symbol)}">{_glyph_svg(STYLE[c])}'
        f"<b>{_e(CLASSES[c])}</b> <span class=\"muted\">{_e(STYLE[c].meaning)}</span></li>"
        for c in classes
    )
    rings = ('<li class="how"><svg class="glyph" viewBox="-6 -6 12 12" width="14" height="14" aria-hidden="true">'
             '<circle r="4" fill="none" stroke="#333" stroke-width="1.6"/></svg>'
             "<span class=\"muted\">dark outline: a finding's evidence (red outline: the verdict's); hollow: clock inferred; "
             "each kind has its own height in the lane, so markers at one time stay visible</span></li>")
    return f'<ul id="timeline-legend" class="glyphs" aria-label="marker legend">{items}{rings}</ul>'


def _steps_html(steps: pl.DataFrame, step_ranks: int) -> str:
    """The step-time panel's frame and caption; absent without trace step times."""
    if not steps.height:
        return ""
    culprits = sorted(set(steps.filter(pl.col("culprit")).get_column("rank").to_list()))
    drawn = steps.get_column("rank").n_unique()
    who = (f"culprit rank(s) {format_ranks(culprits)} in red" if culprits else "no culprit rank named")
    shown = f"{drawn} of {step_ranks} ranks drawn (culprits first, the others evenly spread)" if drawn < step_ranks else f"{drawn} ranks"
    caption = (f"Per rank and step, from the GPU traces: {who}; {shown}. Left: step duration (alike on every rank, "
               "the collectives synchronise them). Right: the step less its NCCL kernel time; the straggler's is the "
               "longest, the others spend that time waiting for it inside NCCL.")
    return (f'<div id="steps" data-culprits="{_e(format_ranks(culprits))}"><h3>Step time per rank</h3>'
            f'<p class="muted">{_e(caption)}</p><div id="steps-plot"></div></div>')


def timeline_notes(timeline: Timeline) -> list[str]:
    """What the reader must know to read the axes: clocks, untimed events, folding, thinning."""
    stats = timeline.stats
    notes: list[str] = []
    if not timeline.lanes.height:
        return ["No event of the job is drawn on the timeline (no init, step, warning, error, collective or last-line event)."]
    if stats["time_markers"]:
        sources = []
        for source, count, inferred in timeline.clocks.iter_rows():
            why = CLOCK_NOTES.get(source, "")
            sources.append(f"{source} ({count} event{'s' if count != 1 else ''}"
                           + (", clock inferred" if inferred else "") + (f": {why}" if why else "") + ")")
        notes.append("Times from every source are drawn on one UTC axis. Clock sources: " + "; ".join(sources) + ".")
        if timeline.clocks.filter(pl.col("inferred")).height:
            notes.append("Markers whose clock was inferred are drawn hollow.")
    if stats["order_markers"]:
        notes.append(f"{stats['order_markers']} marker(s) have no timestamp: they are placed on the "
                     "'line order' axis by their order within the lane (file, then line).")
    if stats["seq_markers"]:
        notes.append("Collectives by sequence number, per process group: last completed, last enqueued, and the "
                     "one each lane waits in (watchdog timeouts, pg status, Flight Recorder).")
    if stats["fold_level"] != "none":
        level = {"exact": "same markers and collective states",
                 "coarse": "same markers and collective states, sequence numbers ignored",
                 "final": "same final state"}[stats["fold_level"]]
        notes.append(f"{stats['units']} ranks (or processes) log here: {stats['folded_units']} that behave alike "
                     f"({level}) are folded, leaving {stats['lanes']} lanes; culprits and odd ones keep their own lanes. "
                     "Expand a folded lane with its button below or by clicking one of its markers.")
    thinned = f"At most {stats['per_class_cap']} markers per lane and kind are drawn (evenly thinned; evidence always drawn)"
    if stats["folded_units"]:
        thinned += "; an expanded fold shows each rank's first, middle and last marker of each kind"
    notes.append(thinned + ". Hover a marker for its log line; the culprit's lane is shaded red.")
    return notes


def _inputs_html(report: dict) -> str:
    inputs = report["inputs"]
    counts: dict[str, int] = {}
    for item in inputs:
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    rows = inputs if len(inputs) <= INPUTS_INLINE else [i for i in inputs if i["status"] != "parsed"][:INPUTS_INLINE]
    head = "".join(f"<th>{h}</th>" for h in ("file", "format", "ranks", "lines", "recognised", "status", "reason"))
    table = f'<table class="inputs"><tr>{head}</tr>{"".join(_input_row(i) for i in rows)}</table>' if rows else ""
    more = ""
    if len(rows) < len(inputs):
        # Large jobs: the files that were not fully parsed are listed above; every file is in the
        # embedded data, shown by the page in pages on request.
        listed = "the files that were not fully parsed are listed above; " if rows else "every file was parsed; "
        more = f'<p class="muted">{_e(listed)}the full list is one click away.</p><div id="inputs-all"></div>'
    return (f'<section id="inputs"><h2>Inputs <span class="muted">({len(inputs)} files: {_e(summary)})</span></h2>'
            f"{table}{more}</section>")


def _input_row(item: dict) -> str:
    lines, unparsed = item["lines"], item["unparsed_lines"]
    recognised = f"{round(100 * (lines - unparsed) / lines)}%" if lines else ""
    return (f'<tr class="{_e(item["status"])}"><td class="mono">{_e(item["file"])}</td><td>{_e(item["format"])}</td>'
            f'<td>{_e(format_ranks(item["ranks"]))}</td><td class="num">{lines}</td><td class="num">{recognised}</td>'
            f'<td>{_e(item["status"])}</td><td>{_e(item["reason"])}</td></tr>')


def _problems_html(report: dict) -> str:
    problems = report.get("problems") or []
    if not problems:
        return ""
    return ('<section id="problems"><h2>Analyzer problems</h2><ul>'
            + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul></section>")
