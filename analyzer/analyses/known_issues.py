"""Known bugs of the stack (part of stage 4, detect): an affected version plus its symptom is the cause.

For every entry of the known-issue table (`analyzer.knownissues`) whose version ranges hold on a
host, the entry's symptom (its signatures' expressions and its patterns) is looked for among that
host's lines, and its `context` patterns, when it has any, must show there too. Where both hold the
finding is the entry, reported under the `known-issue-<category>` rule: it names the versions, the
fixed-in release and the source, with the symptom lines and the version lines as evidence. An
affected version whose symptom does not show is no finding: it is the report's info-level note in
`job.host_facts` (see `analyzer.knownissues.host_notes`), so a healthy run stays clean.

All symptom and context tests of the affected entries are evaluated in one `select` over the events.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.knownissues import NO_HOST, KnownIssue, affected, by_id, host_versions
from analyzer.rules import rules_by_id

MAX_EVIDENCE = 8


def _text() -> pl.Expr:
    return pl.concat_str([pl.col("message").fill_null(""), pl.col("detail").fill_null("")], separator="\n")


def _any(patterns: tuple[str, ...]) -> pl.Expr:
    return _text().str.contains("|".join(f"(?:{p})" for p in patterns))


def symptom_expr(issue: KnownIssue, rules: dict) -> pl.Expr:
    """The entry's symptom as one boolean expression over the event frame."""
    exprs = [rules[rule_id].expression() for rule_id in issue.symptom.signatures]
    if issue.symptom.patterns:
        exprs.append(_any(issue.symptom.patterns))
    return pl.any_horizontal(exprs).fill_null(False)


def context_expr(issue: KnownIssue) -> pl.Expr:
    return _any(issue.symptom.context).fill_null(False) if issue.symptom.context else pl.lit(True)


@register("known_issues")
def known_issues(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    hits = affected(host_versions(events))
    if hits.height == 0 or events.height == 0:
        return findings_frame([])
    issues = by_id()
    rules = rules_by_id()
    wanted = sorted(set(hits.get_column("issue_id").to_list()))
    flags = events.select(
        "event_id", "message", pl.col("host").fill_null(NO_HOST).alias("host"),
        *[symptom_expr(issues[i], rules).alias(f"s:{i}") for i in wanted],
        *[context_expr(issues[i]).alias(f"c:{i}") for i in wanted],
    )
    rows = []
    for hit in hits.iter_rows(named=True):  # one row per (host, affected entry): bounded by the table
        issue = issues[hit["issue_id"]]
        on_host = flags.filter(pl.col("host") == hit["host"])
        symptoms = on_host.filter(pl.col(f"s:{issue.id}"))
        if symptoms.height == 0 or on_host.filter(pl.col(f"c:{issue.id}")).height == 0:
            continue
        rows.append(_finding(issue, hit, symptoms))
    return findings_frame(rows)


def _finding(issue: KnownIssue, hit: dict, symptoms: pl.DataFrame) -> dict:
    first = [m[:240].rstrip(".") for m in symptoms.get_column("message").drop_nulls().head(1).to_list()]
    where = "" if hit["host"] == NO_HOST else f" on host {hit['host']}"
    fixed = f"fixed in {issue.fixed_in}" if issue.fixed_in != "none" else "no fixed release: a matching pair is the fix"
    summary = (
        f"Known issue {issue.id}{where}: {issue.title} ({hit['versions']}; {fixed}). "
        f"Its symptom shows{': ' + first[0] if first else ''}. {issue.remediation} Source: {issue.sources[0]}"
    )
    evidence = symptoms.get_column("event_id").head(MAX_EVIDENCE).to_list() + (hit["event_ids"] or [])[:2]
    return finding(
        issue.rule_id,
        hosts=[] if hit["host"] == NO_HOST else [hit["host"]],
        confidence=issue.confidence,
        summary=summary,
        evidence=evidence,
    )
