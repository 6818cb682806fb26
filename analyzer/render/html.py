"""Stage 7, render (HTML): one self-contained incident report with a cross-rank timeline.

The page reads top-down like the terminal report: the verdict (category, culprits, confidence,
evidence with file:line, remediation), the other findings cause before symptom, the per-host
facts table (folded by `analyzer.render.tables`, differing cells marked), the checkpoint audit,
the timeline, then the inputs table. The timeline's frames come from `analyzer.render.timeline`;
`analyzer.render.timeline_payload` turns them into a compact columnar payload (string tables,
gzip+base64 when large) that the page's script (`assets/report.js`) draws with the vendored plotly.js.

The markup is the templates' (`templates/report*.html.j2`, extending the base the fleet page
shares, `analyzer.render.page`); this module hands them plain values: what each section shows,
folded and cut as the report needs. Remediation is the rules' Markdown, so numbered steps stay a list.

Offline and safe by construction: plotly.js and the script are inlined, a Content-Security-Policy
admits exactly those scripts (by hash) and no network, every string from the logs is escaped by
the templates' autoescaping and again by the script before plotly renders it, and the output is
deterministic (no clock, sorted frames, gzip with mtime 0).
"""

from __future__ import annotations

import base64
import hashlib
import math
import os

import polars as pl
from markupsafe import Markup

from analyzer.ranks import format_ranks
from analyzer.render import page
from analyzer.render.tables import VARIES, HostTable, Row, cell_note, checkpoint_parts, host_table, per_rank_text
from analyzer.render.timeline import FOLD_THRESHOLD, MAX_LANES, Timeline, build_timeline, step_times
from analyzer.render.timeline_marks import CLASSES
from analyzer.render.timeline_payload import STYLE, columns, embedded, inputs_payload, present_classes, timeline_payload
from analyzer.units import byte_size

INPUTS_INLINE = 500  # inputs listed as HTML rows; beyond, problems in HTML and all files in the payload
EVIDENCE_SHOWN = 3  # evidence lines of a secondary finding shown before "more"
FINDINGS_FULL_PER_RULE = 3  # findings of one signature shown in full; the rest one line each
FINDINGS_LISTED_PER_RULE = 50
CHECKPOINTS_SHOWN = 200
BUSBW_MAX_RUNS = 64  # curves drawn; a bigger set is summarised in the section's note
_CELL_CHARS = 160  # of one host-table cell's text; the tooltip has the rest
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def _polygon(corners: int, radius: float, rotate: float = -90.0, inner: float | None = None) -> str:
    """SVG points of a regular polygon (a star when `inner` gives the inner radius), centred at 0,0."""
    count = corners * (2 if inner else 1)
    points = []
    for i in range(count):
        r = inner if inner and i % 2 else radius
        angle = math.radians(rotate + 360.0 * i / count)
        points.append(f"{r * math.cos(angle):.2f},{r * math.sin(angle):.2f}")
    return " ".join(points)


# The legend's glyphs, drawn as the plot draws its markers (plotly symbol names), in a 12x12 box:
# our own SVG, inserted as it is.
_SVG_SHAPES = {name: Markup(svg) for name, svg in {
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
}.items()}

CLOCK_NOTES = {
    "c10d-year-inferred": "PyTorch C++ log headers carry no year; it was taken from the file's modification time",
    "glog-dated": "TensorFlow's C++ log headers (date and time)",
    "flight_recorder": "Flight Recorder entry creation times",
    "error.json": "torchelastic error file timestamps",
    "collector": "timestamps added by the log collector",
}


# --- assets ----------------------------------------------------------------------------------------


def _asset(*parts: str) -> str:
    return page.asset("analyzer.render", *parts)


def plotly_js() -> str:
    return _asset("vendor", "plotly-basic.min.js")


def _script_hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


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
    busbw = _busbw(analysis)
    # The busbw curve's script only rides along with a curve to draw: every script is hashed in the CSP.
    scripts = [plotly_js(), _asset("assets", "report.js")] + ([_asset("assets", "busbw.js")] if busbw else [])
    csp = page.policy("default-src 'none'", f"script-src {' '.join(_script_hash(s) for s in scripts)}",
                      "style-src 'unsafe-inline'", "img-src data: blob:", "font-src data:", "connect-src 'none'",
                      "base-uri 'none'", "form-action 'none'")
    return page.environment().get_template("report.html.j2").render(
        title=f"postmortem: {verdict['category']} - {report['job']['path']}",
        version=report["analyzer_version"],
        csp=csp,
        css=page.inline(_asset("assets", "report.css"), "style"),
        report=report,
        who=_who,
        limits={"evidence_shown": EVIDENCE_SHOWN, "findings_listed": FINDINGS_LISTED_PER_RULE},
        findings=_finding_blocks(report),
        hosts=_hosts(report),
        checkpoints=_checkpoints(report),
        busbw=busbw,
        timeline=_timeline(timeline, steps, step_ranks),
        inputs=_inputs(report),
        problems=report.get("problems") or [],
        data=embedded(payload),
        scripts=[page.inline(s, "script") for s in scripts],
    )


