"""Detect: each pattern rule reads the events of the kinds it declares only, in frame order (issue 19).

A rule naming two kinds whose hits lie in both kinds' rows cites its first line and evidence in the
order of the frame (not kind by kind); a rule naming no kind reads every event; a rule whose kinds
no event has never fires.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.detect import _pattern_findings
from analyzer.events import events_from_records
from analyzer.facts.correlate import JobContext
from analyzer.rules import Rule


def _rule(rule_id: str, match: dict) -> Rule:
    return Rule(id=rule_id, title=rule_id, category="other", severity="error", role="cause", priority=1,
                confidence=0.5, attribution="ranks", explanation="", remediation="", references=(),
                path=Path(f"{rule_id}.toml"), match=match)


# Events 10-15, interleaved kinds: the frame's order is not the order of its kinds.
EVENTS = events_from_records([
    {"rank": 0, "kind": "nccl.warn", "severity": "warning", "message": "before: nothing here"},
    {"rank": 1, "kind": "nccl.warn", "severity": "warning", "message": "boom first in the frame"},
    {"rank": 2, "kind": "c10d.error", "severity": "error", "message": "boom second"},
    {"rank": 3, "kind": "train.step", "severity": "info", "message": "boom of another kind"},
    {"rank": 1, "kind": "c10d.error", "severity": "error", "message": "boom third"},
    {"rank": 0, "kind": "nccl.warn", "severity": "warning", "message": "after: nothing here"},
]).with_row_index("event_id", offset=10)  # correlate numbers the events


def _findings(*rules: Rule) -> dict[str, dict]:
    found = _pattern_findings(EVENTS, list(rules), JobContext(world_size=4))
    return {row["rule_id"]: row for row in found.iter_rows(named=True)}


def test_a_rule_of_two_kinds_cites_its_lines_in_frame_order():
    found = _findings(_rule("two-kinds", {"kinds": ["nccl.warn", "c10d.error"], "message": ["boom"]}))["two-kinds"]
    assert found["summary"].startswith("3 matching lines on ranks 1-2: boom first in the frame")
    assert found["evidence"] == [11, 12, 14]
    assert found["ranks"] == [1, 2]


def test_a_rule_without_kinds_reads_every_event_and_kinds_keep_others_out():
    found = _findings(_rule("anywhere", {"anywhere": ["boom"]}), _rule("one-kind", {"kinds": ["train.step"], "message": ["boom"]}))
    assert found["anywhere"]["evidence"] == [11, 12, 13, 14]
    assert found["one-kind"]["evidence"] == [13]


def test_a_rule_whose_kinds_no_event_has_never_fires():
    assert _findings(_rule("absent-kind", {"kinds": ["nccl.topology"], "message": ["boom|nothing"]})) == {}
