"""The fleet view over a scan table: ranking, recurring signatures, the terminal summary, the HTML page."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from rich.console import Console

from analyzer.cli import main
from analyzer.fleet.rows import STATUS_ANALYSED, STATUS_CANNOT_ANALYSE, STATUS_CRASHED, STATUS_TIMED_OUT, rows_frame
from analyzer.fleet.view import fleet_view
from analyzer.fleet.page_html import render_fleet_html
from analyzer.fleet.page_text import print_fleet_summary

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
        {"job": "/n/slow", "status": STATUS_TIMED_OUT, "error": "the analysis did not finish within the 300 s job time limit"},
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
    assert view.totals == {"jobs": 19, "analysed": 16, "failed": 11, "no_failure": 5, "cannot_analyse": 1,
                           "timed_out": 1, "over_memory": 0, "crashed": 1}
    assert dict(view.categories.rows())["none"] == 5
    assert view.problems.get_column("status").to_list() == [STATUS_CANNOT_ANALYSE, STATUS_CRASHED, STATUS_TIMED_OUT]


def test_html_page_escapes_everything_and_loads_nothing():
    page = render_fleet_html(fleet_view(scan_table()))
    assert "<script" not in page and "<b>unreadable" not in page and "<here>" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page  # the templates' autoescaping
    assert "nothing readable &lt;here&gt;" in page
    assert "http://" not in page and "https://" not in page and " src=" not in page
    assert page.index(">busy<") < page.index(">bad<") < page.index(">meh<")


def test_markup_in_every_fleet_string_is_text():
    """A host, GPU, rule, category, job path, summary and error that carry markup, each shown as text."""
    evil = '"><img src=x onerror=alert(8)>'
    shown = "&#34;&gt;&lt;img src=x onerror=alert(8)&gt;"
    row = failed(f"/n/{evil}/job", evil, 0.9, hosts=[evil], gpus=[f"{evil}/gpu0"], rule=evil)
    page = render_fleet_html(fleet_view(rows_frame([
        {**row, "summary": evil},
        {"job": f"/n/{evil}", "status": STATUS_CRASHED, "error": evil},
    ])))
    assert "<img" not in page and "onerror=alert(8)>" not in page
    assert f'<span class="path">{shown}</span>' in page  # the host
    assert f'<span class="path">{shown}/gpu0</span>' in page  # the GPU
    assert f"<code>{shown}</code>" in page and f"<td>{shown}</td>" in page  # the rule, the category, the summary
    assert f'<span class="path">/<wbr>n/<wbr>{shown}/<wbr>job</span>' in page  # a path wraps and stays text
    assert f'<span class="bad">{STATUS_CRASHED}</span></td><td>{shown}</td>' in page  # the error


def test_terminal_summary_lists_offenders_in_order():
    buffer = io.StringIO()
    print_fleet_summary(fleet_view(scan_table()), Console(file=buffer, width=200), top=4)
    text = buffer.getvalue()
    assert ("19 jobs: 11 failed, 5 no failure found, 1 could not be analysed, 1 timed out, 1 crashed the analyzer"
            in text)
    assert text.index("busy") < text.index("bad") < text.index("meh")
    assert "<script>" in text  # printed as text, not interpreted as rich markup
    assert "KeyError: 'rank'" in text


def test_fleet_command_reads_a_scan(tmp_path: Path):
    out = tmp_path / "scan.parquet"
    scan_table().write_parquet(out)
    scan_table().write_ndjson(tmp_path / "scan.jsonl")
    for source in (out, tmp_path / "scan.jsonl"):
        result = CliRunner().invoke(main, ["fleet", str(source), "--html", str(tmp_path / "fleet.html")])
        assert result.exit_code == 1, result.output  # the scan found failures
        assert "Repeat-offender hosts" in result.output and "busy" in result.output
    assert "busy" in (tmp_path / "fleet.html").read_text(encoding="utf-8")


def test_fleet_command_refuses_a_table_that_is_not_a_scan(tmp_path: Path):
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "other.parquet")
    result = CliRunner().invoke(main, ["fleet", str(tmp_path / "other.parquet")])
    assert result.exit_code == 2 and "not a scan table" in result.output


# ---------------------------------------------------------------------------------------------
# Exit status, as the scan's; the terminal: names escaped, identifiers never cut.
# ---------------------------------------------------------------------------------------------


def _fleet(tmp_path: Path, rows: list[dict]):
    path = tmp_path / "scan.parquet"
    rows_frame(rows).write_parquet(path)
    return CliRunner().invoke(main, ["fleet", str(path)])


def test_fleet_exit_status_follows_what_the_scan_found(tmp_path: Path):
    ok, bad = healthy("/n/ok", hosts=["a"]), failed("/n/bad", "nccl_timeout", 0.9, hosts=["a"])
    crash = {"job": "/n/crash", "status": STATUS_CRASHED, "error": "TypeError: x"}
    slow = {"job": "/n/slow", "status": STATUS_TIMED_OUT, "error": "time limit"}
    unreadable = {"job": "/n/u", "status": STATUS_CANNOT_ANALYSE, "error": "no training logs found"}
    assert _fleet(tmp_path, [ok, slow, unreadable]).exit_code == 0  # no failure found
    assert _fleet(tmp_path, [ok, bad, crash]).exit_code == 1  # a failure identified
    assert _fleet(tmp_path, []).exit_code == 2  # nothing in the scan
    result = _fleet(tmp_path, [ok, crash])  # the analyzer's own fault is never "no failure"
    assert result.exit_code == 3 and "1 crashed the analyzer" in result.output


HOSTILE_NAMES = {
    "osc52": "job-\x1b]52;c;cm0gLXJmIH4=\x07",  # writes the clipboard
    "csi": "job-\x1b[2J\x1b[31mred",  # clears the screen
    "osc0": "job-\x1b]0;owned\x07",  # sets the window title
    "c1": "job-\x9b31m-\x9d0;t\x9c",  # 8-bit CSI / OSC / ST
    "bidi": "job-\u202egol.hcet",  # reads backwards
    "isolate": "job-\u2066x\u2069",
}


def test_hostile_directory_names_are_printed_escaped_never_raw(tmp_path: Path):
    rows = [{"job": f"/n/{name}", "status": STATUS_TIMED_OUT, "error": f"err {name}"} for name in HOSTILE_NAMES.values()]
    rows.append(failed("/n/x", "nccl_timeout", 0.9, hosts=["\x1b]52;c;aGk=\x07host"]))
    result = _fleet(tmp_path, rows)
    for raw in ("\x1b", "\x07", "\x9b", "\x9d", "\x9c", "\u202e", "\u2066", "\u2069"):
        assert raw not in result.output
    assert "/n/job-\\x1b]52;c;cm0gLXJmIH4=\\x07" in result.output
    assert "/n/job-\\u202egol.hcet" in result.output and "\\x9b31m" in result.output
    assert "\\x1b]52;c;aGk=\\x07host" in result.output


def test_scan_prints_hostile_job_names_escaped(tmp_path: Path):
    log = "node-1:4021:4021 NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    for name in HOSTILE_NAMES.values():
        (tmp_path / "night" / name).mkdir(parents=True)
        (tmp_path / "night" / name / "rank0.log").write_text(log)
    (tmp_path / "night" / "\x1b]0;notes\x07").mkdir()
    (tmp_path / "night" / "\x1b]0;notes\x07" / "README").write_text("nothing to see\n")
    result = CliRunner().invoke(main, ["scan", str(tmp_path / "night"), "--out", str(tmp_path / "s.parquet"),
                                       "--no-cache", "--job-timeout", "0.001"])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\u2066"):
        assert raw not in result.output
    assert "night/job-\\x1b[2J\\x1b[31mred" in result.output  # a timed-out job's row
    assert "night/\\x1b]0;notes\\x07 (README)" in result.output  # a folder that is not a job


LONG_CATEGORY = "duplicate_gpu_or_cuda_visible_devices"
LONG_RULE = "nccl-connect-to-unroutable-address"


def _long_ids_table() -> pl.DataFrame:
    rows = [
        failed(f"/n/j{i}", LONG_CATEGORY if i % 2 else "network_unreachable_or_firewall", 0.8,
               hosts=[f"gpu-node-{i:03d}.cluster.example.org"], gpus=[f"gpu-node-{i:03d}.cluster.example.org/gpu7"],
               rule=LONG_RULE if i % 2 else "hang-rank-stuck-outside-collective")
        for i in range(6)
    ]
    return rows_frame(rows)


def _identifiers(view) -> set[str]:
    return {*view.hosts.get_column("host"), *view.gpus.get_column("gpu"), *view.signatures.get_column("rule_id"),
            *view.signatures.get_column("category")}


@pytest.mark.parametrize("width", [80, 60, 120])
def test_tables_in_a_narrow_terminal_never_cut_an_identifier(width: int):
    view = fleet_view(_long_ids_table())
    buffer = io.StringIO()
    print_fleet_summary(view, Console(file=buffer, width=width, force_terminal=True, color_system=None), top=10)
    lines = buffer.getvalue().splitlines()
    for identifier in _identifiers(view):
        assert any(identifier in line for line in lines), (identifier, buffer.getvalue())
    table_lines = [line for line in lines if "│" in line or "─" in line or line.startswith("  ")]
    assert all(len(line) <= width for line in table_lines)


def test_piped_summary_is_not_wrapped(tmp_path: Path):
    long_error = "no training logs found: " + "x" * 200
    rows = [*(_long_ids_table().to_dicts()), {"job": "/n/" + "d" * 150, "status": STATUS_CANNOT_ANALYSE, "error": long_error}]
    result = _fleet(tmp_path, rows)  # CliRunner's output is not a terminal, like a pipe
    assert f"cannot_analyse /n/{'d' * 150}: {long_error}" in result.output.splitlines()


LONG_JOB = "/lustre/scratch/" + "/".join(f"team-{i:02d}-pretraining-run-with-a-long-descriptive-name" for i in range(6)) + \
    "/slurm-1234567-" + "x" * 120


def long_path_table() -> pl.DataFrame:
    return rows_frame([
        failed(LONG_JOB, "nccl_timeout", 0.8, hosts=["node-a"]),
        {"job": LONG_JOB + "-retry", "status": STATUS_TIMED_OUT, "error": "the analysis did not finish"},
    ])


def test_long_job_paths_wrap_inside_their_cells():
    page = render_fleet_html(fleet_view(long_path_table()))
    # Break opportunities after every separator, and anywhere inside a run with none (the x's).
    assert "/<wbr>team-00-pretraining-run-with-a-long-descriptive-name/<wbr>team-01" in page
    assert LONG_JOB in page.replace("/<wbr>", "/")  # nothing else inserted
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "td{overflow-wrap:anywhere}" in style and ".path{overflow-wrap:anywhere" in style
    assert "white-space:nowrap" not in style