# --- findings --------------------------------------------------------------------------------------


def _finding_blocks(report: dict) -> list[tuple[str, object]]:
    """Findings after the verdict, in the report's order (cause before symptom).

    A signature that fired many times (one finding per host, say) shows its first
    FINDINGS_FULL_PER_RULE findings in full (("finding", f)); the others become one line each in a
    collapsed list right after them (("more", [f, ...]): at most FINDINGS_LISTED_PER_RULE lines,
    the JSON report has every one).
    """
    findings = report["findings"][1:] if report["verdict"]["category"] != "none" else report["findings"]
    blocks: list[tuple[str, object]] = []
    overflow: dict[str, list[dict]] = {}
    seen: dict[str, int] = {}
    for f in findings:
        seen[f["rule_id"]] = seen.get(f["rule_id"], 0) + 1
        if seen[f["rule_id"]] <= FINDINGS_FULL_PER_RULE:
            blocks.append(("finding", f))
            if seen[f["rule_id"]] == FINDINGS_FULL_PER_RULE:
                blocks.append(("more", overflow.setdefault(f["rule_id"], [])))
        else:
            overflow[f["rule_id"]].append(f)
    return blocks


def _who(f: dict) -> list[str]:
    """The ranks and hosts a finding names, as text (`ranks 0-3`, `hosts a, b ...`)."""
    who = []
    if f["ranks"]:
        who.append(f"ranks {format_ranks(f['ranks'])}")
    if f["hosts"]:
        who.append(f"hosts {', '.join(f['hosts'][:16])}" + (" ..." if len(f["hosts"]) > 16 else ""))
    return who


# --- hosts -----------------------------------------------------------------------------------------


def _hosts(report: dict) -> dict | None:
    """Per-host facts: one row per host (identical hosts folded), differing cells marked with a
    glyph, bold text and a tooltip naming the majority value; duplicate names and ranks that
    disagree within a host flagged on the host's row. None without host facts."""
    table = host_table(report)
    if table is None:
        return None
    notes = []
    if table.omitted:
        notes.append(f"{len(table.omitted)} more host(s) not shown as rows: {table.omitted_names}; "
                     "`--format json` lists every host.")
    if table.common_env:
        notes.append("Alike on every host that reports it: "
                     + ", ".join(f"{name}={value}" for name, value, _ in table.common_env) + ".")
    if table.per_host_env:
        notes.append("Set per host by design (not compared): " + ", ".join(table.per_host_env) + ".")
    rows = []
    for row in table.rows:
        listed = "; ".join(per_rank_text(entry) for entry in row.per_rank)
        per_rank = listed + (f"; and {row.per_rank_more} more" if row.per_rank_more else "") if row.per_rank else ""
        rows.append((row, [_host_cell(table, row, column.key) for column in table.columns], per_rank))
    return {"table": table, "rows": rows, "notes": notes}


def _host_cell(table: HostTable, row: Row, key: str) -> dict:
    """One cell: its column, class, tooltip and text; `marked` when it differs (glyph and bold)."""
    cell = {"col": key, "cls": "", "title": "", "text": "", "marked": False}
    if key == "ranks":
        return {**cell, "text": format_ranks(list(row.ranks))}
    value = row.cells.get(key)
    if value is VARIES:
        return {**cell, "cls": "varies", "text": "(one per host)"}
    if value is None:
        return {**cell, "cls": "unstated", "title": "no line of this host states it", "text": "\u2013"}
    text = value if len(value) <= _CELL_CHARS else value[:_CELL_CHARS] + "\u2026"
    full = [f"full value: {value}"] if text != value else []
    other = [table.column(key).other_side_note()] if key in row.other_side else []
    if key in row.marked:
        return {**cell, "cls": "differs", "title": "\n".join([cell_note(table, row, key), *full]), "text": text, "marked": True}
    if row.known_for(key):  # an affected version: a known issue of the table applies
        return {**cell, "cls": "known-issue", "title": "\n".join([*other, cell_note(table, row, key)]), "text": text}
    return {**cell, "title": "\n".join([*other, *full]), "text": text}


