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
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.render import html as html_mod
from analyzer.render import page as page_mod
from analyzer.render.html import render_html, write_html
from analyzer.render.timeline_payload import embedded
from analyzer.rules import rules_by_id
from tests.browser_util import headless_chromium, unavailable_reason
from tests.driftgen import build as build_drift
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


class HostsTable(HTMLParser):
    """The Hosts section's table as rows: each row's host (or fold size) and its cells by column,
    with each cell's class, title and text."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.rows: list[dict] = []
        self._in_table = False
        self._cell: dict | None = None
        self.feed(page[page.index('<section id="hosts">'):page.index("</section>", page.index('<section id="hosts">'))])
        self.rows = [row for row in self.rows if row["text"]]  # not the header

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("class") == "hosts":
            self._in_table = True
        elif self._in_table and tag == "tr":
            self.rows.append({"host": attrs.get("data-host"), "fold": attrs.get("data-fold"), "class": attrs.get("class", ""),
                              "cells": {}, "text": ""})
        elif self._in_table and tag == "td":
            self._cell = {"col": attrs.get("data-col"), "class": attrs.get("class") or "", "title": attrs.get("title"), "text": ""}

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            row = self.rows[-1]
            row["text"] += self._cell["text"] + "\t"
            if self._cell["col"]:
                row["cells"][self._cell["col"]] = self._cell
            self._cell = None
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def marked(self) -> set[tuple[str | None, str]]:
        """(host, column) of every cell marked as differing."""
        return {(row["host"], col) for row in self.rows for col, cell in row["cells"].items() if "differs" in cell["class"].split()}


def host_records(n: int, odd: dict[int, dict] | None = None) -> list[dict]:
    """`job.host_facts` of an n-host job whose hosts are alike but for the `odd` ones (index -> fields)."""
    base = {"nccl_version": "2.21.5", "nccl_build": "cuda12.4", "net_plugin": "external: libnccl-net.so", "network": "IBext",
            "nics": "mlx5_0:1/IB, mlx5_1:1/IB", "transports": "NET/IBext/GDRDMA, P2P/IPC", "cuda_driver": "12.4",
            "driver_version": "550.54.15", "torch_version": "2.4.0+cu124", "gpu_model": "NVIDIA H100 80GB HBM3",
            "gpu_memory": "80 GiB"}
    odd = odd or {}
    records = []
    for h in range(n):
        fields = {**base, **odd.get(h, {})}
        env = {"NCCL_IB_HCA": "mlx5", "NCCL_HOSTID": f"id-{h}", **fields.pop("env", {})}
        differs = sorted(k for k, v in fields.items() if v != base.get(k)) + sorted(
            f"env.{k}" for k, v in env.items() if k != "NCCL_HOSTID" and v != "mlx5")
        records.append({"host": fields.pop("host", f"gpu-{h:05d}"), "ranks": list(range(8 * h, 8 * h + 8)),
                        "addresses": [f"ib0:10.{h // 250}.{h % 250}.1"], **fields, "env": env, "duplicate_name": False,
                        "differs": differs, "per_rank": []})
    return records


def with_host_facts(analysis, records: list[dict]):
    """The analysis with its report's host facts replaced (the renderer reads only the report)."""
    analysis.report = {**analysis.report, "job": {**analysis.report["job"], "host_facts": records}}
    return analysis


def checkpoint_job(tmp_path: Path) -> Path:
    """A job with real torch checkpoints: step 100 complete, step 200 cut off mid-save, step 250 a
    two-rank torch.distributed.checkpoint save whose rank-1 shard is gone."""
    from tests.test_analyses_checkpoint import truncated_newest
    from tests.test_checkpoints import dcp_two_ranks

    job = truncated_newest(tmp_path)
    dcp_two_ranks(job / "ckpt" / "step_250", 250)
    (job / "ckpt" / "step_250" / "__1_0.distcp").unlink()
    return job


def hosts_section(page: str) -> str:
    start = page.index('<section id="hosts">')
    return page[start:page.index("</section>", start) + len("</section>")]


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    return lambda name: build_drift(name, root) if not (root / name).exists() else root / name


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


