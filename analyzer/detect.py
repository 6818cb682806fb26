"""Stage 4, detect: evaluate the signature catalogue and the named cross-rank analyses.

Pattern rules compile to boolean expressions evaluated together in one `select`; each rule that
fires becomes one finding aggregating its evidence. Rules with `analysis = "..."` are produced by
the registered analysis of that name. Analyses read canonical events, not files: an exception in
one is the analyzer's fault and propagates (the command exits 3), it never becomes a quieter verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from analyzer.analyses import JobContext, load_all
from analyzer.bounds import MAX_WORLD_SIZE
from analyzer.findings import concat_findings, finding, findings_frame
from analyzer.parse.classify import KIND_SEVERITY, VOCAB_KIND_PREFIX
from analyzer.ranks import format_ranks
from analyzer.rules import Rule, catalogue

MAX_EVIDENCE_PER_FINDING = 50
_ROW = "_row"
_RANK_MENTION = r"\brank (\d+)\b"
# c10d names the rank it waited for with a capital (`Rank 3 timed out in monitoredBarrier`).
_ABSENT_MENTION = r"\b[Rr]anks? \d+\b"
# A host the line itself names as the one that failed (`host=<h> was not reachable via ssh`, `ssh: Could
# not resolve hostname <h>`, `connect to host <h> port 22`, NCCL's `Connection closed by remote peer
# <h><port>` in a raised error's `Last error:`, Ray's node `at node (ID: <hex>, IP: <ip>)` / `Memory on the
# node (IP: <ip>, ID: <hex>)`): the culprit when the line's writer is unknown.
_HOST_MENTION = r"\b(?:host=|hostname |to host |remote peer |node \((?:ID: [0-9a-f]+, )?IP: )([A-Za-z0-9][\w\-]*(?:\.[\w\-]+)*)"


@dataclass
class Detection:
    findings: pl.DataFrame
    problems: list[str] = field(default_factory=list)


def detect(events: pl.DataFrame, job: JobContext, rules: tuple[Rule, ...] | None = None) -> Detection:
    rules = rules if rules is not None else catalogue()
    pattern_rules = [r for r in rules if r.analysis is None]
    frames = [_pattern_findings(events, pattern_rules, job)]
    problems: list[str] = []
    analyses = load_all()
    known_ids = {r.id for r in rules}
    for name in sorted({r.analysis for r in rules if r.analysis}):
        analysis = analyses.get(name)
        if analysis is None:
            problems.append(f"analysis {name!r} named by the catalogue is not available")
            continue
        produced = analysis(events, job)
        frames.append(produced.filter(pl.col("rule_id").is_in(sorted(known_ids))))
    return Detection(_without_needless_fallbacks(concat_findings(frames), rules), problems)


def _without_needless_fallbacks(findings: pl.DataFrame, rules: tuple[Rule, ...]) -> pl.DataFrame:
    """A fallback signature ("errors nothing explains") only speaks when no failure signature did: a
    warning-level finding (a slow transport, a setting that differs) explains no error line.

    A cause that is not reported alone (`reported_alone = false`) is kept only beside one of the
    symptoms it names (`cause_of`).
    """
    fired = set(findings.get_column("rule_id").to_list())
    lonely = sorted(r.id for r in rules if not r.reported_alone and r.id in fired and not set(r.cause_of) & fired)
    findings = findings.filter(~pl.col("rule_id").is_in(lonely))
    fallback_ids = sorted(r.id for r in rules if r.fallback)
    failure_ids = sorted(r.id for r in rules if not r.fallback and r.severity not in ("warning", "info"))
    if findings.filter(pl.col("rule_id").is_in(failure_ids)).height:
        return findings.filter(~pl.col("rule_id").is_in(fallback_ids))
    return findings


def _pattern_findings(events: pl.DataFrame, rules: list[Rule], job: JobContext) -> pl.DataFrame:
    """Each rule is evaluated over the events of the kinds it declares only (a rule without kinds over
    the whole frame): the frame's rows are grouped by kind once, and the rules sharing one set of kinds
    are evaluated together in one `select` over that set's events (a large job's Flight Recorder
    entries, of no rule's kind, are never read)."""
    if not rules or events.height == 0:
        return findings_frame([])
    # The row numbers of each kind (a narrow partition: the wide columns are gathered per scope only).
    rows_of_kind = {key[0]: part.get_column(_ROW) for key, part in
                    events.select("kind").with_row_index(_ROW).partition_by("kind", as_dict=True).items()}
    found: dict[str, dict] = {}
    for kinds, scoped in _rules_by_scope(rules).items():
        scope = events if kinds is None else _events_of_kinds(events, rows_of_kind, kinds)
        if scope is None:  # no event of these kinds: none of these rules can fire
            continue
        scope = scope.filter(~_known_benign())
        flags = scope.select(*[rule.expression().alias(rule.id) for rule in scoped])
        for rule in scoped:
            hits = scope.filter(flags.get_column(rule.id))
            if hits.height:
                found[rule.id] = _aggregate(rule, _with_mentions(hits), job)
    return findings_frame(found[rule.id] for rule in rules if rule.id in found)


def _known_benign() -> pl.Expr:
    """A line the benign vocabulary knows keeps its own kind (a traceback's exception line) but its
    severity is lowered to info: such a line is no failure any signature may report."""
    own_severity = pl.col("kind").replace_strict(KIND_SEVERITY, default="info")
    return (pl.col("severity") == "info") & (own_severity != "info")


