"""Stage 6, render (terminal): the verdict first, then findings cause before symptom, the hosts that
differ from the others (only when some do), the checkpoint audit, then inputs."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as _escape_markup
from rich.table import Table

from analyzer.render.tables import VARIES, checkpoint_parts, compact_hosts, host_table, known_issue_notes, per_rank_text

# Characters that steer a terminal or reorder what it shows: C0 controls but tab and newline (ESC
# starts CSI/OSC sequences, CR overwrites the line), DEL, C1 controls (U+009B is a one-byte CSI),
# and the bidirectional overrides, embeddings and isolates that make text read differently from
# what it is ("Trojan Source"). Each is shown as its escape, so the reader sees it was there.
# Line and paragraph separators and lone surrogates (undecodable bytes) are shown as escapes too.
_INERT = {
    **{c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A),
                                   *range(0xD800, 0xE000))},
}
# A name (a file, a job directory) is one line: its tab and newline are escaped as well.
_INERT_ONE_LINE = {**_INERT, 0x09: "\\x09", 0x0A: "\\x0a"}


def escape(text: object, *, one_line: bool = False) -> str:
    """Log text is data: rich markup is escaped and terminal control characters made visible escapes;
    `one_line` (names in tables, evidence quotes, which sit after their file:line) also escapes tab
    and newline."""
    return _escape_markup(str(text).translate(_INERT_ONE_LINE if one_line else _INERT))


_CONFIDENCE_WORDS = ((0.85, "high"), (0.6, "medium"), (0.0, "low"))


def _confidence(value: float) -> str:
    word = next(w for threshold, w in _CONFIDENCE_WORDS if value >= threshold)
    return f"{value:.2f} ({word})"


def _world_size(job: dict) -> str:
    """A size no line states is a lower bound (the ranks seen); one that sources contradict is no fact."""
    if any(c.startswith("world size") for c in job.get("facts_conflicts") or []):
        return "conflicting (see below)"
    if job["world_size"] is None:
        return "?"
    return str(job["world_size"]) if job.get("world_size_stated", True) else f">={job['world_size']} (inferred from the ranks seen)"


def _job_fact_lines(job: dict, console: Console) -> None:
    """Where the header's world size and time span come from, and the facts whose sources disagree."""
    if job.get("world_size_stated") and job.get("world_size_source"):
        console.print(f"  world size from {escape(job['world_size_source'])}")
    span = job.get("time_span")
    if span:
        untimed = f"; {span['files_untimed']} file(s) with no timestamped line" if span["files_untimed"] else ""
        console.print(f"  time span: {escape(span['start'])} .. {escape(span['end'])}"
                      f" (from {escape(span['start_source'])} to {escape(span['end_source'])}{untimed})")
    for conflict in job.get("facts_conflicts") or []:
        console.print(f"  [yellow]conflicting sources[/yellow]: {escape(conflict)}")


def render_text(report: dict, console: Console, *, all_inputs: bool = False) -> None:
    verdict = report["verdict"]
    job = report["job"]
    console.print(f"[bold]postmortem[/bold] {escape(job['path'])}  outcome: [bold]{job['outcome']}[/bold]"
                  f"  world size: {_world_size(job)}  hosts: {len(job['hosts'])}")
    _job_fact_lines(job, console)
    colour = "green" if verdict["category"] == "none" else "red"
    console.print(f"\n[bold {colour}]VERDICT: {escape(verdict['category'])}[/bold {colour}] - {escape(verdict['title'])}")
    console.print(escape(verdict["summary"]))
    if verdict["category"] != "none":
        console.print(f"confidence: {_confidence(verdict['confidence'])}  rule: {verdict['rule_id']}")
    for ev in verdict["evidence"]:
        console.print(f"  [cyan]{escape(ev['file'])}:{ev['line']}[/cyan]  {escape(ev['text'][:240], one_line=True)}")
    findings = report["findings"]
    if findings:
        console.print(f"\n[bold]What to do[/bold]\n{escape(findings[0]['remediation'])}")
    if len(findings) > 1:
        console.print("\n[bold]Other findings[/bold] (cause before symptom)")
        for f in findings[1:]:
            tag = " (symptom)" if f["caused_by"] else ""
            console.print(escape(f"- [{f['severity']}] {f['title']}{tag} [{f['category']}, {f['confidence']:.2f}]"))
            console.print(f"    {escape(f['summary'][:300])}")
            for ev in f["evidence"][:2]:
                console.print(f"    [cyan]{escape(ev['file'])}:{ev['line']}[/cyan]  {escape(ev['text'][:200], one_line=True)}")
    _hosts_table(report, console)
    _checkpoints_table(report, console)
    _inputs_table(report["inputs"], console, all_inputs)
    for problem in report.get("problems", []):
        console.print(f"[yellow]analyzer problem:[/yellow] {escape(problem)}")


def _inputs_table(inputs: list[dict], console: Console, all_inputs: bool) -> None:
    shown = inputs if all_inputs or len(inputs) <= 20 else [i for i in inputs if i["status"] != "parsed"][:20]
    table = Table(title=f"Inputs ({len(inputs)} files)", show_lines=False)
    # Names and reasons fold in a narrow terminal rather than being cut: cut paths of one job share
    # their prefix and become identical.
    for column in ("file", "format", "ranks", "lines", "unparsed", "status", "reason"):
        table.add_column(column, overflow="fold" if column in ("file", "reason") else "ellipsis")
    for item in shown:
        ranks = ",".join(str(r) for r in item["ranks"][:6]) + ("..." if len(item["ranks"]) > 6 else "")
        table.add_row(escape(item["file"]), item["format"], ranks, str(item["lines"]), str(item["unparsed_lines"]),
                      item["status"], escape(item["reason"]))
    if len(shown) < len(inputs):
        table.caption = f"{len(inputs) - len(shown)} parsed files not shown (--all-inputs lists them)"
    console.print(table)


