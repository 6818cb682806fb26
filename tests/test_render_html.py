"""The HTML incident report: content and order, escaping, offline, determinism, and in Chromium.

The browser tests load each report in the system's headless Chromium (tests/browser_util.py) and
check that it renders with no console error, that the verdict and the timeline are visible, that
log text carrying markup is shown as text and runs nothing, and save a screenshot per report.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.render import html as html_mod
from analyzer.render.html import render_html, write_html
from tests.browser_util import headless_chromium, unavailable_reason
from tests.synth_job import SCRIPT_TAG, write_job

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "fixtures" / "cases"
HANG = CASES / "rec-watchdog-timeout-rank1-skipped" / "job"
IB_HOSTS = CASES / "020-litllama-ib-port-error-node48" / "job"
SHM = CASES / "001-xgboost-docker-shm-fallocate" / "job"
HEALTHY = ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"

IMG_TAG = "<img src=x onerror=alert(2)>"
ODD_NAME = "odd<img src=x onerror=alert(3)>.log"


def hostile_job(root: Path) -> Path:
    """Log lines and a file name that carry markup, plus a binary file the report must list as skipped."""
    job = root / "hostile"
    job.mkdir()
    (job / "host-a.log").write_text(
        "host-a:100:100 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 10 "
        "commId 0xabc - Init COMPLETE\n"
        f"host-a:100:107 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error {SCRIPT_TAG}\n",
        encoding="utf-8",
    )
    (job / ODD_NAME).write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "train.py", line 3, in <module>\n'
        f'[rank1]: RuntimeError: bad value {IMG_TAG} "quoted" & done\n',
        encoding="utf-8",
    )
    (job / "core.bin").write_bytes(bytes(range(256)) * 12)
    return job


def embedded_payload(page: str) -> dict:
    match = re.search(r'<script type="application/(json|octet-stream)" id="pm-data"([^>]*)>(.*?)</script>', page, re.S)
    assert match, "no embedded timeline data"
    if 'data-encoding="gzip-base64"' in match.group(2):
        return json.loads(gzip.decompress(base64.b64decode(match.group(3))))
    return json.loads(match.group(3))


def outside_scripts(page: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", page, flags=re.S)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    return hostile_job(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def synth_1024(tmp_path_factory):
    return write_job(tmp_path_factory.mktemp("synth") / "job", 1024)


# --- the page, without a browser -----------------------------------------------------------------


def test_sections_in_reading_order_with_verdict_details():
    page = render_html(analyze(HANG))
    positions = [page.index(f'id="{name}"') for name in ("verdict", "findings", "timeline", "inputs")]
    assert positions == sorted(positions)
    verdict = page[positions[0]:positions[1]]
    assert "rank_absent_from_collective" in verdict
    assert '<span class="culprit">1</span>' in verdict  # culprit rank
    assert '<span class="culprit">vm</span>' in verdict  # its host
    assert "0.85 (high)" in verdict
    assert "none_rvolrln4/attempt_0/1/stderr.log:3" in verdict  # evidence file:line
    assert "What to do" in verdict
    findings = page[positions[1]:positions[2]]
    assert "symptom of hang-rank-absent-from-collective" in findings  # cause before symptom
    notes = page[positions[2]:positions[3]]
    assert "c10d-year-inferred" in notes and "clock inferred" in notes
    assert "line order" in notes  # events without a timestamp are placed, and it says how


def test_inputs_table_lists_every_file_and_why_one_was_skipped(hostile):
    page = render_html(analyze(hostile))
    table = page[page.index('id="inputs"'):]
    for name in ("core.bin", "host-a.log", "odd&lt;img src=x onerror=alert(3)&gt;.log"):
        assert name in table
    assert re.search(r'<tr class="skipped"><td class="mono">core\.bin</td><td>binary</td>.*?binary content', table)


def test_log_markup_is_escaped_everywhere(hostile):
    page = render_html(analyze(hostile))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown in the verdict's evidence
    assert "alert(1)" not in page.replace("&lt;script&gt;alert(1)&lt;/script&gt;", "").replace(
        "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e", "")
    assert "<img" not in page
    assert len(re.findall(r"<script\b", page)) == 3  # data, plotly.js, the report's script
    payload = embedded_payload(page)
    assert any(SCRIPT_TAG in text for text in payload["texts"])  # the hover data keeps the line exactly
    assert ODD_NAME in payload["files"]


def test_offline_by_construction():
    page = render_html(analyze(HANG))
    html_only = outside_scripts(page)
    assert not re.search(r"(?i)\b(?:src|href|action)\s*=", html_only)
    assert "url(" not in html_only
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    inline = [m.group(1) for m in re.finditer(r"<script>(.*?)</script>", page, re.S)]
    assert len(inline) == 2
    for source in inline:
        digest = base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    assert html_mod.plotly_js() in inline[0]


def test_vendored_plotly_matches_its_recorded_hash():
    vendor = ROOT / "analyzer" / "render" / "vendor"
    recorded = re.search(r"`([0-9a-f]{64})`", (vendor / "README.md").read_text()).group(1)
    assert hashlib.sha256((vendor / "plotly-basic.min.js").read_bytes()).hexdigest() == recorded
    assert "MIT License" in (vendor / "LICENSE-plotly.js.txt").read_text()


def test_deterministic_across_runs_and_hash_seeds(tmp_path):
    assert render_html(analyze(HANG)) == render_html(analyze(HANG))
    outputs = []
    for seed in ("1", "4242"):
        out = tmp_path / f"r{seed}.html"
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "analyzer.cli", "analyze", str(HANG), "--html", str(out)],
                       env=env, capture_output=True, cwd=ROOT)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_cli_writes_html_besides_the_text_report(tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["analyze", str(HANG), "--html", str(out)], catch_exceptions=False)
    assert result.exit_code == 1
    assert "VERDICT: rank_absent_from_collective" in result.output
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    healthy = tmp_path / "healthy.html"
    result = CliRunner().invoke(main, ["analyze", str(HEALTHY), "--format", "json", "--html", str(healthy)])
    assert result.exit_code == 0
    assert json.loads(result.output)["verdict"]["category"] == "none"
    assert 'class="verdict none"' in healthy.read_text(encoding="utf-8")


def test_large_job_is_folded_and_compressed(synth_1024):
    analysis = analyze(synth_1024.path)
    page = render_html(analysis)
    assert 'data-encoding="gzip-base64"' in page
    payload = embedded_payload(page)
    lanes = payload["lanes"]
    assert len(lanes["label"]) <= 4
    culprit = [label for label, flag in zip(lanes["label"], lanes["culprit"]) if flag]
    assert culprit == [f"rank {synth_1024.culprit} (gpu-{synth_1024.culprit // 8:05d})"]
    assert max(lanes["units"]) == synth_1024.world - 3  # rank 0 (steps), the odd rank and the culprit stand apart
    assert len(set(payload["members"]["unit"])) == synth_1024.world - 3


@pytest.mark.slow
def test_wheel_ships_plotly_and_the_page_assets(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("postmortem-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("analyzer/render/vendor/plotly-basic.min.js", "analyzer/render/vendor/LICENSE-plotly.js.txt",
                   "analyzer/render/assets/report.js", "analyzer/render/assets/report.css"):
        assert needed in names


# --- in Chromium ---------------------------------------------------------------------------------

browser_reason = unavailable_reason()
needs_browser = pytest.mark.skipif(browser_reason is not None, reason=f"no headless browser: {browser_reason}")


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def load_report(browser, analysis, path: Path, shots: Path):
    write_html(analysis, path)
    load = browser.load(path)
    assert load.state == "ready", browser.js("return document.getElementById('timeline-error').textContent")
    assert load.console_errors == []
    assert load.traps == {"dialogs": [], "errors": [], "csp": []}
    assert load.resources == []  # nothing fetched
    assert browser.visible("#verdict .category")
    assert browser.visible("#timeline-plot .main-svg")
    assert browser.js("return document.querySelectorAll('#timeline-plot .scatterlayer .point').length") > 0
    shot = browser.screenshot(shots / f"{path.stem}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    return load


@needs_browser
@pytest.mark.parametrize("job", [HANG, IB_HOSTS, SHM, HEALTHY], ids=lambda p: p.parent.name)
def test_fixture_reports_render_in_chromium(browser, shots, tmp_path, job):
    analysis = analyze(job)
    load_report(browser, analysis, tmp_path / f"{job.parent.name}.html", shots)
    category = browser.js("return document.querySelector('#verdict .category').textContent")
    assert category == analysis.report["verdict"]["category"]
    lanes = browser.js("return window.postmortemTimeline.rows().length")
    assert lanes == len(embedded_payload((tmp_path / f"{job.parent.name}.html").read_text())["lanes"]["label"])


@needs_browser
def test_culprit_lane_is_highlighted(browser, shots, tmp_path):
    load_report(browser, analyze(HANG), tmp_path / "hang.html", shots)
    ticks = browser.js("return Array.from(document.querySelectorAll('#timeline-plot .ytick text')).map(t => [t.textContent, t.innerHTML])")
    culprit = [text for text, inner in ticks if "b3261e" in inner]
    assert culprit == ["rank 1 (vm)"]
    shapes = browser.js("return document.getElementById('timeline-plot').layout.shapes.map(s => s.fillcolor)")
    assert "rgba(179,38,30,0.13)" in shapes


@needs_browser
def test_markup_in_logs_is_shown_as_text_and_runs_nothing(browser, shots, tmp_path, hostile):
    load = load_report(browser, analyze(hostile), tmp_path / "hostile.html", shots)
    text = browser.js("return document.body.innerText")
    assert SCRIPT_TAG in text and ODD_NAME in text
    assert browser.js("return Array.from(document.scripts).filter(s => s.textContent.indexOf('alert(1)') >= 0 && s.id !== 'pm-data').length") == 0
    assert browser.js("return document.querySelectorAll('img').length") == 0
    # Hover the marker of the line with the script tag: the label shows it, verbatim, as text.
    hovered = browser.js(
        """
        var gd = document.getElementById('timeline-plot');
        for (var c = 0; c < gd.data.length; c++) {
          var h = gd.data[c].hovertext || [];
          for (var p = 0; p < h.length; p++) {
            if (h[p].indexOf('alert(1)') >= 0) { Plotly.Fx.hover(gd, [{curveNumber: c, pointNumber: p}]); return true; }
          }
        }
        return false;
        """
    )
    assert hovered
    label = browser.js("return document.querySelector('#timeline-plot .hoverlayer').textContent")
    assert SCRIPT_TAG in label
    assert browser.js("return window.__pm") == {"dialogs": [], "errors": [], "csp": []}
    assert load.console_errors == []


@needs_browser
def test_large_job_folds_expands_and_pages_inputs(browser, shots, tmp_path, synth_1024, monkeypatch):
    monkeypatch.setattr(html_mod, "INPUTS_INLINE", 100)  # 128 host files: the full list goes to the pager
    load_report(browser, analyze(synth_1024.path), tmp_path / "synth-1024.html", shots)
    before = browser.js("return window.postmortemTimeline.rows().length")
    browser.js("document.querySelector('#timeline-folds button').click()")
    browser.driver.implicitly_wait(0)
    expanded = browser.js(
        "return new Promise(function (done) { setTimeout(function () { done(window.postmortemTimeline.rows().length); }, 300); })"
    )
    assert expanded == before + 100  # one page of the fold's members
    assert browser.js("return document.querySelectorAll('#timeline-plot .ytick').length") == expanded
    browser.screenshot(shots / "synth-1024-expanded.png")
    browser.js("document.querySelector('#inputs-all button').click()")
    rows = browser.js("return document.querySelectorAll('#inputs-all table tr').length")
    assert rows == 1 + 128
    assert browser.js("return window.__pm") == {"dialogs": [], "errors": [], "csp": []}
    assert browser.driver.get_log("browser") == []
