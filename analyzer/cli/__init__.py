"""The `postmortem` command: a thin shell over `analyzer.api` and the catalogue.

Exit codes are a contract (`analyzer.exits`): 0 nothing found, 1 failure identified, 2 could not
analyse, 3 internal error. Every command runs under the same mapping: `CannotAnalyse` is exit 2
with its message; any other exception is the analyzer's own fault, reported as "internal error" on
standard error (the traceback with --debug) and exit 3, never as a verdict.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from analyzer import __version__
from analyzer.cli.consoles import report_console
from analyzer.outputs import check_writable
from analyzer.exits import (
    EXIT_CANNOT_ANALYSE,
    EXIT_FAILURE_FOUND,
    EXIT_INTERNAL_ERROR,
    EXIT_NOTHING_FOUND,
    CannotAnalyse,
)

# Piped or redirected text is read with grep and less, not a terminal: never hard-wrapped.
_DEBUG = "postmortem.debug"


class _CannotAnalyseExit(click.ClickException):
    """click's form of `CannotAnalyse`: exit 2, not click's default 1 (which means 'failure identified')."""

    exit_code = EXIT_CANNOT_ANALYSE


class _Postmortem(click.Group):
    """The command group, mapping what a command raises to the exit-status contract."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CannotAnalyse as exc:
            raise _CannotAnalyseExit(str(exc)) from exc
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # click's own outcomes; a closed pipe is click's to handle quietly
        except Exception as exc:  # noqa: BLE001 - whatever escaped the library's input boundaries is a bug
            _report_internal_error(exc, debug=ctx.meta.get(_DEBUG, False))
            raise click.exceptions.Exit(EXIT_INTERNAL_ERROR) from exc


def _report_internal_error(exc: Exception, *, debug: bool) -> None:
    if debug:
        click.echo("".join(traceback.format_exception(exc)), err=True, nl=False)
    click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
    if not debug:
        click.echo("This is a fault of postmortem, not a verdict on the job; --debug prints the traceback.", err=True)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_DEBUG] = True  # meta is shared by the whole command chain


_debug_option = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                             help="On an internal error, print the traceback.")


@click.group(cls=_Postmortem)
@click.version_option(__version__, prog_name="postmortem")
@_debug_option
def main() -> None:
    """Post-mortem analysis of crashed, hung and slow distributed training jobs."""


def _write(path: Path, text: str, what: str) -> None:
    try:
        path.write_text(text, encoding="utf-8", newline="\n")
    except OSError as exc:  # checked before the analysis, but a disk can fill up meanwhile
        raise CannotAnalyse(f"cannot write the {what} to {path}: {exc.strerror or exc}") from exc


