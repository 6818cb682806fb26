"""The signature catalogue: load, validate and compile the rule files in `rules/`.

A rule is data (one TOML file each): metadata, either a `[match]` table compiled to one polars
boolean expression over canonical event columns, or `analysis = "name"` naming a cross-rank
analysis that emits it, and its own must-match / must-not-match test lines. Unknown keys are
errors, so a typo never silently disables a rule.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import polars as pl

from analyzer.categories import CATEGORIES
from analyzer.resources import data_dir
from analyzer.severities import LINE_LEVELS, SEVERITIES

ROLES = frozenset({"cause", "symptom", "context"})
# ranks: who wrote the lines; hosts: the writers' hosts; ranks_ref: the ranks a line names (their hosts when
# known); ranks_ref_local: the same, and those ranks are on the writer's host (two ranks on one GPU);
# job_hosts: every host; absent: the ranks that wrote none of the lines; none: nobody.
ATTRIBUTIONS = frozenset({"ranks", "hosts", "ranks_ref", "ranks_ref_local", "job_hosts", "absent", "none"})
TOP_KEYS = frozenset(
    {"id", "title", "category", "severity", "role", "priority", "confidence", "attribution", "explanation",
     "remediation", "references", "match", "analysis", "tests", "fallback", "cause_of", "reported_alone"}
)
MATCH_KEYS = frozenset({"kinds", "anywhere", "message", "message_all", "message_not", "detail", "detail_not", "code", "severity"})
# `fixtures`: job directories (repository-relative) whose report must hold this rule's finding
# (tests/test_rules_loader.py analyses each).
TEST_KEYS = frozenset({"must_match", "must_not_match", "fixtures"})


class RuleError(ValueError):
    """A catalogue file is malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    category: str
    severity: str
    role: str
    priority: int
    confidence: float
    attribution: str
    explanation: str
    remediation: str
    references: tuple[str, ...]
    path: Path
    match: dict = field(default_factory=dict)
    analysis: str | None = None
    fallback: bool = False  # reported only when no other signature fired
    # The symptoms this cause explains: beside one of them it takes the symptom's place in the ranking.
    cause_of: tuple[str, ...] = ()
    reported_alone: bool = True  # false: reported only beside one of its `cause_of` symptoms
    tests: dict = field(default_factory=dict)

    def expression(self) -> pl.Expr:
        """This rule's match as one boolean polars expression over the event frame."""
        conditions: list[pl.Expr] = []
        spec = self.match
        if "kinds" in spec:
            conditions.append(pl.col("kind").is_in(spec["kinds"]))
        if "severity" in spec:
            conditions.append(pl.col("severity").is_in(spec["severity"]))
        for key, column in (("message", "message"), ("detail", "detail"), ("code", "code")):
            if key in spec:
                conditions.append(pl.col(column).fill_null("").str.contains(_any(spec[key])))
        if "anywhere" in spec:
            both = pl.concat_str([pl.col("message").fill_null(""), pl.col("detail").fill_null("")], separator="\n")
            conditions.append(both.str.contains(_any(spec["anywhere"])))
        for pattern in spec.get("message_all", []):
            conditions.append(pl.col("message").fill_null("").str.contains(pattern))
        for key, column in (("message_not", "message"), ("detail_not", "detail")):
            if key in spec:
                conditions.append(~pl.col(column).fill_null("").str.contains(_any(spec[key])))
        expr = pl.lit(True)
        for condition in conditions:
            expr = expr & condition
        return expr.fill_null(False)


def _any(patterns: list[str]) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


