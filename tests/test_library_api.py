"""The notebook API: `from analyzer import analyze` returns the report and the frames behind it."""

from pathlib import Path

import polars as pl

import analyzer

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"


def test_analyze_returns_the_report_and_its_frames():
    from analyzer import Analysis, analyze

    result = analyze(JOB)
    assert isinstance(result, Analysis)
    assert result.report["verdict"]["category"] == "rank_absent_from_collective"
    assert result.report["verdict"]["culprit_ranks"] == [1]
    assert isinstance(result.events, pl.DataFrame) and {"rank", "kind", "file", "line"} <= set(result.events.columns)
    assert isinstance(result.findings, pl.DataFrame) and result.findings.height >= 1
    ranks_seen = set(result.events.filter(pl.col("kind") == "watchdog.timeout")["rank"].drop_nulls().to_list())
    assert 0 in ranks_seen


def test_unknown_attributes_still_raise():
    try:
        analyzer.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("analyzer.no_such_thing resolved")