@main.command()
@click.argument("job", type=click.Path(path_type=Path, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Terminal text or the versioned JSON report.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the report here instead of standard output.")
@click.option("--all-inputs", is_flag=True, help="List every input file in the text report.")
@click.option("--checkpoint", "checkpoints", multiple=True, type=click.Path(path_type=Path),
              help="A checkpoint file or directory to audit besides those found in JOB (repeatable).")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write a self-contained HTML report with a cross-rank timeline to this file.")
@_debug_option
def analyze(job: Path, fmt: str, output: Path | None, all_inputs: bool, checkpoints: tuple[Path, ...],
            html_path: Path | None) -> None:
    """Analyse the job directory (or log file, or archive; `-`: standard input) JOB and print the verdict.

    Exit status: 0 nothing found, 1 failure identified, 2 could not analyse (also: no training log
    among the inputs, an output path that cannot be written), 3 internal error (no report is printed).
    """
    from analyzer.api import analyze as run_analysis
    from analyzer.io import DiscoveryError

    if output is not None:
        check_writable(output, "report")
    if html_path is not None:
        check_writable(html_path, "HTML report")
    try:
        result = run_analysis(job, checkpoint_paths=tuple(str(c) for c in checkpoints))
    except DiscoveryError as exc:
        raise CannotAnalyse(str(exc)) from exc
    report = result.report
    # Everything is rendered before anything is written: an internal error in a renderer leaves no
    # verdict and no half JSON document behind.
    if fmt == "json":
        from analyzer.render.json_report import render_json

        text = render_json(result.model)
    else:
        from analyzer.render.text import render_text

        console = report_console(to_terminal=False if output is not None else None)
        with console.capture() as captured:
            render_text(report, console, all_inputs=all_inputs)
        text = captured.get()
    if html_path is not None:
        from analyzer.render.html import render_html

        _write(html_path, render_html(result), "HTML report")
    if output is not None:
        _write(output, text, "report")
    else:
        click.echo(text, nl=False, color=True)  # colour codes are there only when rich saw a terminal
    sys.exit(EXIT_NOTHING_FOUND if report["verdict"]["category"] == "none" else EXIT_FAILURE_FOUND)


@main.group()
def rules() -> None:
    """Inspect and test the failure-signature catalogue."""


@rules.command("list")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def rules_list(fmt: str) -> None:
    """List every signature: id, category, severity, title (JSON: also role, priority, what it reads)."""
    from analyzer.rules import catalogue

    if fmt == "json":
        click.echo(json.dumps([
            {"id": r.id, "category": r.category, "severity": r.severity, "title": r.title, "role": r.role,
             "priority": r.priority, "confidence": r.confidence, "analysis": r.analysis, "kinds": list(r.match.get("kinds", [])),
             "fallback": r.fallback, "cause_of": list(r.cause_of), "references": list(r.references)}
            for r in catalogue()
        ], indent=2))
        return
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
    from analyzer.ruletests import rule_cases, run_rule_cases

    failures = run_rule_cases()
    for failure in failures:
        click.echo(f"FAIL {failure}")
    click.echo(f"{len(rule_cases())} cases run, {len(failures)} failed{'' if failures else ': ok'}")
    sys.exit(1 if failures else 0)


@main.command()
@click.argument("job", type=click.Path(path_type=Path))
@click.option("--ranks", "ranks_spec", metavar="R[,R-R...]", help="Only these ranks, e.g. 0,3-5 (default: all, the diverging ones first when more than --max-ranks).")
@click.option("--pg", "pgs", multiple=True, metavar="NAME", help="Only this process group (repeatable).")
@click.option("--last", type=click.IntRange(min=1), default=20, show_default=True,
              help="Sequence numbers shown per group (from just before the first divergence, else the newest).")
@click.option("--max-ranks", type=click.IntRange(min=1), default=8, show_default=True, help="Rank columns shown per group.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def collectives(job: Path, ranks_spec: str | None, pgs: tuple[str, ...], last: int, max_ranks: int, fmt: str) -> None:
    """Each rank's collectives aligned by sequence number, per process group, first divergence marked.

    Reads Flight Recorder dumps and watchdog lines. Exit status: 0 the ranks agree, 1 they diverge,
    2 could not analyse (or no collective recorded).
    """
    from analyzer.analyses.collectives import collective_table, divergences
    from analyzer.api import analyze as run_analysis
    from analyzer.io import DiscoveryError
    from analyzer.render.collectives import collective_document, render_collectives_text

    try:
        ranks = _rank_spec(ranks_spec)
        events = run_analysis(job).events
    except (DiscoveryError, ValueError) as exc:
        raise CannotAnalyse(str(exc)) from exc
    table = collective_table(events, ranks=ranks, pgs=pgs)
    if not table.height:
        raise CannotAnalyse(f"{job}: no collective recorded (no Flight Recorder entry or watchdog timeout"
                            + (" for the ranks / groups asked" if ranks or pgs else "") + ")")
    found = divergences(table, events)
    document = collective_document(table, found, last=last, rank_limit=len(ranks) if ranks else max_ranks)
    click.echo(json.dumps(document, indent=2) if fmt == "json" else render_collectives_text(document), nl=fmt == "json")
    sys.exit(EXIT_FAILURE_FOUND if found.height else EXIT_NOTHING_FOUND)


def _rank_spec(spec: str | None) -> list[int]:
    """"0,3-5" -> [0, 3, 4, 5]."""
    if not spec:
        return []
    ranks: list[int] = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) - int(low) > 1_000_000):
            raise ValueError(f"--ranks: {part.strip()!r} is not a rank or a range like 3-5")
        ranks += range(int(low), int(high or low) + 1)
    return sorted(set(ranks))


from analyzer.cli.capture import capture as _capture  # noqa: E402 - stdlib + click + analyzer.capture only

main.add_command(_capture)

from analyzer.cli.scan import fleet_command, scan_command  # noqa: E402 - the batch commands, over analyzer.fleet

main.add_command(scan_command)
main.add_command(fleet_command)


# --- known-issues: what the known-issue table says about a stack, without logs ----------------------

_STACK_OPTIONS = (("nccl", "nccl"), ("torch", "pytorch"), ("driver", "cuda-driver"), ("cuda", "cuda-runtime"),
                  ("driver_cuda", "cuda-driver-api"), ("nccl_cuda", "nccl-cuda"), ("fabric_manager", "fabric-manager"),
                  ("aws_ofi_nccl", "aws-ofi-nccl"), ("deepspeed", "deepspeed"))


@main.command("known-issues")
@click.option("--nccl", help="NCCL version (2.18.1).")
@click.option("--torch", help="PyTorch version (2.3.0).")
@click.option("--driver", help="NVIDIA driver version (535.104.05).")
@click.option("--cuda", help="CUDA runtime version the framework uses (12.1).")
@click.option("--driver-cuda", help="CUDA version the driver supports (nvidia-smi's 'CUDA Version').")
@click.option("--nccl-cuda", help="CUDA version NCCL was built for (the +cudaX.Y of its banner).")
@click.option("--fabric-manager", help="nvidia-fabricmanager version.")
@click.option("--aws-ofi-nccl", help="aws-ofi-nccl plugin version.")
@click.option("--deepspeed", help="DeepSpeed version.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_debug_option
def known_issues_command(fmt: str, **versions: str | None) -> None:
    """List the known bugs and incompatibilities that apply to a stack (for planning an upgrade).

    Exit status: 0 none applies, 1 some entry applies, 2 no version given.
    """
    from analyzer.knownissues import affected, by_id, stack_versions

    stack = {component: versions[option] for option, component in _STACK_OPTIONS if versions.get(option)}
    if not stack:
        raise CannotAnalyse("give at least one version, e.g. --nccl 2.18.1 --torch 2.3.0")
    issues = by_id()
    hits = [issues[i] for i in affected(stack_versions(stack)).get_column("issue_id").to_list()]
    rows = [{"id": i.id, "component": i.component, "title": i.title, "affected": i.affected_text(), "fixed_in": i.fixed_in,
             "category": i.category, "remediation": i.remediation, "sources": list(i.sources)} for i in hits]
    if fmt == "json":
        click.echo(json.dumps({"stack": stack, "known_issues": rows}, indent=2))
    else:
        click.echo(f"{len(rows)} known issue(s) apply to " + ", ".join(f"{c} {v}" for c, v in stack.items()))
        for row in rows:
            click.echo(f"\n{row['id']}  (fixed in {row['fixed_in']}; {row['category']})\n  {row['title']}\n  affects: {row['affected']}"
                       f"\n  what to do: {row['remediation']}\n  source: {' '.join(row['sources'])}")
    sys.exit(EXIT_FAILURE_FOUND if rows else EXIT_NOTHING_FOUND)