CELL_CHARS = 60  # of one value in the hosts table
NAMES_CHARS = 300  # of a compact host list
CHECKPOINTS_SHOWN = 20
MAX_KNOWN_NOTES = 12


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _known_issues_notes(report: dict, console: Console) -> None:
    """Info-level notes: versions with a known issue whose symptom the logs do not show."""
    notes = known_issue_notes(report)
    if notes:
        console.print(f"\n[bold]Known issues of the versions in use[/bold] ({len(notes)}; `postmortem known-issues` lists them)")
        for note in notes[:MAX_KNOWN_NOTES]:
            console.print(f"  info: {escape(note)}")
        if len(notes) > MAX_KNOWN_NOTES:
            console.print(f"  ... {len(notes) - MAX_KNOWN_NOTES} more in the JSON report (job.host_facts[].known_issues)")


def _hosts_table(report: dict, console: Console) -> None:
    """The hosts that differ, in the columns that differ, against what most hosts have."""
    _known_issues_notes(report, console)
    table = host_table(report)
    if table is None or not table.marked:
        return
    columns = [c for c in table.columns if any(c.key in row.marked for row in table.rows)]
    rows = [row for row in table.rows if row.marked or row.duplicate_name]
    alike = [host for row in table.rows if not (row.marked or row.duplicate_name) for host in row.hosts]
    console.print(f"\n[bold]Hosts that differ[/bold] ({table.differing_hosts} of {table.hosts})")
    out = Table(show_lines=False)
    out.add_column("host", overflow="fold")
    for column in columns:
        out.add_column(escape(column.label), overflow="fold")
    for row in rows:
        host = escape(_clip(row.names, NAMES_CHARS)) + (f" ({len(row.hosts)} hosts)" if row.folded else "")
        if row.duplicate_name:
            host += " [bold]duplicate name[/bold]"
        cells = []
        for column in columns:
            value = row.cells.get(column.key)
            if value is VARIES:
                cells.append("(one per host)")
            elif value is None:
                cells.append("-")
            elif column.key in row.marked:
                cells.append(f"[bold]\u2260 {escape(_clip(value, CELL_CHARS))}[/bold]")
            else:
                cells.append(escape(_clip(value, CELL_CHARS)))
        out.add_row(host, *cells)
    reference = []
    for column in columns:
        if column.majority is not None:
            reference.append(escape(_clip(column.majority, CELL_CHARS)))
        elif column.odd is not None:
            other = " / ".join(v for v, _ in column.split if v != column.odd)
            reference.append(escape(_clip(other, CELL_CHARS)) + " (even split)")
        else:
            reference.append("(no majority)" if not column.identity else "")
    if any(c.key != "addresses" for c in columns):
        out.add_row("[italic]most hosts[/italic]", *reference)
    console.print(out)
    console.print("  \u2260 differs from most hosts (or is the odd side of an even split)")
    if alike:
        console.print(f"  {len(alike)} host(s) alike, not shown: {escape(compact_hosts(alike, NAMES_CHARS))}")
    if table.omitted:
        console.print(f"  {len(table.omitted)} host(s) beyond the table: {escape(table.omitted_names[:NAMES_CHARS])}")
    for row in rows:
        if row.per_rank:
            listed = "; ".join(per_rank_text(entry) for entry in row.per_rank)
            more = f"; and {row.per_rank_more} more" if row.per_rank_more else ""
            console.print(f"  {escape(row.names)}: ranks disagree: {escape(listed + more)}")


def _checkpoints_table(report: dict, console: Console) -> None:
    checkpoints = report.get("checkpoints")
    if not checkpoints:
        return
    newest = next((c for c in checkpoints if c.get("newest_resumable")), None)
    if newest is not None:
        step = f" (step {newest['step']})" if newest.get("step") is not None else ""
        title = f"({len(checkpoints)}): resume from {escape(newest['path'])}{step}"
    else:
        title = f"({len(checkpoints)}): none is complete and readable"
    console.print(f"\n[bold]Checkpoints[/bold] {title}")
    out = Table(show_lines=False)
    out.add_column("path", overflow="fold", ratio=2)
    out.add_column("format", overflow="fold")
    out.add_column("step", justify="right")
    out.add_column("readable", overflow="fold", ratio=3)
    out.add_column("complete", overflow="fold", ratio=2)
    out.add_column("resume", overflow="fold", max_width=12)
    for c in checkpoints[:CHECKPOINTS_SHOWN]:
        readable, complete, resume = checkpoint_parts(c, checked_with=False)
        resume = f"[bold]{escape(resume)}[/bold]" if c.get("newest_resumable") else escape(resume)
        out.add_row(escape(c["path"]), escape(c["format"]), "" if c.get("step") is None else str(c["step"]),
                    escape(_clip(readable, 200)), escape(_clip(complete, 200)), resume)
    if len(checkpoints) > CHECKPOINTS_SHOWN:
        out.caption = f"{len(checkpoints) - CHECKPOINTS_SHOWN} more; --format json lists every one"
    console.print(out)
