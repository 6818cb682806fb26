"""Stage 6, render (terminal): the verdict first, then findings cause before symptom, then inputs."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape as _escape_markup
from rich.table import Table

_CONTROL = {c: "\ufffd" for c in (*range(0, 9), *range(11, 32), 127)}


def escape(text: str) -> str:
    """Log text is data: rich markup is escaped and terminal control characters (ESC, OSC) removed."""
    return _escape_markup(str(text).translate(_CONTROL))


_CONFIDENCE_WORDS = ((0.85, "high"), (0.6, "medium"), (0.0, "low"))


def _confidence(value: float) -> str:
    word = next(w for threshold, w in _CONFIDENCE_WORDS if value >= threshold)
    return f"{value:.2f} ({word})"


def render_text(report: dict, console: Console, *, all_inputs: bool = False) -> None:
    verdict = report["verdict"]
    job = report["job"]
    console.print(f"[bold]postmortem[/bold] {escape(job['path'])}  outcome: [bold]{job['outcome']}[/bold]"
                  f"  world size: {job['world_size'] or '?'}  hosts: {len(job['hosts'])}")
    colour = "green" if verdict["category"] == "none" else "red"
    console.print(f"\n[bold {colour}]VERDICT: {escape(verdict['category'])}[/bold {colour}] - {escape(verdict['title'])}")
    console.print(escape(verdict["summary"]))
    if verdict["category"] != "none":
        console.print(f"confidence: {_confidence(verdict['confidence'])}  rule: {verdict['rule_id']}")
    for ev in verdict["evidence"]:
        console.print(f"  [cyan]{escape(ev['file'])}:{ev['line']}[/cyan]  {escape(ev['text'][:240])}")
    findings = report["findings"]
    if findings:
        console.print(f"\n[bold]What to do[/bold]\n{escape(findings[0]['remediation'])}")
    if len(findings) > 1:
        console.print("\n[bold]Other findings[/bold] (cause before symptom)")
        for f in findings[1:]:
            tag = " (symptom)" if f["caused_by"] else ""
            console.print(f"- [{f['severity']}] {escape(f['title'])}{tag} [{f['category']}, {f['confidence']:.2f}]")
            console.print(f"    {escape(f['summary'][:300])}")
            for ev in f["evidence"][:2]:
                console.print(f"    [cyan]{escape(ev['file'])}:{ev['line']}[/cyan]  {escape(ev['text'][:200])}")
    _inputs_table(report["inputs"], console, all_inputs)
    for problem in report.get("problems", []):
        console.print(f"[yellow]analyzer problem:[/yellow] {escape(problem)}")


def _inputs_table(inputs: list[dict], console: Console, all_inputs: bool) -> None:
    shown = inputs if all_inputs or len(inputs) <= 20 else [i for i in inputs if i["status"] != "parsed"][:20]
    table = Table(title=f"Inputs ({len(inputs)} files)", show_lines=False)
    for column in ("file", "format", "ranks", "lines", "unparsed", "status", "reason"):
        table.add_column(column)
    for item in shown:
        ranks = ",".join(str(r) for r in item["ranks"][:6]) + ("..." if len(item["ranks"]) > 6 else "")
        table.add_row(escape(item["file"]), item["format"], ranks, str(item["lines"]), str(item["unparsed_lines"]),
                      item["status"], escape(item["reason"]))
    if len(shown) < len(inputs):
        table.caption = f"{len(inputs) - len(shown)} parsed files not shown (--all-inputs lists them)"
    console.print(table)
