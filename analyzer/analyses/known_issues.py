"""Known bugs of the stack (part of stage 4, detect): an affected version plus its symptom is the cause.

For every entry of the known-issue table (`analyzer.knownissues`) whose version ranges hold on a
host, the entry's symptom (its signatures' expressions and its patterns) is looked for among that
host's lines, and its `context` patterns, when it has any, must show there too. Where both hold the
entry is a finding, one per entry naming every host where it shows, reported under the
`known-issue-<category>` rule: it names the versions, the fixed-in release and the source, with the
symptom lines and the version lines as evidence. An
affected version whose symptom does not show is no finding: it is the report's info-level note in
`job.host_facts` (see `analyzer.knownissues.host_notes`), so a healthy run stays clean.

All symptom and context tests of the affected entries are evaluated in one `select` over the events
and joined to the affected (host, entry) pairs: no loop over hosts or lines.
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
    hits = affected(host_versions(events, job.host_facts))
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
    symptoms = _long(flags, "s:", wanted).group_by("host", "issue_id").agg(
        pl.col("event_id").sort().head(MAX_EVIDENCE).alias("symptom_ids"),
        pl.col("message").sort_by("event_id").drop_nulls().first().alias("first"),
    )
    contexts = _long(flags, "c:", wanted).select("host", "issue_id").unique()
    # An entry is a finding where both its symptom and its context show on a host it affects; one
    # finding per entry, naming every such host.
    per_issue = (
        hits.join(symptoms, on=["host", "issue_id"], how="inner")
        .join(contexts, on=["host", "issue_id"], how="semi")
        .sort("host")
        .group_by("issue_id", maintain_order=True)
        .agg(
            pl.col("host").filter(pl.col("host") != NO_HOST).alias("hosts"),
            pl.col("versions").unique(maintain_order=True).str.join(" | "),
            pl.col("symptom_ids").list.explode().unique().sort().head(MAX_EVIDENCE),
            pl.col("event_ids").list.explode().drop_nulls().unique().sort().head(2).alias("version_ids"),
            pl.col("first").first(),
        )
    )
    return findings_frame(_finding(issues[row["issue_id"]], row) for row in per_issue.iter_rows(named=True))


def _long(flags: pl.DataFrame, prefix: str, wanted: list[str]) -> pl.DataFrame:
    """(event_id, message, host, issue_id) for every event that sets one of the `prefix` flags."""
    return (
        flags.select("event_id", "message", "host", *[f"{prefix}{i}" for i in wanted])
        .unpivot(index=["event_id", "message", "host"], variable_name="issue_id", value_name="hit")
        .filter(pl.col("hit"))
        .with_columns(pl.col("issue_id").str.strip_prefix(prefix))
    )


def _finding(issue: KnownIssue, row: dict) -> dict:
    hosts = row["hosts"] or []
    where = f" on host{'s' if len(hosts) > 1 else ''} {', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}" if hosts else ""
    fixed = f"fixed in {issue.fixed_in}" if issue.fixed_in != "none" else "no fixed release: a matching pair is the fix"
    first = (row["first"] or "")[:240].rstrip(".")
    summary = (
        f"Known issue {issue.id}{where}: {issue.title} ({row['versions']}; {fixed}). "
        f"Its symptom shows{': ' + first if first else ''}. {issue.remediation} Source: {issue.sources[0]}"
    )
    return finding(
        issue.rule_id,
        hosts=hosts,
        confidence=issue.confidence,
        summary=summary,
        evidence=[*row["symptom_ids"], *row["version_ids"]],
    )
