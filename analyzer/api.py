"""The library entry point: run discover -> parse -> correlate -> detect -> decide on one job.

`analyze(path)` returns an `Analysis` holding the frames (events, ranked findings), the typed
report (`model`, analyzer/report.py, assembled here from the decided findings and the job facts)
and its JSON document (`report`, the versioned contract of `schema/report.schema.json`, which is
generated from the same model). Renderers read the document.

It raises `DiscoveryError` (exit 2) when there is nothing to analyse: no file, nothing readable, or
files of which none holds a line of any training-log format ("no evidence" is not "no failure").
Exceptions of the analyzer's own (anything outside `analyzer.exits.INPUT_ERRORS`) propagate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import polars as pl

from analyzer import __version__
from analyzer.analyses import JobContext
from analyzer.categories import outcome_of
from analyzer.facts import JobFacts, correlate, job_context
from analyzer.facts.checkpoint_audit import report_records
from analyzer.facts.hostfacts import host_fact_records
from analyzer.knownissues import notes_by_host
from analyzer.decide import decide
from analyzer.detect import detect
from analyzer.io import DiscoveryError, InputFile, discover_job
from analyzer.facts.gpus import culprit_gpus
from analyzer.parse import TEXT_FORMATS, parse_inputs
from analyzer.ranks import format_ranks
from analyzer.report import (SCHEMA_VERSION, Checkpoint, CulpritGpu, Evidence, Finding, HostFacts, InputRecord, Job,
                             Report, TimeSpan, Verdict, document, from_record)
from analyzer.rules import Rule, rules_by_id

__all__ = ["SCHEMA_VERSION", "Analysis", "NoTrainingLogs", "NothingToAnalyse", "analyze", "build_report"]
MAX_EVIDENCE_LINES = 8
# The event every text file yields for its last line, whatever the line holds: not evidence that
# the file is a training log.
_LAST_LINE_KIND = "log.last"
_READ = ("parsed", "partial")
NOT_READ_REASONS_SHOWN = 3


class NothingToAnalyse(DiscoveryError):
    """Every input was unreadable or skipped."""


class NoTrainingLogs(NothingToAnalyse):
    """Files were read, but none holds a line of any format this analyzer knows."""


@dataclass
class Analysis:
    events: pl.DataFrame
    findings: pl.DataFrame
    facts: JobFacts
    inputs: list[InputFile]
    model: Report  # the typed report (analyzer/report.py)
    report: dict = field(init=False)  # its JSON document: what `--format json` writes and renderers read

    def __post_init__(self) -> None:
        self.report = document(self.model)


def analyze(path: str | os.PathLike[str], checkpoint_paths: tuple[str, ...] = ()) -> Analysis:
    discovery = discover_job(path)
    inputs = discovery.inputs
    if not inputs:
        raise NothingToAnalyse(f"{path}: the directory holds no files")
    raw = parse_inputs(inputs)
    if not any(item.status in _READ for item in inputs):
        reasons = "; ".join(f"{i.path}: {i.reason}" for i in inputs[:5])
        raise NothingToAnalyse(f"{path}: nothing readable ({reasons})")
    events, facts = correlate(raw, inputs)
    _record_input_ranks(events, inputs)
    rules = rules_by_id()
    job = job_context(events, facts, discovery.listing, checkpoint_paths=tuple(map(str, checkpoint_paths)))
    detection = detect(events, job)
    decision = decide(detection.findings, rules)
    checkpoints = _checkpoint_records(job, detection.problems)
    if not (decision.ranked.height or checkpoints or _holds_training_lines(events, inputs)):
        source = sum(item.format == "source" for item in inputs)  # sniffed, then set aside as code
        read = sum(item.status in _READ for item in inputs) + source
        raise NoTrainingLogs(f"{path}: no training logs found: {read} file{'s' if read != 1 else ''} read, "
                             "none of a known format" + (f" ({source} source code or markup)" if source else ""))
    model = build_report(str(path), events, decision.ranked, decision.verdict_rule, facts, inputs, rules, detection.problems,
                         checkpoints, _host_fact_records(events, job))
    return Analysis(events, decision.ranked, facts, inputs, model)


def _holds_training_lines(events: pl.DataFrame, inputs: list[InputFile]) -> bool:
    """Some input is of a known format: a parsed dump, trace, manifest..., or a text line a parser
    recognised (a text file's last-line event alone recognises nothing)."""
    if any(item.status in _READ and item.format not in TEXT_FORMATS for item in inputs):
        return True
    return events.filter(pl.col("kind") != _LAST_LINE_KIND).height > 0


def _record_input_ranks(events: pl.DataFrame, inputs: list[InputFile]) -> None:
    """Correlate may attribute a file's lines to ranks that parsing alone could not see."""
    per_file = dict(
        events.filter(pl.col("rank").is_not_null())
        .group_by("file")
        .agg(pl.col("rank").unique().sort())
        .iter_rows()
    )
    for item in inputs:
        item.ranks = per_file.get(item.path, item.ranks)


def build_report(
    path: str,
    events: pl.DataFrame,
    ranked: pl.DataFrame,
    verdict_rule: Rule | None,
    facts: JobFacts,
    inputs: list[InputFile],
    rules: dict[str, Rule],
    problems: list[str],
    checkpoints: list[dict] | None = None,
    host_facts: list[dict] | None = None,
) -> Report:
    # Only the events the findings cite: a dict of every event is a million Python rows at 16k ranks.
    cited = ranked.get_column("evidence").explode().drop_nulls().unique()
    by_id = (
        events.filter(pl.col("event_id").is_in(cited.implode()))
        .select("event_id", "file", "line", "rank", "text")
        .rows_by_key("event_id", named=True, unique=True)
    )
    shown: set[tuple[str, int]] = set()  # each line is evidence once: under the best-ranked finding that cites it
    findings = [_finding(row, rules[row["rule_id"]], by_id, shown) for row in ranked.iter_rows(named=True)]
    verdict = _verdict(findings, verdict_rule, inputs)
    evidence = ranked.get_column("evidence")[0].to_list() if ranked.height else []
    gpus = culprit_gpus(events, verdict.culprit_ranks, verdict.culprit_hosts, evidence)
    job = Job(
        path=path,
        world_size=facts.world_size,
        world_size_source=facts.world_size_source,
        world_size_stated=facts.world_size_stated,
        time_span=from_record(TimeSpan, facts.time_span) if facts.time_span is not None else None,
        facts_conflicts=facts.conflicts,
        ranks=facts.ranks,
        hosts=facts.hosts,
        outcome=_outcome(verdict.category, events, inputs),
        host_facts=[from_record(HostFacts, r) for r in host_facts or []],
    )
    return Report(
        schema_version=SCHEMA_VERSION,
        analyzer_version=__version__,
        job=job,
        verdict=replace(verdict, culprit_gpus=[from_record(CulpritGpu, g) for g in gpus]),
        findings=findings,
        inputs=[_input_record(i) for i in inputs],
        problems=problems,
        checkpoints=None if checkpoints is None else [from_record(Checkpoint, c) for c in checkpoints],
    )


def _checkpoint_records(job: JobContext, problems: list[str]) -> list[dict] | None:
    """The checkpoint table for the report: the facts stage's audit, which the analysis read too."""
    if job.checkpoint_problem:
        problems.append(job.checkpoint_problem)
    return None if job.checkpoints is None else report_records(job.checkpoints)


def _host_fact_records(events: pl.DataFrame, job: JobContext) -> list[dict]:
    """Per-host facts table (versions, plugin, env, GPUs) with the cells that differ named."""
    return host_fact_records(job.host_facts, notes_by_host(events, job.host_facts))


def _finding(row: dict, rule: Rule, by_id: dict, shown: set[tuple[str, int]]) -> Finding:
    """The finding as the report shows it; evidence lines already shown under a better-ranked
    finding (ranked: verdict first, cause before symptom) are not repeated."""
    evidence = [Evidence(file=e["file"], line=e["line"], rank=e["rank"], text=e["text"] or "")
                for e in _fresh_lines(row["evidence"], by_id, shown)]
    return Finding(
        rule_id=rule.id,
        category=rule.category,
        severity=rule.severity,
        title=rule.title,
        summary=row["summary"],
        ranks=row["ranks"],
        hosts=row["hosts"],
        confidence=row["confidence"],
        caused_by=row.get("caused_by") or [],
        evidence=evidence,
        remediation=rule.remediation,
    )


def _fresh_lines(event_ids: list[int], by_id: dict, shown: set[tuple[str, int]]) -> list[dict]:
    """The events of lines not yet shown, at most MAX_EVIDENCE_LINES. A line is keyed by its file and
    number, not its event: one line can be two events (an NCCL WARN and the vocabulary row it
    matches), and it is still one line of evidence."""
    fresh: list[dict] = []
    for event in filter(None, map(by_id.get, event_ids)):
        key = (event["file"], event["line"])
        if key not in shown and len(fresh) < MAX_EVIDENCE_LINES:
            shown.add(key)
            fresh.append(event)
    return fresh


def _verdict(findings: list[Finding], rule: Rule | None, inputs: list[InputFile]) -> Verdict:
    """The verdict without its GPUs (build_report adds them: they are looked up from its culprits)."""
    if rule is None or not findings:
        return Verdict(category="none", title="No failure found",
                       summary="No failure signature matched any input." + _not_read(inputs), culprit_ranks=[],
                       culprit_hosts=[], confidence=1.0, rule_id=None, evidence=[], culprit_gpus=[])
    top = findings[0]
    if rule.role == "symptom":
        # Only symptoms were found: the ranks that report them are usually the healthy ones.
        return Verdict(category=rule.category, title=rule.title,
                       summary=top.summary + ". Only symptoms were found; the ranks reporting them are not named as culprits.",
                       culprit_ranks=[], culprit_hosts=[], confidence=top.confidence, rule_id=rule.id,
                       evidence=top.evidence, culprit_gpus=[])
    culprits = ""
    if top.ranks:
        culprits += f" Culprit rank(s): {format_ranks(top.ranks)}."
    if top.hosts:
        culprits += f" Host(s): {', '.join(top.hosts[:8])}."
    if not top.ranks and not top.hosts and rule.role != "context":
        culprits += " The evidence does not name a culprit rank or host."
    return Verdict(category=rule.category, title=rule.title, summary=top.summary + "." + culprits,
                   culprit_ranks=top.ranks, culprit_hosts=top.hosts, confidence=top.confidence, rule_id=rule.id,
                   evidence=top.evidence, culprit_gpus=[])


def _unseen(item: InputFile) -> bool:
    """An input whose content may hold evidence that was not read: a cap cut it, or it could not be
    read. (A file skipped for what it is, binary, empty, a checkpoint, is not evidence left unread.)"""
    return item.capped or item.status == "error"


def _not_read(inputs: list[InputFile]) -> str:
    """For a clean verdict: the inputs it did not see in full (caps reached, unreadable), by reason."""
    unread = [i for i in inputs if _unseen(i)]
    if not unread:
        return ""
    by_reason: dict[str, int] = {}
    for item in unread:
        key = f"{item.status}: {item.reason or 'no reason given'}"
        by_reason[key] = by_reason.get(key, 0) + 1
    shown = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:NOT_READ_REASONS_SHOWN]
    listed = "; ".join(f"{n} {reason}" for reason, n in shown)
    more = f"; {len(by_reason) - len(shown)} other reason(s), see the inputs table" if len(by_reason) > len(shown) else ""
    return (f" Not read in full: {len(unread)} of {len(inputs)} inputs ({listed}{more}); a failure recorded only"
            " there would not be seen.")


def _outcome(category: str, events: pl.DataFrame, inputs: list[InputFile]) -> str:
    if category == "none":
        # "ok" claims the run was healthy: not when a cap or a read error left evidence unread.
        return "ok" if events.height and not any(_unseen(i) for i in inputs) else "unknown"
    return outcome_of(category)  # crash, hang or slow (schema/categories.toml)


def _input_record(item: InputFile) -> InputRecord:
    return InputRecord(file=item.path, format=item.format, ranks=item.ranks, lines=item.lines,
                       unparsed_lines=item.unparsed_lines, status=item.status, reason=item.reason, capped=item.capped)
