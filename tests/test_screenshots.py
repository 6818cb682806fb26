"""Screenshots of the job report at 2, 64 and 1,024 ranks, of a slow traced job and of the fleet page.

Rendered in Debian's headless Chromium (see tests/browser_util.py; skipped when it is absent). The
PNGs go to the directory named by POSTMORTEM_SCREENSHOTS (default: a pytest temporary directory)
so that a person can look at them; what a picture shows that the DOM can prove is asserted here:
the legend lists exactly the marker classes drawn, no two classes share a symbol and a colour,
markers of different classes never sit on the same point, and the slow job's step-time panel
exists and names its culprit.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.render.html import write_html
from tests.browser_util import headless_chromium, unavailable_reason
from tests.jobgen import make_jobs
from tests.synth_job import write_job

ROOT = Path(__file__).resolve().parents[1]
HANG_2 = ROOT / "fixtures" / "recorded" / "hang_uneven_data" / "job"
SLOW_TRACED = ROOT / "fixtures" / "recorded" / "slow_rank_traced" / "job"

reason = unavailable_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"no headless browser: {reason}")

# Per trace of the timeline: its class, its glyph (the filled form) and colour, and its points.
TRACES = """
var gd = document.getElementById('timeline-plot');
return gd.data.filter(function (t) { return t.mode === 'markers'; }).map(function (t) {
  var symbols = Array.isArray(t.marker.symbol) ? t.marker.symbol : [t.marker.symbol];
  return {cls: t.legendgroup, name: t.name, hover: t.hovertext[0], axis: t.xaxis, symbol: String(symbols[0]).replace('-open', ''), color: t.marker.color,
          points: t.x.map(function (x, i) { return [x, t.y[i]]; })};
});
"""


def section_shot(browser, selector: str, out: Path, max_height: int = 2400) -> Path:
    """A PNG of one element of the page (its top max_height CSS pixels), to look at the timeline up close."""
    box = browser.js("var r = document.querySelector(arguments[0]).getBoundingClientRect();"
                     "return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};", selector)
    clip = {"x": box["x"], "y": box["y"], "width": box["w"], "height": min(box["h"], max_height), "scale": 1}
    shot = browser.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True})
    out.write_bytes(base64.b64decode(shot["data"]))
    return out


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    where = os.environ.get("POSTMORTEM_SCREENSHOTS")
    out = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(width=1400, height=1000) as b:
        yield b


def _job(name: str, tmp_path_factory) -> Path:
    if name == "2-ranks-hang":
        return HANG_2
    if name == "slow-traced":
        return SLOW_TRACED
    world = int(name.split("-")[0])
    return write_job(tmp_path_factory.mktemp(f"synth{world}") / "job", world).path


def _check_markers(browser) -> list[dict]:
    traces = browser.js(TRACES)
    assert traces, "no marker drawn"
    # The legend lists each class drawn, and no other.
    legend = browser.js("return Array.from(document.querySelectorAll('#timeline-legend li[data-cls]')).map(li => li.dataset.cls)")
    assert sorted(legend) == sorted({t["cls"] for t in traces})
    # Hovering a marker names its class first.
    for t in traces:
        assert t["hover"].startswith(f"<b>{t['name']}</b>"), (t["cls"], t["hover"][:80])
    assert browser.visible("#timeline-legend")
    # Distinct glyphs: one (symbol, colour) per class, and no two classes alike.
    style = {t["cls"]: (t["symbol"], t["color"]) for t in traces}
    assert len(set(style.values())) == len(style), style
    # No point of one class hides a point of another (same panel, same x, same y).
    owner: dict[tuple, str] = {}
    for t in traces:
        for x, y in t["points"]:
            key = (t["axis"], x, round(y, 6))
            assert owner.setdefault(key, t["cls"]) == t["cls"], f"{t['cls']} sits on {owner[key]} at {key}"
    return traces


@pytest.mark.parametrize("name", ["2-ranks-hang", "64-ranks", "1024-ranks", "slow-traced"])
def test_job_report_screenshot(browser, shots, tmp_path, tmp_path_factory, name):
    job = _job(name, tmp_path_factory)
    analysis = analyze(job)
    page = tmp_path / f"{name}.html"
    write_html(analysis, page)
    load = browser.load(page)
    assert load.state == "ready", browser.js("return document.getElementById('timeline-error').textContent")
    assert load.console_errors == [] and load.traps == {"dialogs": [], "errors": [], "csp": []}
    _check_markers(browser)
    culprits = analysis.report["verdict"]["culprit_ranks"]
    if name == "slow-traced":
        assert browser.visible("#steps-plot .main-svg")
        assert browser.js("return document.getElementById('steps').dataset.culprits") == ",".join(map(str, culprits))
        names = browser.js("return document.getElementById('steps-plot').data.map(t => t.name)")
        assert [f"rank {r} (culprit)" for r in culprits] == sorted({n for n in names if "culprit" in n})
        assert "in red" in browser.js("return document.getElementById('steps').innerText")
    else:
        assert browser.js("return document.getElementById('steps')") is None  # no step timing, no panel
    shot = browser.screenshot(shots / f"report-{name}.png")
    close = section_shot(browser, "#timeline", shots / f"timeline-{name}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and close.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fleet_page_screenshot(browser, shots, tmp_path):
    make_jobs(tmp_path / "night", 12)
    page = tmp_path / "night.html"
    result = CliRunner().invoke(main, ["scan", str(tmp_path / "night"), "--out", str(tmp_path / "night.parquet"),
                                       "--html", str(page), "-j", "1"], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    browser.driver.get_log("browser")
    browser.driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + 30
    while browser.js("return document.readyState") != "complete" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert browser.js("return document.querySelectorAll('table tr').length") > 1
    assert [e for e in browser.driver.get_log("browser") if e.get("level") == "SEVERE"] == []
    shot = browser.screenshot(shots / "fleet-night.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fleet_page_with_long_job_paths_has_no_horizontal_overflow(browser, shots, tmp_path):
    from analyzer.fleet.view import fleet_view
    from analyzer.fleet.page_html import render_fleet_html
    from tests.test_fleet import LONG_JOB, long_path_table

    page = tmp_path / "long-paths.html"
    page.write_text(render_fleet_html(fleet_view(long_path_table())), encoding="utf-8")
    browser.driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + 30
    while browser.js("return document.readyState") != "complete" and time.monotonic() < deadline:
        time.sleep(0.05)
    widths = browser.js("return {page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth,"
                        " tables: Array.from(document.querySelectorAll('table')).map(function (t) {"
                        "   return t.scrollWidth - t.parentElement.clientWidth; })};")
    assert widths["page"] <= widths["view"], widths
    assert max(widths["tables"]) <= 0, widths
    assert LONG_JOB[-40:] in browser.js("return document.body.innerText").replace("\n", "")
    shot = browser.screenshot(shots / "fleet-long-paths.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
