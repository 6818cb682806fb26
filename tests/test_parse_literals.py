"""parse.literals: the cached derivation of the prefilter literals of many patterns."""

from __future__ import annotations

import re

import pytest

from analyzer.parse import literals
from analyzer.parse.literals import required_literals, required_literals_of

PATTERNS = [r"NCCL WARN Call to ibv_\w+ failed", r"(?:Xid|XID) \d+", r"Cannot allocate memory|ENOMEM", r"\d+"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTMORTEM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cached_derivation_is_the_derivation_and_is_read_back(cache_dir, monkeypatch):
    first = required_literals_of(PATTERNS)
    assert first == {p: required_literals(p) for p in PATTERNS}
    assert len(list(cache_dir.glob("literals-*.json"))) == 1
    monkeypatch.setattr(literals, "required_literals", lambda p: pytest.fail("derived again despite the cache"))
    assert required_literals_of(reversed(PATTERNS)) == first


def test_other_patterns_are_another_cache_file(cache_dir):
    required_literals_of(PATTERNS)
    required_literals_of(PATTERNS[:2])
    assert len(list(cache_dir.glob("literals-*.json"))) == 2


@pytest.mark.parametrize("damage", ["", "{not json", "[1, 2]", '{"x": 5}', '{"x": [1]}'])
def test_a_damaged_cache_is_derived_again_and_rewritten(cache_dir, damage):
    expected = required_literals_of(PATTERNS)
    (path,) = cache_dir.glob("literals-*.json")
    path.write_text(damage)
    assert required_literals_of(PATTERNS) == expected
    assert required_literals_of(PATTERNS) == expected and path.read_text() != damage


def test_a_cache_that_cannot_be_written_costs_only_time(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file where the cache folder would go")
    monkeypatch.setenv("POSTMORTEM_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert required_literals_of(PATTERNS) == {p: required_literals(p) for p in PATTERNS}


def test_a_pattern_that_does_not_compile_raises(cache_dir):
    with pytest.raises(re.error):
        required_literals_of(["ok", "(unclosed"])
