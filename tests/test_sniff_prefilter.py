"""The io stage's cheap tests before a costly one (issue 19) decide as the costly one alone did."""

from __future__ import annotations

import json

import pytest

from analyzer.io import sniff
from analyzer.parse.literals import covers


def test_nccl_tests_literals_cover_its_pattern():
    literals = [lit.decode() for lit in sniff._NCCL_TESTS_LITERALS]
    assert covers(literals, sniff._NCCL_TESTS.pattern.decode())


@pytest.mark.parametrize("head", [b"[rank0]: Initializing torch.distributed", b"[INFO] step 3", b"{rank: 1}", b"[ (oops)",
                                  b"[Errno 2] No such file", b"[default0]:[rank0]: x"])
def test_a_bracketed_log_head_is_no_json(head):
    assert not sniff._may_be_json(head)
    with pytest.raises(ValueError):
        json.loads(head + b"]}")  # whatever follows, such a document never parses


@pytest.mark.parametrize("head", [b'{"entries": []}', b"[1, 2]", b"[true]", b"[false]", b"[null]", b'[{"a": 1}]', b"[\n  {", b"[]", b"{}",
                                  b"[-1]", b'["x"]', b"[[1]]"])
def test_a_json_head_may_be_json(head):
    assert sniff._may_be_json(head)
