"""Each signature's own must-match / must-not-match lines, one test id per case (`-k rule-id`)."""

import re

import pytest

from analyzer.analyses import load_all
from analyzer.rules import catalogue, rules_by_id
from analyzer.ruletests import rule_cases, rule_fires_on

CASES = rule_cases()


@pytest.mark.parametrize(
    "rule,line,expected", CASES, ids=[f"{r.id}-{'match' if e else 'nomatch'}-{i}" for i, (r, _, e) in enumerate(CASES)]
)
def test_rule_case(rule, line, expected):
    assert rule_fires_on(rule, line) == expected


def test_catalogue_size_and_coverage():
    rules = catalogue()
    assert len(rules) >= 20
    categories = {r.category for r in rules}
    for required in ("shm_too_small", "nccl_init_failure", "rank_absent_from_collective", "collective_mismatch",
                     "ib_link_or_hca_error", "duplicate_gpu_or_cuda_visible_devices", "cuda_oom_on_some_ranks",
                     "ddp_unused_parameters", "disk_full_or_io", "checkpoint_corruption", "nccl_timeout"):
        assert required in categories


def test_every_pattern_rule_has_both_kinds_of_case():
    for rule in catalogue():
        if rule.analysis is None:
            assert rule.tests.get("must_not_match"), f"{rule.id} has no must_not_match case"
            assert rule.tests.get("must_match"), f"{rule.id} has no must_match case"


def test_every_analysis_named_by_a_rule_exists():
    analyses = load_all()
    for rule in catalogue():
        if rule.analysis:
            assert rule.analysis in analyses, rule.id


def test_rule_prose_has_no_stray_wrapping():
    """Wrapped lines are joined; only a numbered or bulleted step starts a line of its own."""
    for rule in catalogue():
        for paragraph in rule.remediation.split("\n\n"):
            for line in paragraph.split("\n")[1:]:
                assert re.match(r"(?:\d+[.)]|[-*]) ", line), (rule.id, line)


def test_numbered_steps_keep_their_lines():
    steps = rules_by_id()["hang-rank-absent-from-collective"].remediation.splitlines()
    assert [line[:3] for line in steps] == ["1. ", "2. ", "3. ", "4. ", "5. "]
