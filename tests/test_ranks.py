"""analyzer.ranks: the one spelling of a set of ranks that analyses, the report and renderers share."""

from __future__ import annotations

from analyzer.ranks import format_ranks, ranks_label


def test_runs_collapse_and_order_and_duplicates_do_not_matter():
    assert format_ranks([0, 2, 3, 4, 5, 63]) == "0,2-5,63"
    assert format_ranks([7, 3, 3, 4, 0]) == "0,3-4,7"
    assert format_ranks(range(64)) == "0-63"
    assert format_ranks([]) == ""


def test_a_label_says_rank_for_one_and_ranks_for_more():
    assert ranks_label([1]) == "rank 1"
    assert ranks_label([1, 1]) == "rank 1"
    assert ranks_label(range(64)) == "ranks 0-63"
    assert ranks_label({5, 2, 3}) == "ranks 2-3,5"
