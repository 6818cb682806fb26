"""Stage 5, decide: order findings cause before symptom and pick the verdict.

Environment and hardware causes and the first failing rank outrank symptoms: the watchdog
timeouts on healthy ranks are symptoms of the rank that never arrived. The order is: role
(cause > context > symptom), then the rule's causal priority, then confidence, then the earliest
evidence. When the best finding is only a symptom, the verdict says the culprit is unknown.

Cause over symptom from the same log: a rule with `cause_of = [ids]` (the interface setting beside
`no socket interface found`, a full disk beside an unreadable checkpoint) takes the place of the
best of those findings present in the ranking, just above it, whatever its own severity or
priority, and the findings it explains name it in `caused_by`. (With `reported_alone = false`,
detect keeps it only beside one of them.)

Culprits from a comparison over a line's writer: a pattern finding naming the writers of its lines
gives its place to a cross-rank analysis of the same category that read all of those lines and names
a culprit (the fingerprint mismatch's odd rank, not the rank that reported it).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.rules import Rule
from analyzer.severities import SEVERITY_RANK

_ROLE_ORDER = {"cause": 0, "context": 1, "symptom": 2}


@dataclass
class Decision:
    ranked: pl.DataFrame  # findings with rule metadata, verdict first
    verdict_rule: Rule | None


def decide(findings: pl.DataFrame, rules: dict[str, Rule]) -> Decision:
    if findings.height == 0:
        return Decision(findings, None)
    explained_by = _explained_by(findings, rules)
    compared = _compared_by(findings, rules)
    meta = pl.DataFrame(
        {
            "rule_id": list(rules),
            "category": [r.category for r in rules.values()],
            "severity": [r.severity for r in rules.values()],
            "role": [r.role for r in rules.values()],
            "priority": [r.priority for r in rules.values()],
        }
    )
    ranked = (
        findings.join(meta, on="rule_id", how="left")
        .with_columns(
            pl.col("role").replace_strict(_ROLE_ORDER, default=3).alias("_role"),
            pl.col("severity").replace_strict(SEVERITY_RANK, default=len(SEVERITY_RANK)).alias("_sev"),
            pl.col("priority").alias("_prio"),
            # A finding that names its culprit beats an equally ranked one that cannot.
            ((pl.col("ranks").list.len() > 0) | (pl.col("hosts").list.len() > 0)).alias("_named"),
        )
    )
    ranked = (
        _promote_causes(ranked, _merged(explained_by, compared))
        .sort(
            ["_sev", "_role", "_prio", "confidence", "_named", "first_event", "rule_id", "summary"],
            descending=[False, False, True, True, True, False, False, False],
            nulls_last=True,
            maintain_order=True,
        )
        .drop("_role", "_sev", "_prio", "_named")
    )
    top = ranked.row(0, named=True)
    verdict = rules[top["rule_id"]]
    caused_by = (
        pl.when(pl.col("rule_id").is_in(sorted(explained_by)))
        .then(pl.col("rule_id").replace_strict({k: sorted(v) for k, v in explained_by.items()}, default=None, return_dtype=pl.List(pl.String)))
        .when((pl.col("rule_id") != verdict.id) & (pl.col("role") == "symptom"))
        .then(pl.lit([verdict.id]))
        # A finding whose every evidence line is the verdict's evidence too is explained by it (the
        # known bug of a version and the error line it produces; analyzer/analyses/known_issues.py).
        .when((pl.col("rule_id") != verdict.id) & (pl.col("evidence").list.len() > 0)
              & (pl.col("evidence").list.set_difference(pl.lit(top["evidence"], dtype=pl.List(pl.Int64))).list.len() == 0))
        .then(pl.lit([verdict.id]))
        .otherwise(pl.lit([], dtype=pl.List(pl.String)))
    )
    ranked = ranked.with_columns(caused_by.alias("caused_by"))
    return Decision(ranked, verdict)


def _promote_causes(ranked: pl.DataFrame, explained_by: dict[str, set[str]]) -> pl.DataFrame:
    """A cause takes the place of the best symptom it explains, just above it (one finding per rule: few rows)."""
    if not explained_by:
        return ranked
    keys = {r["rule_id"]: (r["_sev"], r["_role"], r["_prio"]) for r in ranked.select("rule_id", "_sev", "_role", "_prio").iter_rows(named=True)}
    promoted: dict[str, tuple[int, int, int]] = {}
    for symptom, causes in explained_by.items():
        sev, role, priority = keys[symptom]
        for cause in causes:
            own = promoted.get(cause, keys[cause])
            promoted[cause] = min(own, (sev, min(role, own[1]), priority + 1), key=lambda k: (k[0], k[1], -k[2]))
    table = pl.DataFrame(
        {"rule_id": list(promoted), "_p_sev": [k[0] for k in promoted.values()], "_p_role": [k[1] for k in promoted.values()],
         "_p_priority": [k[2] for k in promoted.values()]},
        schema={"rule_id": pl.String, "_p_sev": pl.Int64, "_p_role": pl.Int64, "_p_priority": pl.Int64},
    )
    return (
        ranked.join(table, on="rule_id", how="left")
        .with_columns(
            pl.coalesce("_p_sev", "_sev").alias("_sev"),
            pl.coalesce("_p_role", "_role").alias("_role"),
            pl.coalesce("_p_priority", "_prio").alias("_prio"),
        )
        .drop("_p_sev", "_p_role", "_p_priority")
    )


def _merged(a: dict[str, set[str]], b: dict[str, set[str]]) -> dict[str, set[str]]:
    return {k: a.get(k, set()) | b.get(k, set()) for k in a.keys() | b.keys()}


def _compared_by(findings: pl.DataFrame, rules: dict[str, Rule]) -> dict[str, set[str]]:
    """Each pattern finding that names its lines' writers, mapped to the cross-rank analyses of its
    category that read all of its lines and name culprits: the rank that wrote `Detected mismatch
    between collectives` only noticed the mismatch, the analysis that compared the ranks'
    fingerprints says which one left the common path. Such an analysis takes the pattern finding's
    place in the ranking, just above it (one finding per rule: few rows)."""
    rows = findings.select("rule_id", "ranks", "hosts", "evidence").to_dicts()
    compared: dict[str, set[str]] = {}
    for line in rows:
        rule = rules.get(line["rule_id"])
        if rule is None or rule.analysis is not None or rule.attribution != "ranks" or not line["evidence"]:
            continue
        for other in rows:
            analysis = rules.get(other["rule_id"])
            if (analysis is not None and analysis.analysis is not None and analysis.category == rule.category
                    and (other["ranks"] or other["hosts"]) and set(line["evidence"]) <= set(other["evidence"])):
                compared.setdefault(line["rule_id"], set()).add(other["rule_id"])
    return compared


def _explained_by(findings: pl.DataFrame, rules: dict[str, Rule]) -> dict[str, set[str]]:
    """Each symptom present, mapped to the present causes that explain it (`cause_of`)."""
    fired = set(findings.get_column("rule_id").to_list())
    explained_by: dict[str, set[str]] = {}
    for rule_id in fired:
        for symptom in rules[rule_id].cause_of if rule_id in rules else ():
            if symptom in fired:
                explained_by.setdefault(symptom, set()).add(rule_id)
    return explained_by