# --- hosts and checkpoints --------------------------------------------------------------------------

# The odd host of each two-node drift variant (fixtures/drift/README.md). The two hosts split
# evenly, so the report's `differs` names both; the drift finding names the odd side (the older
# NCCL, the smaller card, the host without the net plugin) and only that side is marked.
ODD_CELLS = {
    "nccl_version": {("node-b", "nccl_version")},
    "gpu_models": {("node-b", "gpu_model"), ("node-b", "gpu_memory")},
    "net_plugin": {("node-b", "net_plugin")},
}


@pytest.mark.parametrize("variant", sorted(ODD_CELLS))
def test_hosts_table_marks_exactly_the_odd_hosts_cells(drift, variant):
    analysis = analyze(drift(variant))
    page = render_html(analysis)
    assert page.index('id="findings"') < page.index('id="hosts"') < page.index('id="timeline"') < page.index('id="inputs"')
    table = HostsTable(page)
    assert {row["host"] for row in table.rows} == {"node-a", "node-b"}
    assert table.marked() == ODD_CELLS[variant]
    for host, col in ODD_CELLS[variant]:
        odd = next(row for row in table.rows if row["host"] == host)["cells"][col]
        other = next(row for row in table.rows if row["host"] != host)["cells"][col]
        assert odd["text"].startswith("\u2260\u00a0")  # a glyph, not colour alone
        # The tooltip names the other side's value and the finding that named this side.
        assert other["text"] in odd["title"] and "split evenly" in odd["title"]
        assert "names the" in other["title"]
    section = hosts_section(page)
    assert section.count('class="differs"') == len(ODD_CELLS[variant])
    assert re.search(r'class="differs"[^>]*><span class="mark">\u2260</span>\u00a0<b>', section)


def test_healthy_drift_job_has_a_hosts_table_with_no_marked_cell(drift):
    table = HostsTable(render_html(analyze(drift("healthy"))))
    assert [row["host"] for row in table.rows] == ["node-a", "node-b"]
    assert table.marked() == set()
    for row in table.rows:
        assert row["cells"]["nccl_version"]["text"] == "2.28.9" and row["cells"]["gpu_model"]["text"] == "NVIDIA H200"
    assert "env.NCCL_HOSTID" not in table.rows[0]["cells"]  # set per host by design: not a column


def test_duplicate_hostname_and_rank_disagreement_are_flagged(drift):
    page = render_html(analyze(drift("identical_hostnames")))
    table = HostsTable(page)
    assert table.marked() == {("trainer", "addresses")}
    (row, per_rank) = table.rows
    assert row["class"].split() == ["host-row", "marked", "dup"] and "duplicate name" in row["text"]
    assert "several machines use this host name" in row["cells"]["addresses"]["title"]
    assert "rank 0 pid 646: NCCL_HOSTID=drift-node0; rank 1 pid 647: NCCL_HOSTID=drift-node1" in per_rank["text"]


def test_many_hosts_fold_into_a_few_rows(tmp_path):
    """2,048 hosts from the host-facts benchmark's frame, one in 64 with another NCCL and no plugin."""
    from analyzer.facts.hostfacts import derive_host_facts, host_fact_records
    from bench.bench_hostfacts import synthetic_events

    records = host_fact_records(derive_host_facts(synthetic_events(2048, 1, 1)))
    odd = [r["host"] for r in records if r["differs"]]
    assert len(odd) == 32
    plain = render_html(with_host_facts(analyze(HEALTHY), []))
    page = render_html(with_host_facts(analyze(HEALTHY), records))
    table = HostsTable(page)
    assert len(table.rows) == 2
    fold_odd, alike = table.rows
    assert (fold_odd["fold"], alike["fold"]) == ("32", "2016")
    assert "2016 hosts alike" in alike["text"] and "node-[00000-00006,00008-00070," in alike["text"]
    assert {col for col, cell in fold_odd["cells"].items() if "differs" in cell["class"]} == {"nccl_version", "nccl_build", "net_plugin"}
    assert all(name[len("node-"):] in fold_odd["text"] for name in odd)  # every odd host is named
    assert "(32 of 2048)" not in fold_odd["cells"]["nccl_version"]["title"]
    assert "most hosts have 2.19.3 (2016 of 2048)" in fold_odd["cells"]["nccl_version"]["title"]
    assert fold_odd["cells"]["addresses"]["text"] == "(one per host)"
    assert len(hosts_section(page)) < 8_000 and len(page) - len(plain) < 8_000


