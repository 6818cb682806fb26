"""Each signature's own must-match / must-not-match lines, one test id per case (`-k rule-id`)."""

import pytest

from analyzer.analyses import load_all
from analyzer.rules import catalogue
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
    for rule in catalogue():
        assert "\n" not in rule.remediation.replace("\n\n", ""), rule.id
