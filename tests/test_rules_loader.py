"""The catalogue loader rejects malformed rule files with the file name in the message, and every
fixture a rule's `[tests].fixtures` names gives that rule's finding."""

from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.rules import RuleError, catalogue, load_rule

ROOT = Path(__file__).resolve().parents[1]

GOOD = '''
id = "x-rule"
title = "t"
category = "other"
severity = "error"
role = "cause"
priority = 1
confidence = 0.5
explanation = "e"
remediation = "r"
[match]
kinds = ["nccl.warn"]
'''


def write(tmp_path, text, name="x-rule.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_rule_loads(tmp_path):
    assert load_rule(write(tmp_path, GOOD)).id == "x-rule"


@pytest.mark.parametrize(
    "mutation,message",
    [
        (GOOD.replace('title = "t"', 'title = "t"\ncolour = "red"'), "unknown keys"),
        (GOOD.replace('category = "other"', 'category = "nope"'), "category"),
        (GOOD.replace('kinds = ["nccl.warn"]', 'kinds = ["nccl.warn"]\nmesage = ["x"]'), r"unknown \[match\] keys"),
        (GOOD.replace('kinds = ["nccl.warn"]', 'message = ["(unclosed"]'), "does not compile"),
        (GOOD.replace('id = "x-rule"', 'id = "other-id"'), "must equal the file name"),
        (GOOD.replace('title = "t"', 'title = "t"\nanalysis = "hang_heuristics"'), "exactly one of"),
        (GOOD + '[tests]\nknown_gaps = ["x"]\n', r"unknown \[tests\] keys \['known_gaps'\]"),
        ("id = [", "not valid TOML"),
    ],
)
def test_bad_rule_is_rejected(tmp_path, mutation, message):
    with pytest.raises(RuleError, match=message):
        load_rule(write(tmp_path, mutation))


RULE_FIXTURES = sorted((rule.id, job) for rule in catalogue() for job in rule.tests.get("fixtures", []))


def test_some_rule_names_a_fixture():
    assert RULE_FIXTURES  # the parametrised test below runs something


@pytest.mark.parametrize(("rule_id", "fixture"), RULE_FIXTURES)
def test_a_rules_fixture_gives_its_finding(rule_id, fixture):
    path = ROOT / fixture
    job = path / "job" if (path / "job").is_dir() else path
    assert job.is_dir(), f"{rule_id}: [tests].fixtures names {fixture}, which is not a job directory"
    assert rule_id in [f["rule_id"] for f in analyze(job).report["findings"]]
