"""Every healthy fixture must produce no finding at all (the catalogue's 'goodlog' test)."""

from pathlib import Path

import pytest

from analyzer.api import analyze

HEALTHY = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "healthy").glob("*/job"))


@pytest.mark.parametrize("job", HEALTHY, ids=[p.parent.name for p in HEALTHY])
def test_healthy_run_has_no_finding(job):
    report = analyze(job).report
    assert report["verdict"]["category"] == "none"
    assert report["findings"] == []
    assert report["job"]["outcome"] == "ok"
    assert all(i["status"] == "parsed" for i in report["inputs"])


def test_there_are_healthy_fixtures():
    assert len(HEALTHY) >= 2
