"""The fleet view over a scan table: ranking, recurring signatures, the terminal summary, the HTML page."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
from click.testing import CliRunner
from rich.console import Console

from analyzer.cli import main
from analyzer.fleet import fleet_view, print_fleet_summary
from analyzer.render.fleet_html import render_fleet_html
from analyzer.scan import STATUS_ANALYSED, STATUS_CANNOT_ANALYSE, STATUS_CRASHED, rows_frame, write_outputs

HOSTILE = '<script>alert("x")</script>'


def failed(job: str, category: str, confidence: float, *, hosts=(), ranks=(), gpus=(), rule="rule-a", seen=()) -> dict:
    return {
        "job": job, "status": STATUS_ANALYSED, "category": category, "rule_id": rule, "verdict": "t", "summary": "s",
        "culprit_hosts": list(hosts), "culprit_ranks": list(ranks), "culprit_gpus": list(gpus),
        "implicated_hosts": sorted(hosts), "confidence": confidence, "signatures": [rule, "watchdog-timeout"],
        "hosts": sorted({*hosts, *seen}),
    }


def healthy(job: str, hosts=()) -> dict:
    return {"job": job, "status": STATUS_ANALYSED, "category": "none", "confidence": 1.0, "hosts": list(hosts),
            "culprit_hosts": [], "culprit_ranks": [], "implicated_hosts": [], "signatures": []}


def scan_table() -> pl.DataFrame:
    rows = [
        # "busy": named by 4 jobs with low confidence; "bad": by 3 with high; "meh": by 3 with low.
        *(failed(f"/n/busy{i}", "nccl_timeout", 0.3, hosts=["busy"]) for i in range(4)),
        *(failed(f"/n/bad{i}", "gpu_hardware_xid", 0.9, hosts=["bad"], gpus=["bad/gpu3"], rule="rule-b") for i in range(3)),
        *(failed(f"/n/meh{i}", "straggler", 0.4, hosts=["meh"], rule="rule-c") for i in range(3)),
        failed("/n/odd", "straggler", 0.5, hosts=[HOSTILE], rule="rule-c"),
        *(healthy(f"/n/ok{i}", hosts=["bad", "meh"]) for i in range(5)),
        {"job": "/n/<b>unreadable</b>", "status": STATUS_CANNOT_ANALYSE, "error": "nothing readable <here>"},
        {"job": "/n/crash", "status": STATUS_CRASHED, "error": "KeyError: 'rank'"},
    ]
    return rows_frame(rows)


def test_hosts_ranked_by_failed_jobs_then_confidence():
    hosts = fleet_view(scan_table()).hosts
    assert hosts.get_column("host").to_list() == ["busy", "bad", "meh", HOSTILE]
    bad = hosts.row(1, named=True)
    assert (bad["failed_jobs"], bad["jobs_seen"], bad["confidence_sum"], bad["gpus"]) == (3, 8, 2.7, ["bad/gpu3"])
    assert hosts.row(2, named=True)["jobs_seen"] == 8  # named by 3 of the 8 jobs it ran in


def test_gpus_signatures_categories_and_problems():
    view = fleet_view(scan_table())
    assert view.gpus.select("gpu", "host", "failed_jobs").rows() == [("bad/gpu3", "bad", 3)]
    signatures = view.signatures.select("rule_id", "failed_jobs", "jobs_fired").rows()
    assert signatures == [("rule-a", 4, 4), ("rule-c", 4, 4), ("rule-b", 3, 3)]
    assert view.signatures.filter(pl.col("rule_id") == "rule-c").item(0, "hosts").to_list() == sorted(["meh", HOSTILE])
    assert view.totals == {"jobs": 18, "analysed": 16, "failed": 11, "no_failure": 5, "cannot_analyse": 1, "crashed": 1}
    assert dict(view.categories.rows())["none"] == 5
    assert view.problems.get_column("status").to_list() == [STATUS_CANNOT_ANALYSE, STATUS_CRASHED]


def test_html_page_escapes_everything_and_loads_nothing():
    page = render_fleet_html(fleet_view(scan_table()))
    assert "<script" not in page and "<b>unreadable" not in page and "<here>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "nothing readable &lt;here&gt;" in page
    assert "http://" not in page and "https://" not in page and " src=" not in page
    assert page.index(">busy<") < page.index(">bad<") < page.index(">meh<")


def test_terminal_summary_lists_offenders_in_order():
    buffer = io.StringIO()
    print_fleet_summary(fleet_view(scan_table()), Console(file=buffer, width=200), top=4)
    text = buffer.getvalue()
    assert "18 jobs: 11 failed, 5 no failure found, 1 could not be analysed, 1 crashed the analyzer" in text
    assert text.index("busy") < text.index("bad") < text.index("meh")
    assert "<script>" in text  # printed as text, not interpreted as rich markup
    assert "KeyError: 'rank'" in text


def test_fleet_command_reads_a_scan(tmp_path: Path):
    out = tmp_path / "scan.parquet"
    write_outputs(scan_table(), out, tmp_path / "scan.jsonl")
    for source in (out, tmp_path / "scan.jsonl"):
        result = CliRunner().invoke(main, ["fleet", str(source), "--html", str(tmp_path / "fleet.html")])
        assert result.exit_code == 0, result.output
        assert "Repeat-offender hosts" in result.output and "busy" in result.output
    assert "busy" in (tmp_path / "fleet.html").read_text(encoding="utf-8")


def test_fleet_command_refuses_a_table_that_is_not_a_scan(tmp_path: Path):
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "other.parquet")
    result = CliRunner().invoke(main, ["fleet", str(tmp_path / "other.parquet")])
    assert result.exit_code == 2 and "not a scan table" in result.output