def test_one_odd_host_among_4096_keeps_its_own_row():
    records = host_records(4096, {1234: {"driver_version": "535.104.05", "env": {"NCCL_IB_HCA": "mlx5_0"}}})
    page = render_html(with_host_facts(analyze(HEALTHY), records))
    table = HostsTable(page)
    assert table.marked() == {("gpu-01234", "driver_version"), ("gpu-01234", "env.NCCL_IB_HCA")}
    assert [(row["host"], row["fold"]) for row in table.rows] == [("gpu-01234", None), (None, "4095")]
    assert "gpu-[00000-01233,01235-04095]" in table.rows[1]["text"]
    cell = table.rows[0]["cells"]["driver_version"]
    assert cell["text"] == "\u2260\u00a0535.104.05" and cell["title"] == "differs: most hosts have 550.54.15 (4095 of 4096)"
    assert len(hosts_section(page)) < 6_000
    assert "Set per host by design (not compared): NCCL_HOSTID." in hosts_section(page)


def test_rows_beyond_the_cap_are_named_in_one_line():
    """250 hosts, each with its own driver: none folds, 200 rows (MAX_ROWS), the other 50 named compactly."""
    records = host_records(250, {h: {"driver_version": f"550.{h}"} for h in range(250)})
    section = hosts_section(render_html(with_host_facts(analyze(HEALTHY), records)))
    table = HostsTable(section)
    assert len(table.rows) == 200 and len(table.marked()) == 200
    assert "50 more host(s) not shown as rows: gpu-[00200-00249]; `--format json` lists every host." in section


def test_hostile_host_names_and_env_values_are_inert(tmp_path):
    """Markup in a host name (from a label or a manifest) and in a variable's value (from a log)."""
    evil_host = '"><img src=x onerror=alert(5)>'
    records = host_records(3, {0: {"host": evil_host, "nccl_version": "2.18.1<script>alert(6)</script>"},
                               1: {"env": {"NCCL_IB_HCA": "</td><img src=x onerror=alert(7)>"}}})
    page = render_html(with_host_facts(analyze(HEALTHY), records))
    section = hosts_section(page)
    assert "<img" not in section and "<script" not in section
    table = HostsTable(page)
    assert table.marked() == {(evil_host, "nccl_version"), ("gpu-00001", "env.NCCL_IB_HCA")}
    assert next(r for r in table.rows if r["host"] == evil_host)["cells"]["nccl_version"]["text"] == (
        "\u2260\u00a02.18.1<script>alert(6)</script>")
    # And through the whole pipeline: a variable set to markup on one host of three.
    job = tmp_path / "env"
    job.mkdir()
    value = "<img src=x onerror=alert(4)>"
    for i, host in enumerate(("h-a", "h-b", "h-c")):
        (job / f"{host}.log").write_text(
            f"{host}:100:100 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
            f"{host}:100:100 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to {value if i == 0 else 'eth0'}\n"
            f"{host}:100:100 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank {i} nranks 3 cudaDev 0 nvmlDev 0 busId 10 "
            "commId 0xabc - Init COMPLETE\n", encoding="utf-8")
    page = render_html(analyze(job))
    assert HostsTable(page).marked() == {("h-a", "env.NCCL_SOCKET_IFNAME")}
    assert "<img" not in outside_scripts(page)
    assert "&lt;img src=x onerror=alert(4)&gt;" in hosts_section(page)


