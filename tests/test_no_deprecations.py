"""The pipeline's own code uses no deprecated API: one recorded job (Flight Recorder dumps, torchrun
logs) runs through every stage, is rendered as text, JSON and HTML, with a DeprecationWarning or
FutureWarning attributed to an `analyzer` module turned into an error (a polars rename, a
`datetime.utcnow`). Warnings that libraries raise about their own internals are not ours to fix.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from rich.console import Console

from analyzer.api import analyze
from analyzer.render.html import render_html
from analyzer.render.json_report import render_json
from analyzer.render.text import render_text

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "hang_uneven_data" / "job"


def test_every_stage_runs_without_a_deprecated_call():
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("error", category=category, module=r"analyzer(\.|$)")
        result = analyze(JOB)
        console = Console(width=200, soft_wrap=True, no_color=True, color_system=None)
        with console.capture() as captured:
            render_text(result.report, console, all_inputs=True)
        json_text = render_json(result.model)
        html = render_html(result)
    assert result.report["verdict"]["category"] != "none"
    assert captured.get() and json_text.startswith("{") and "<html" in html
