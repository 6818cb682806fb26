"""Stage 5, decide: order findings cause before symptom and pick the verdict.

Environment and hardware causes and the first failing rank outrank symptoms: the watchdog
timeouts on healthy ranks are symptoms of the rank that never arrived. The order is: role
(cause > context > symptom), then the rule's causal priority, then confidence, then the earliest
evidence. When the best finding is only a symptom, the verdict says the culprit is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.rules import Rule

_ROLE_ORDER = {"cause": 0, "context": 1, "symptom": 2}
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass
class Decision:
    ranked: pl.DataFrame  # findings with rule metadata, verdict first
    verdict_rule: Rule | None


def decide(findings: pl.DataFrame, rules: dict[str, Rule]) -> Decision:
    if findings.height == 0:
        return Decision(findings, None)
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
            pl.col("severity").replace_strict(_SEVERITY_ORDER, default=3).alias("_sev"),
            # A finding that names its culprit beats an equally ranked one that cannot.
            ((pl.col("ranks").list.len() > 0) | (pl.col("hosts").list.len() > 0)).alias("_named"),
        )
        .sort(
            ["_sev", "_role", "priority", "confidence", "_named", "first_event", "rule_id", "summary"],
            descending=[False, False, True, True, True, False, False, False],
            nulls_last=True,
            maintain_order=True,
        )
        .drop("_role", "_sev", "_named")
    )
    top = ranked.row(0, named=True)
    verdict = rules[top["rule_id"]]
    caused_by = pl.when((pl.col("rule_id") != verdict.id) & (pl.col("role") == "symptom")).then(pl.lit([verdict.id])).otherwise(pl.lit([], dtype=pl.List(pl.String)))
    ranked = ranked.with_columns(caused_by.alias("caused_by"))
    return Decision(ranked, verdict)