def test_checkpoints_section_names_the_resume_point(tmp_path):
    """Real torch checkpoints: one complete, one cut off mid-save, one DCP save missing a rank's shard."""
    analysis = analyze(checkpoint_job(tmp_path))
    page = render_html(analysis)
    start = page.index('<section id="checkpoints">')
    section = page[start:page.index("</section>", start)]
    assert page.index('id="hosts"') < start < page.index('id="timeline"')
    assert '\u25b6 Resume from <b class="mono">ckpt/step_100.pt</b> (step 100)' in section
    rows = re.findall(r"<tr( class=\"[^\"]*\")?><td class=\"mono\">([^<]+)</td><td>([^<]+)</td>(.*?)</tr>", section)
    by_path = {path: (cls, fmt, rest) for cls, path, fmt, rest in rows}
    assert list(by_path) == [c["path"] for c in analysis.report["checkpoints"]]
    assert set(by_path) == {"ckpt/step_250", "ckpt/step_200.pt", "ckpt/step_100.pt"}
    cls, fmt, rest = by_path["ckpt/step_250"]
    assert fmt == "dcp" and "bad" in cls and "1 of 2 shards; missing __1_0.distcp; rank(s) 1 lack their shard" in rest
    cls, fmt, rest = by_path["ckpt/step_200.pt"]
    assert fmt == "torch_zip" and "\u2717 no: truncated" in rest
    cls, fmt, rest = by_path["ckpt/step_100.pt"]
    assert "newest" in cls and "<b>\u25b6 newest resumable (exact)</b>" in rest and "\u2713 yes" in rest


def test_no_checkpoint_section_without_an_audit_and_a_note_without_checkpoints(tmp_path):
    analysis = analyze(HANG)
    assert 'id="checkpoints"' in render_html(analysis) and "No checkpoint found" in render_html(analysis)
    analysis.report = {k: v for k, v in analysis.report.items() if k != "checkpoints"}
    assert 'id="checkpoints"' not in render_html(analysis)


