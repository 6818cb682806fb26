"""Every fixture's JSON report equals its committed golden report (tests/golden.py says how to update)."""

import os

from tests.golden import ROOT, differences


def test_every_golden_report_is_current(monkeypatch):
    monkeypatch.chdir(ROOT)
    changed = differences()
    assert not changed, ("reports changed (if deliberate, run `python -m tests.golden --update` and commit the "
                         f"golden set with the reason): {changed}")
    assert os.listdir(ROOT / "tests" / "golden")
