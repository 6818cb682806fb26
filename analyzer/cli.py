"""The `postmortem` command: a thin shell over `analyzer.api` and the catalogue.

Exit codes are a contract: 0 nothing found, 1 failure identified, 2 could not analyse.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from analyzer import __version__

EXIT_NOTHING_FOUND = 0
EXIT_FAILURE_FOUND = 1
EXIT_CANNOT_ANALYSE = 2


class CannotAnalyse(click.ClickException):
    """Could not analyse at all: exit 2, not click's default 1 (which means 'failure identified')."""

    exit_code = EXIT_CANNOT_ANALYSE


@click.group()
@click.version_option(__version__, prog_name="postmortem")
def main() -> None:
    """Post-mortem analysis of crashed, hung and slow distributed training jobs."""


@main.command()
@click.argument("job", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Terminal text or the versioned JSON report.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the report here instead of standard output.")
@click.option("--all-inputs", is_flag=True, help="List every input file in the text report.")
@click.option("--checkpoint", "checkpoints", multiple=True, type=click.Path(path_type=Path),
              help="A checkpoint file or directory to audit besides those found in JOB (repeatable).")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write a self-contained HTML report with a cross-rank timeline to this file.")
def analyze(job: Path, fmt: str, output: Path | None, all_inputs: bool, checkpoints: tuple[Path, ...],
            html_path: Path | None) -> None:
    """Analyse the job directory (or log file, or archive) JOB and print the verdict.

    Exit status: 0 nothing found, 1 failure identified, 2 could not analyse.
    """
    from analyzer.api import analyze as run_analysis
    from analyzer.discover import DiscoveryError

    try:
        result = run_analysis(job, checkpoint_paths=tuple(str(c) for c in checkpoints))
    except DiscoveryError as exc:
        raise CannotAnalyse(str(exc)) from exc
    report = result.report
    if html_path:
        from analyzer.render.html import write_html

        write_html(result, html_path)
    if fmt == "json":
        text = json.dumps(report, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
        if output:
            output.write_text(text, encoding="utf-8")
        else:
            click.echo(text, nl=False)
    else:
        from analyzer.render.text import render_text

        if output:
            with output.open("w", encoding="utf-8") as fh:
                render_text(report, Console(file=fh, width=160, no_color=True, emoji=False), all_inputs=all_inputs)
        else:
            render_text(report, Console(highlight=False, emoji=False), all_inputs=all_inputs)
    sys.exit(EXIT_NOTHING_FOUND if report["verdict"]["category"] == "none" else EXIT_FAILURE_FOUND)


@main.group()
def rules() -> None:
    """Inspect and test the failure-signature catalogue."""


@rules.command("list")
def rules_list() -> None:
    """List every signature: id, category, severity, title."""
    from analyzer.rules import catalogue

    for rule in catalogue():
        click.echo(f"{rule.id:48} {rule.category:38} {rule.severity:8} {rule.title}")


@rules.command("explain")
@click.argument("rule_id")
def rules_explain(rule_id: str) -> None:
    """Print one signature's documentation: what it matches, why, and what to do."""
    from analyzer.rules import rules_by_id

    rule = rules_by_id().get(rule_id)
    if rule is None:
        raise CannotAnalyse(f"no rule {rule_id!r}; `postmortem rules list` shows the ids")
    click.echo(f"{rule.id}: {rule.title}\ncategory: {rule.category}  severity: {rule.severity}  role: {rule.role}\n")
    click.echo(f"What it means\n{rule.explanation}\n\nWhat to do\n{rule.remediation}")
    if rule.references:
        click.echo("\nReferences\n" + "\n".join(rule.references))


@rules.command("test")
def rules_test() -> None:
    """Run every signature's own must-match / must-not-match lines; exit 1 on any failure."""
    from analyzer.ruletests import run_rule_cases

    failures = run_rule_cases()
    for failure in failures:
        click.echo(f"FAIL {failure}")
    click.echo(f"{'ok' if not failures else f'{len(failures)} failing case(s)'}")
    sys.exit(1 if failures else 0)


from analyzer.capture import capture as _capture  # noqa: E402 - stdlib + click only; defined beside its logic

main.add_command(_capture)

from analyzer.scan import fleet_command, scan_command  # noqa: E402 - the batch scan lives beside its engine

main.add_command(scan_command)
main.add_command(fleet_command)

if __name__ == "__main__":
    main()