@pytest.mark.slow
def test_wheel_ships_plotly_the_page_assets_and_templates(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("postmortem-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("analyzer/render/vendor/plotly-basic.min.js", "analyzer/render/vendor/LICENSE-plotly.js.txt",
                   "analyzer/render/assets/report.js", "analyzer/render/assets/report.css",
                   "analyzer/render/templates/base.html.j2", "analyzer/render/templates/report.html.j2",
                   "analyzer/fleet/templates/fleet.html.j2", "analyzer/fleet/assets/fleet.css"):
        assert needed in names


def test_every_marker_class_has_its_own_shape_colour_and_legend_entry():
    styles = html_mod.STYLE
    assert set(styles) == set(html_mod.CLASSES)
    assert len({s.symbol for s in styles.values()}) == len(styles)  # readable without colour
    assert len({s.color for s in styles.values()}) == len(styles)
    assert all(s.symbol in html_mod._SVG_SHAPES and abs(s.offset) < 0.5 for s in styles.values())
    page = render_html(analyze(HANG))
    drawn = [c["id"] for c in embedded_payload(page)["classes"]]
    legend = re.findall(r'<li data-cls="([^"]+)" data-symbol="([^"]+)"><svg', page[page.index('id="timeline-legend"'):])
    assert [cls for cls, _ in legend] == drawn and "watchdog" in drawn
    assert all(symbol == styles[cls].symbol for cls, symbol in legend)


def test_step_time_panel_only_with_trace_step_times():
    slow = ROOT / "fixtures" / "recorded" / "slow_rank_traced" / "job"
    analysis = analyze(slow)
    page = render_html(analysis)
    culprits = analysis.report["verdict"]["culprit_ranks"]
    assert culprits and f'<div id="steps" data-culprits="{",".join(map(str, culprits))}">' in page
    steps = embedded_payload(page)["steps"]
    assert sorted(set(steps["rank"])) == [0, 1] and {r for r, c in zip(steps["rank"], steps["culprit"]) if c} == set(culprits)
    hang = render_html(analyze(HANG))
    assert 'id="steps"' not in hang and "steps" not in embedded_payload(hang)


# --- templates: one base, autoescaping, Markdown, data elements -----------------------------------

HOSTILE = '"><img src=x onerror=alert(9)></script><script>alert(9)</script>'
HOSTILE_SHOWN = "&#34;&gt;&lt;img src=x onerror=alert(9)&gt;&lt;/script&gt;&lt;script&gt;alert(9)&lt;/script&gt;"
HOSTILE_MARKDOWN = HOSTILE_SHOWN.replace("&#34;", "&quot;")  # markdown-it's escape of the same text
# What the base template writes on every page, in this order, whatever the page.
BASE_SKELETON = ("<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                 '<meta http-equiv="Content-Security-Policy" content="', '<meta name="viewport"',
                 '<meta name="referrer" content="no-referrer">', '<meta name="generator" content="postmortem ',
                 "<title>", "<style>", "</head>", "<body>", "<header>", "<h1>", "</header>", "<main>", "</main>",
                 '<footer class="pm-footer">postmortem ', "</body>", "</html>")


def hostile_report(analysis):
    """The analysis with markup in every kind of string the page shows from a report: the job path,
    a culprit host, an evidence line's file, rank and text, a finding's title, summary and
    remediation, an input's file and reason, an analyzer problem."""
    report = json.loads(json.dumps(analysis.report))
    report["job"]["path"] = f"/jobs/{HOSTILE}"
    verdict = report["verdict"]
    verdict["culprit_hosts"] = [HOSTILE]
    verdict["evidence"][0].update(file=HOSTILE, rank=HOSTILE, text=HOSTILE)
    for f in report["findings"]:
        f.update(title=HOSTILE, summary=HOSTILE, hosts=[HOSTILE],
                 remediation=f"1. first {HOSTILE}\n2. `{HOSTILE}`\n\n{HOSTILE}\n\n[x](javascript:alert(9)) ![i](x.png)")
    report["inputs"][0].update(file=HOSTILE, reason=HOSTILE)
    report["problems"] = [HOSTILE]
    analysis.report = report
    return analysis


class Elements(HTMLParser):
    """Every element of a page as (tag, attribute names)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, set[str]]] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, {name for name, _ in attrs}))


def tag_lines(page: str) -> list[str]:
    return [line for line in re.sub(r">\s*<", ">\n<", outside_scripts(page)).split("\n") if line]


def base_skeleton(page: str) -> list[str]:
    """The base template's lines of a page, in page order."""
    return [start for line in tag_lines(page) for start in BASE_SKELETON if line.startswith(start)]


def test_markup_in_every_report_string_is_text():
    page = render_html(hostile_report(analyze(HANG)))
    html_only = outside_scripts(page)
    assert "<img" not in html_only and "alert(9)</script>" not in page
    assert len(re.findall(r"<script\b", page)) == 3  # data, plotly.js, the report's script: none injected
    elements = Elements(page).found
    assert [tag for tag, _ in elements if tag in ("img", "a", "iframe", "object")] == []  # none from the Markdown either
    assert [tag for tag, attrs in elements if attrs & {"src", "href", "action", "onerror", "onload"}] == []
    assert f"<title>postmortem: rank_absent_from_collective - /jobs/{HOSTILE_SHOWN}</title>" in page
    verdict = page[page.index('<section id="verdict"'):page.index('<section id="findings"')]
    assert f'<span class="culprit">{HOSTILE_SHOWN}</span>' in verdict
    assert f'<code class="loc">{HOSTILE_SHOWN}:' in verdict and f'<span class="rank">rank {HOSTILE_SHOWN}</span>' in verdict
    assert f"<pre>{HOSTILE_SHOWN}</pre>" in verdict
    assert f"<li>first {HOSTILE_MARKDOWN}</li>" in verdict and f"<li><code>{HOSTILE_MARKDOWN}</code></li>" in verdict
    assert f"<p>{HOSTILE_MARKDOWN}</p>" in verdict and "[x](javascript:alert(9))" in verdict
    findings = page[page.index('<section id="findings"'):page.index('<section id="hosts"')]
    assert f"<b>{HOSTILE_SHOWN}</b>" in findings and f"hosts {HOSTILE_SHOWN}" in findings
    inputs = page[page.index('<section id="inputs"'):]
    assert f'<td class="mono">{HOSTILE_SHOWN}</td>' in inputs and f"<li>{HOSTILE_SHOWN}</li>" in inputs


def test_numbered_remediation_steps_are_a_list():
    page = render_html(analyze(HANG))
    rule = rules_by_id()[analyze(HANG).report["verdict"]["rule_id"]]
    steps = re.findall(r"(?m)^\d+\. ", rule.remediation)
    assert len(steps) == 5
    verdict = page[page.index('<section id="verdict"'):page.index('<section id="findings"')]
    remediation = re.search(r'<div class="remediation">(.*?)</div>', verdict, re.S).group(1)
    assert remediation.startswith("<ol>") and remediation.count("<li>") == len(steps)
    assert "<code>postmortem capture</code>" in remediation  # `code` in the prose
    # One paragraph stays a paragraph; HTML in the source is text, links and images stay as written.
    assert page_mod.markdown("Check `a<b` first.") == "<p>Check <code>a&lt;b</code> first.</p>\n"
    assert page_mod.markdown("1. one\n2. two\n\n- a\n- b") == "<ol>\n<li>one</li>\n<li>two</li>\n</ol>\n<ul>\n<li>a</li>\n<li>b</li>\n</ul>\n"
    assert page_mod.markdown("<script>alert(1)</script>") == "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n"
    assert page_mod.markdown("[x](https://example.com) ![i](x.png) <https://example.com>") == (
        "<p>[x](https://example.com) ![i](x.png) &lt;https://example.com&gt;</p>\n")


def test_the_report_and_the_fleet_page_extend_one_base():
    from analyzer.fleet.page_html import render_fleet_html
    from analyzer.fleet.view import fleet_view
    from tests.test_fleet import scan_table

    report, fleet = render_html(analyze(HANG)), render_fleet_html(fleet_view(scan_table()))
    assert base_skeleton(report) == base_skeleton(fleet) == list(BASE_SKELETON)
    for template in (ROOT / "analyzer" / "render" / "templates" / "report.html.j2",
                     ROOT / "analyzer" / "fleet" / "templates" / "fleet.html.j2"):
        assert '{% extends "base.html.j2" %}' in template.read_text(encoding="utf-8")
    assert page_mod.environment() is page_mod.environment()  # loaded once per process
    assert page_mod.environment_with("analyzer.fleet") is page_mod.environment_with("analyzer.fleet")


def test_data_elements_cannot_be_closed_by_their_data():
    evil = {"t": "</script><!--<script>alert(1)</script>\u2028\u2029 & done"}
    text = page_mod.script_json(evil)
    assert not any(c in text for c in "<>&\u2028\u2029") and json.loads(text) == evil
    small = embedded(evil)
    assert small["encoding"] is None and json.loads(small["text"]) == evil
    big = {"t": ["</script><!--"] * 40_000}  # over COMPRESS_ABOVE: gzip+base64, nothing but the base64 alphabet
    packed = embedded(big)
    assert packed["encoding"] == "gzip-base64" and re.fullmatch(r"[A-Za-z0-9+/]+=*", packed["text"])
    assert json.loads(gzip.decompress(base64.b64decode(packed["text"]))) == big
    with pytest.raises(ValueError):
        page_mod.inline("var s = '</SCRIPT>';", "script")
    with pytest.raises(ValueError):
        page_mod.inline("a::after { content: '</style>'; }", "style")
    with pytest.raises(ValueError):
        page_mod.policy('script-src "x"')


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
def test_hosts_table_is_visible_in_the_drift_report(browser, shots, tmp_path, drift):
    load_report(browser, analyze(drift("nccl_version")), tmp_path / "drift-nccl-version.html", shots)
    assert browser.visible("#hosts table.hosts")
    marked = browser.js("return Array.from(document.querySelectorAll('#hosts td.differs')).map("
                        "td => [td.closest('tr').dataset.host, td.dataset.col, td.innerText, td.title])")
    assert [m[:3] for m in marked] == [["node-b", "nccl_version", "\u2260\u00a02.27.7"]]
    assert "2.28.9" in marked[0][3]
    assert browser.js("return getComputedStyle(document.querySelector('#hosts td.differs b')).fontWeight") in ("700", "bold")
    assert browser.js("return window.__pm") == {"dialogs": [], "errors": [], "csp": []}
    assert browser.driver.get_log("browser") == []


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
