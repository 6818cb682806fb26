"""The text prefilter (analyzer/parse/logtext.py): which raw lines become candidates.

The literal alternations find exactly the lines holding one of the literals, however many there
are; kinds whose literals are common in healthy logs are screened by a piece of their pattern, so
the step lines of a training log are no candidates while the lines those kinds read still are.
"""

import polars as pl
import pytest

from analyzer.parse import logtext
from analyzer.parse.classify import LINE_KINDS
from analyzer.parse.logtext import PREFILTER_PATTERNS, alternations, holds_any, minimal_literals

LINES = ["a NET/IB : Using", "xx Error: yy", "nothing here", "", "CUDA error: out of memory", "error", "Errorless"]


def candidates(lines: list[str], patterns: tuple[str, ...]) -> list[bool]:
    return pl.DataFrame({"t": lines}).select(holds_any(pl.col("t"), patterns)).to_series().to_list()


def test_minimal_literals_drop_those_holding_a_shorter_one():
    assert minimal_literals(["Error: ", "Error", "rror", "NET/IB", "NET/IB : Using", "x"]) == ("NET/IB", "rror", "x")


def test_alternations_find_the_lines_contains_any_finds(monkeypatch):
    literals = ["Error: ", "Error", "NET/IB", "out of memory", "a.b", "(x|y)", "NET/IB : Using"]
    expected = pl.Series(LINES + ["a.b", "axb", "(x|y)", "x"]).str.contains_any(literals).to_list()
    assert candidates(LINES + ["a.b", "axb", "(x|y)", "x"], alternations(literals)) == expected
    monkeypatch.setattr(logtext, "_ALTERNATION_LITERALS", 2)  # cut into alternations of two literals
    cut = alternations(literals)
    assert len(cut) == 3
    assert candidates(LINES + ["a.b", "axb", "(x|y)", "x"], cut) == expected


def test_the_prefilter_stays_far_below_the_engine_cliff():
    # Rust's regex runs 30-90x slower on one alternation of 2,500-3,000 literals (issue 19).
    assert all(p.count("|") < 2000 for p in PREFILTER_PATTERNS)


STEP_LINES = [
    "2026-11-30 03:00:00,283 - INFO - train.py:212 - [rank472] step 0/100000 loss 1.5605 lr 3.0e-04 tokens/s 109255",
    "[rank214]: step 1 loss 8.0225 step_time 0.435s",
    "node-26:47918:48779 [6] NCCL INFO P2P Chunksize set to 131072",
]


@pytest.mark.parametrize("line", STEP_LINES)
def test_common_lines_of_a_healthy_run_are_no_candidates(line):
    assert candidates([line], PREFILTER_PATTERNS) == [False]


SCREENED = [(k.kind, e) for k in LINE_KINDS if k.screen for e in k.examples]


@pytest.mark.parametrize("kind,example", SCREENED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SCREENED)])
def test_lines_of_a_screened_kind_are_candidates(kind, example):
    assert candidates([example, f"[rank3]: {example}"], PREFILTER_PATTERNS) == [True, True]
