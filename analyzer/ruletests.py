"""Run each signature's own inline cases through the real parse + detect stages.

A `must_match` line is written mid-file (an ordinary line before and after it), parsed exactly as a
job file would be, and the rule must fire on it; a `must_not_match` line must not make it fire. Used by `postmortem rules
test` and by the parametrised pytest in tests/test_rules.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from analyzer.facts.correlate import correlate
from analyzer.io import discover
from analyzer.parse import parse_inputs
from analyzer.rules import Rule, catalogue


# Each case is tested mid-file: a line kind whose prefilter misses the line would pass a one-line test
# (a file's last line is always kept) and never fire inside a real log.
BEFORE = "the job prints its first ordinary line"
AFTER = "the job prints another ordinary line after it"


def rule_fires_on(rule: Rule, text: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="postmortem-rule-") as tmp:
        Path(tmp, "case.log").write_text(f"{BEFORE}\n{text}\n{AFTER}\n", encoding="utf-8")
        inputs = discover(tmp)
        events, _ = correlate(parse_inputs(inputs), inputs)
    if events.height == 0:
        return False
    return bool(events.select(rule.expression().any()).item())


def rule_cases() -> list[tuple[Rule, str, bool]]:
    cases = []
    for rule in catalogue():
        for line in rule.tests.get("must_match", []):
            cases.append((rule, line, True))
        for line in rule.tests.get("must_not_match", []):
            cases.append((rule, line, False))
    return cases


def run_rule_cases() -> list[str]:
    failures = []
    for rule, line, expected in rule_cases():
        if rule_fires_on(rule, line) != expected:
            verb = "did not fire on" if expected else "fired on"
            failures.append(f"{rule.id} {verb}: {line[:160]}")
    return failures