def load_rule(path: Path) -> Rule:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path.name}: not valid TOML: {exc}") from exc
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise RuleError(f"{path.name}: unknown keys {sorted(unknown)}")
    for key in ("id", "title", "category", "severity", "role", "priority", "confidence", "explanation", "remediation"):
        if key not in doc:
            raise RuleError(f"{path.name}: missing required key {key!r}")
    if doc["id"] != path.stem:
        raise RuleError(f"{path.name}: id {doc['id']!r} must equal the file name")
    _check_member(path, "category", doc["category"], CATEGORIES)
    _check_member(path, "severity", doc["severity"], SEVERITIES)
    _check_member(path, "role", doc["role"], ROLES)
    _check_member(path, "attribution", doc.get("attribution", "ranks"), ATTRIBUTIONS)
    has_match, has_analysis = "match" in doc, "analysis" in doc
    if has_match == has_analysis:
        raise RuleError(f"{path.name}: needs exactly one of [match] or analysis")
    if has_match:
        unknown = set(doc["match"]) - MATCH_KEYS
        if unknown:
            raise RuleError(f"{path.name}: unknown [match] keys {sorted(unknown)}")
        _check_kinds(path, doc["match"])
        _check_patterns(path, doc["match"])
    tests = doc.get("tests", {})
    unknown = set(tests) - TEST_KEYS
    if unknown:
        raise RuleError(f"{path.name}: unknown [tests] keys {sorted(unknown)}")
    if not 0.0 < float(doc["confidence"]) <= 1.0:
        raise RuleError(f"{path.name}: confidence must be in (0, 1]")
    return Rule(
        id=doc["id"],
        title=doc["title"],
        category=doc["category"],
        severity=doc["severity"],
        role=doc["role"],
        priority=int(doc["priority"]),
        confidence=float(doc["confidence"]),
        attribution=doc.get("attribution", "ranks"),
        explanation=_paragraphs(doc["explanation"]),
        remediation=_paragraphs(doc["remediation"]),
        references=tuple(doc.get("references", ())),
        path=path,
        match=doc.get("match", {}),
        analysis=doc.get("analysis"),
        tests=tests,
        fallback=bool(doc.get("fallback", False)),
        cause_of=tuple(doc.get("cause_of", ())),
        reported_alone=bool(doc.get("reported_alone", True)),
    )


_LIST_ITEM = re.compile(r"\n\s*(?=(?:\d+[.)]|[-*])\s)")


def _paragraphs(text: str) -> str:
    """Rule prose is wrapped in the TOML file; rewrap it so terminals and HTML can flow it. A numbered
    or bulleted step keeps its own line."""
    return "\n\n".join("\n".join(" ".join(item.split()) for item in _LIST_ITEM.split(block))
                       for block in text.strip().split("\n\n"))


def _check_member(path: Path, key: str, value: str, allowed: Collection[str]) -> None:
    if value not in allowed:
        raise RuleError(f"{path.name}: {key} {value!r} is not one of {sorted(allowed)}")


def _check_kinds(path: Path, match: dict) -> None:
    """A misspelt kind or severity would silently never match: both are load errors."""
    from analyzer.parse.line_kinds import known_kinds  # the parse stage's registry, read at load

    for kind in match.get("kinds", []):
        vocab_category = kind.removeprefix("vocab.") if kind.startswith("vocab.") else None
        if kind not in known_kinds() and vocab_category not in CATEGORIES:
            raise RuleError(f"{path.name}: [match].kinds {kind!r} is not a known event kind (grammars/line_kinds.toml or vocab.<category>)")
    for severity in match.get("severity", []):
        if severity not in LINE_LEVELS:
            raise RuleError(f"{path.name}: [match].severity {severity!r} is not one of {sorted(LINE_LEVELS)}")


def _check_patterns(path: Path, match: dict) -> None:
    probe = pl.Series([""], dtype=pl.String)
    for key, value in match.items():
        if key in ("kinds", "severity"):
            continue
        for pattern in value:
            try:
                probe.str.contains(pattern)
            except Exception as exc:  # noqa: BLE001 - polars raises ComputeError for bad regexes
                raise RuleError(f"{path.name}: [match].{key} pattern {pattern!r} does not compile: {exc}") from exc


@cache
def catalogue(directory: str | None = None) -> tuple[Rule, ...]:
    root = Path(directory) if directory else data_dir("rules")
    rules = tuple(load_rule(p) for p in sorted(root.glob("*.toml")))
    ids = [r.id for r in rules]
    if len(ids) != len(set(ids)):
        raise RuleError("duplicate rule ids in the catalogue")
    for rule in rules:
        unknown = sorted(set(rule.cause_of) - set(ids))
        if unknown:
            raise RuleError(f"{rule.path.name}: cause_of names unknown rules {unknown}")
        if not rule.reported_alone and not rule.cause_of:
            raise RuleError(f"{rule.path.name}: reported_alone = false needs the symptoms in cause_of")
    return rules


def rules_by_id() -> dict[str, Rule]:
    return {rule.id: rule for rule in catalogue()}
