"""The catalogue loader rejects malformed rule files with the file name in the message."""

import pytest

from analyzer.rules import RuleError, load_rule

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
        ("id = [", "not valid TOML"),
    ],
)
def test_bad_rule_is_rejected(tmp_path, mutation, message):
    with pytest.raises(RuleError, match=message):
        load_rule(write(tmp_path, mutation))