def _rules_by_scope(rules: list[Rule]) -> dict[tuple[str, ...] | None, list[Rule]]:
    """The rules grouped by the set of kinds they declare (None: no kinds, the whole frame)."""
    scopes: dict[tuple[str, ...] | None, list[Rule]] = {}
    for rule in rules:
        kinds = tuple(sorted(set(rule.match["kinds"]))) if "kinds" in rule.match else None
        scopes.setdefault(kinds, []).append(rule)
    return scopes


def _events_of_kinds(events: pl.DataFrame, rows_of_kind: dict[str | None, pl.Series],
                     kinds: tuple[str, ...]) -> pl.DataFrame | None:
    """The events of these kinds in frame order (their row numbers sorted): a rule's first line and
    first evidence are the same as over the whole frame."""
    parts = [rows_of_kind[kind] for kind in kinds if kind in rows_of_kind]
    if not parts:
        return None
    return events.select(pl.all().gather(pl.concat(parts).sort()))


def _with_mentions(hits: pl.DataFrame) -> pl.DataFrame:
    """The ranks and the host a hit line names, read on the hits only (never on the whole frame)."""
    # A vocabulary event's detail is the vocabulary's own gloss (`<row id>: <meaning>`), not the log's
    # text: a host or rank it names (`the address its hostname resolves to`) is nobody's. A newline
    # between message and detail: `No route to host` ending the message does not name the detail's
    # first word.
    detail = pl.when(pl.col("kind").str.starts_with(VOCAB_KIND_PREFIX)).then(None).otherwise(pl.col("detail"))
    mention = pl.concat_str([pl.col("message").fill_null(""), detail.fill_null("")], separator="\n")
    # A rank past int64 or past any real job (`rank 10^18`) is no rank: dropped, never a culprit.
    named = pl.element().str.extract(r"(\d+)").cast(pl.Int64, strict=False)
    return hits.select(
        "event_id",
        "rank",
        "host",
        "message",
        pl.coalesce(
            pl.col("ranks_ref"), mention.str.extract_all(_RANK_MENTION).list.eval(
                named.filter(named.is_between(0, MAX_WORLD_SIZE))
            )
        ).alias("ranks_named"),
        mention.str.extract(_HOST_MENTION, 1).alias("host_named"),
    )


def _aggregate(rule: Rule, hits: pl.DataFrame, job: JobContext) -> dict:
    ranks: list[int] = []
    hosts: list[str] = []
    if rule.attribution == "ranks":
        ranks = hits.get_column("rank").drop_nulls().unique().to_list()
        hosts = hits.get_column("host").drop_nulls().unique().to_list()
        if not ranks and not hosts:  # no line says who wrote it: the host a line names as the failing end
            hosts = hits.get_column("host_named").drop_nulls().unique().to_list()
    elif rule.attribution == "hosts":
        hosts = hits.get_column("host").drop_nulls().unique().to_list() or hits.get_column("host_named").drop_nulls().unique().to_list()
    elif rule.attribution in ("ranks_ref", "ranks_ref_local"):
        ranks = hits.get_column("ranks_named").explode().drop_nulls().unique().to_list()
        hosts = [job.rank_hosts[r] for r in ranks if r in job.rank_hosts]
        if rule.attribution == "ranks_ref_local":
            hosts = sorted(set(hosts) | set(hits.get_column("host").drop_nulls().to_list()))
    elif rule.attribution == "job_hosts":
        hosts = list(job.hosts)
    elif rule.attribution == "absent":
        ranks = _absent_ranks(hits, job)
        hosts = [job.rank_hosts[r] for r in ranks if r in job.rank_hosts]
    first_message = hits.get_column("message").drop_nulls().head(1).to_list()
    where = "" if rule.attribution == "absent" else _where(ranks, hosts)  # the culprits wrote none of the lines
    summary = f"{hits.height} matching line{'s' if hits.height != 1 else ''}{where}"
    if first_message:
        summary += f": {first_message[0][:300]}"
    return finding(
        rule.id,
        ranks=ranks,
        hosts=hosts,
        confidence=rule.confidence,
        summary=summary,
        evidence=hits.get_column("event_id").head(MAX_EVIDENCE_PER_FINDING).to_list(),
    )


def _absent_ranks(hits: pl.DataFrame, job: JobContext) -> list[int]:
    """`absent`: the lines are written by ranks left waiting for others. The culprits are the ranks a
    line names other than its writer (rank 0 reporting `Rank 3 timed out in monitoredBarrier`), else
    the job's ranks that wrote no such line (`waitForInput ... timed out` on every rank but the busy one)."""
    waiting = set(hits.get_column("rank").drop_nulls().to_list())
    mentions = hits.get_column("message").fill_null("").str.extract_all(_ABSENT_MENTION).explode().drop_nulls()
    named = set(mentions.str.extract(r"(\d+)").cast(pl.Int64, strict=False).drop_nulls().to_list()) - waiting
    if named:
        return sorted(named)
    absent = set(range(job.world_size or 0)) - waiting
    return sorted(absent) if waiting and absent else []


def _where(ranks: list[int], hosts: list[str]) -> str:
    parts = []
    if ranks:
        parts.append("rank" + ("s " if len(ranks) > 1 else " ") + format_ranks(ranks))
    if hosts:
        parts.append("host" + ("s " if len(hosts) > 1 else " ") + ", ".join(sorted(hosts)[:8]))
    return f" on {' / '.join(parts)}" if parts else ""