# --- checkpoints -----------------------------------------------------------------------------------


def _checkpoints(report: dict) -> dict | None:
    """The checkpoint audit: where to resume from, then every checkpoint newest first (None
    without an audit)."""
    if "checkpoints" not in report:
        return None
    checkpoints = report["checkpoints"] or []
    newest = next((c for c in checkpoints if c.get("newest_resumable")), None)
    step = exact = ""
    if newest is not None:
        step = f" (step {newest['step']})" if newest.get("step") is not None else ""
        exact = ("; it holds every component an exact resume needs" if newest.get("exact_resume") else
                 f"; for an exact resume it lacks {', '.join(newest.get('missing_components') or []) or 'some state'}")
    return {"count": len(checkpoints), "newest": newest, "step": step, "exact": exact,
            "rows": [_checkpoint_row(c) for c in checkpoints[:CHECKPOINTS_SHOWN]]}


def _size_cell(size: int | None) -> str:
    """A checkpoint's size in its table cell; a size the audit could not take is an empty cell."""
    return "" if size is None else byte_size(size)


def _checkpoint_row(c: dict) -> dict:
    readable, complete, resume = checkpoint_parts(c)
    return {
        "classes": " ".join(x for x in ("newest" if c.get("newest_resumable") else "", "" if c.get("readable") else "bad") if x),
        "path": c["path"], "format": c["format"], "step": c.get("step"),
        "saved": (c.get("mtime") or "").replace("T", " ")[:19], "size": _size_cell(c.get("size_bytes")),
        "readable": bool(c.get("readable")), "readable_text": readable, "complete": complete, "resume": resume,
        "newest": bool(c.get("newest_resumable")),
    }


# --- nccl-tests bus bandwidth ----------------------------------------------------------------------


def _busbw(analysis) -> dict | None:
    """nccl-tests runs: busbw by size per run (or host) against the line its transport should reach."""
    from analyzer.analyses.bandwidth import judged_runs
    from analyzer.parse.nccltests import results_frame

    results = results_frame(analysis.events)
    if results.height == 0:
        return None
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
    return {"note": note, "payload": payload}


# --- timeline --------------------------------------------------------------------------------------


def _timeline(timeline: Timeline, steps: pl.DataFrame, step_ranks: int) -> dict:
    """The timeline section's notes, its legend (every glyph drawn, by shape and name, readable
    without colour) and the step-time panel's caption (None without trace step times)."""
    legend = [{"cls": c, "name": CLASSES[c], "style": STYLE[c], "shape": _SVG_SHAPES[STYLE[c].symbol]}
              for c in present_classes(timeline)]
    return {"notes": timeline_notes(timeline), "legend": legend, "steps": _steps(steps, step_ranks)}


def _steps(steps: pl.DataFrame, step_ranks: int) -> dict | None:
    if not steps.height:
        return None
    culprits = sorted(set(steps.filter(pl.col("culprit")).get_column("rank").to_list()))
    drawn = steps.get_column("rank").n_unique()
    who = (f"culprit rank(s) {format_ranks(culprits)} in red" if culprits else "no culprit rank named")
    shown = f"{drawn} of {step_ranks} ranks drawn (culprits first, the others evenly spread)" if drawn < step_ranks else f"{drawn} ranks"
    caption = (f"Per rank and step, from the GPU traces: {who}; {shown}. Left: step duration (alike on every rank, "
               "the collectives synchronise them). Right: the step less its NCCL kernel time; the straggler's is the "
               "longest, the others spend that time waiting for it inside NCCL.")
    return {"culprits": format_ranks(culprits), "caption": caption}


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


# --- inputs ----------------------------------------------------------------------------------------


def _inputs(report: dict) -> dict:
    """Every input file; a large job lists only those not fully parsed (the page pages the rest
    from the embedded data)."""
    inputs = report["inputs"]
    counts: dict[str, int] = {}
    for item in inputs:
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    rows = inputs if len(inputs) <= INPUTS_INLINE else [i for i in inputs if i["status"] != "parsed"][:INPUTS_INLINE]
    return {
        "count": len(inputs),
        "summary": ", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
        "rows": [{**i, "recognised": f"{round(100 * (i['lines'] - i['unparsed_lines']) / i['lines'])}%" if i["lines"] else ""}
                 for i in rows],
    }
