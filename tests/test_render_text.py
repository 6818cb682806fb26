"""The terminal report: the hosts that differ, the checkpoint audit, and escaping of log text."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from analyzer.api import analyze
from analyzer.render.text import render_text
from tests.driftgen import build as build_drift
from tests.test_render_html import HEALTHY, checkpoint_job, host_records


def text_report(report: dict, width: int = 160) -> str:
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=width, no_color=True, emoji=False, highlight=False))
    return buffer.getvalue()


def hosts_block(out: str) -> str:
    start = out.index("Hosts that differ")
    return out[start:out.index("Inputs (", start)]


def table_rows(block: str) -> dict[str, list[str]]:
    """First cell -> the other cells, for each body row of the first rich table in `block`."""
    rows: dict[str, list[str]] = {}
    first = None
    for line in block.splitlines():
        if line.startswith("\u2502"):
            cells = [c.strip() for c in line.strip("\u2502").split("\u2502")]
            if cells[0] or first is None:
                first = cells[0]
                rows[first] = cells[1:]
            else:  # a wrapped row goes on
                rows[first] = [f"{a} {b}".strip() for a, b in zip(rows[first], cells[1:])]
        elif line.startswith("\u2514"):
            break
    return rows


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    return lambda name: build_drift(name, root) if not (root / name).exists() else root / name


def test_odd_host_and_column_against_the_majority(drift):
    out = text_report(analyze(drift("nccl_version")).report)
    block = hosts_block(out)
    assert block.splitlines()[0].strip() == "Hosts that differ (1 of 2)"
    header = next(line for line in block.splitlines() if line.startswith("\u2503"))
    assert [c.strip() for c in header.strip("\u2503").split("\u2503")] == ["host", "NCCL"]  # only the column that differs
    rows = table_rows(block)
    assert rows == {"node-b": ["\u2260 2.27.7"], "most hosts": ["2.28.9 (even split)"]}
    assert "1 host(s) alike, not shown: node-a" in block
    assert out.index("Other findings") < out.index("Hosts that differ") < out.index("Inputs (")


def test_gpu_models_mark_both_gpu_columns_of_the_odd_host(drift):
    rows = table_rows(hosts_block(text_report(analyze(drift("gpu_models")).report)))
    assert rows == {"node-b": ["\u2260 Tesla V100-SXM2-32GB", "\u2260 32 GiB"], "most hosts": ["NVIDIA H200 (even split)", "140 GiB (even split)"]}


def test_no_hosts_table_when_the_hosts_are_alike(drift):
    out = text_report(analyze(drift("healthy")).report)
    assert "Hosts that differ" not in out and "alike" not in out


def test_duplicate_hostname_and_its_ranks(drift):
    block = hosts_block(text_report(analyze(drift("identical_hostnames")).report))
    rows = table_rows(block)
    assert rows["trainer duplicate name"] == ["\u2260 eth0:192.0.2.11, eth0:192.0.2.12"]
    assert "trainer: ranks disagree: rank 0 pid 646: NCCL_HOSTID=drift-node0; rank 1 pid 647: NCCL_HOSTID=drift-node1" in block


def test_thousands_of_hosts_stay_a_few_lines():
    report = analyze(HEALTHY).report
    records = host_records(4096, {1234: {"driver_version": "535.104.05"}, 77: {"nccl_version": "2.18.1"}})
    report = {**report, "job": {**report["job"], "host_facts": records}}
    block = hosts_block(text_report(report))
    assert table_rows(block) == {
        "gpu-00077": ["\u2260 2.18.1", "550.54.15"],
        "gpu-01234": ["2.21.5", "\u2260 535.104.05"],
        "most hosts": ["2.21.5", "550.54.15"],
    }
    assert "4094 host(s) alike, not shown: gpu-[00000-00076,00078-01233,01235-04095]" in block
    assert len(block.splitlines()) < 16


def test_markup_and_control_characters_in_host_facts_are_text():
    report = analyze(HEALTHY).report
    evil_host = "[bold red]evil[/bold red]\x1b]8;;http://x\x07"
    records = host_records(3, {0: {"host": evil_host, "nccl_version": "[link=http://x]2.18[/link]\x1b[2J"}})
    report = {**report, "job": {**report["job"], "host_facts": records}}
    out = text_report(report)
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold red]evil[/bold red]\\x1b]8;;http://x\\x07" in out
    assert "\u2260 [link=http://x]2.18[/link]\\x1b[2J" in out


def test_checkpoints_table_names_each_checkpoint_and_the_resume_point(tmp_path):
    report = analyze(checkpoint_job(tmp_path)).report
    out = text_report(report, width=200)
    start = out.index("Checkpoints (3): resume from ckpt/step_100.pt (step 100)")
    block = out[start:out.index("Inputs (", start)]
    rows = table_rows(block)
    assert list(rows) == ["ckpt/step_250", "ckpt/step_200.pt", "ckpt/step_100.pt"]
    assert rows["ckpt/step_250"][:2] == ["dcp", "250"]
    assert rows["ckpt/step_250"][2].startswith("no: 1 of 2 shard files listed in .metadata are missing: __1_0.distcp")
    assert rows["ckpt/step_250"][3] == "1 of 2 shards; missing __1_0.distcp; rank(s) 1 lack their shard"
    assert rows["ckpt/step_200.pt"][2].startswith("no: truncated") and rows["ckpt/step_200.pt"][4] == "no"
    assert rows["ckpt/step_100.pt"][2:] == ["yes", "every component an exact resume needs", "newest resumable (exact)"]


def test_no_checkpoint_table_without_checkpoints():
    out = text_report(analyze(HEALTHY).report)
    assert "Checkpoints" not in out
    assert re.search(r"Inputs \(\d+ files\)", out)


def test_c1_controls_and_bidi_overrides_are_shown_as_escapes():
    report = analyze(HEALTHY).report
    sneaky = "rank0\u202eexe.gol\u2066x\u2069\x9b2J\x85end\u200f\r.log"
    inputs = [{**report["inputs"][0], "file": sneaky, "reason": "csi\x1b[31mred\x1b[0m osc\x1b]0;title\x07"}]
    out = text_report({**report, "inputs": inputs})
    for raw in ("\u202e", "\u2066", "\u2069", "\x9b", "\x85", "\u200f", "\r", "\x1b", "\x07"):
        assert raw not in out, repr(raw)
    assert "rank0\\u202eexe.gol\\u2066x\\u2069\\x9b2J\\x85end\\u200f\\x0d.log" in out
    assert "csi\\x1b[31mred\\x1b[0m osc\\x1b]0;title\\x07" in out


def test_a_narrow_terminal_folds_file_names_instead_of_cutting_them():
    report = analyze(HEALTHY).report
    names = [f"cluster-a/experiment-with-a-long-descriptive-name/attempt_0/{rank}/stderr.log" for rank in range(3)]
    inputs = [{**report["inputs"][0], "file": name, "reason": "a reason long enough to need folding as well"}
              for name in names]
    out = text_report({**report, "inputs": inputs}, width=80)
    assert "\u2026" not in out
    body = [line for line in out[out.index("Inputs ("):].splitlines() if line.startswith("\u2502")]
    assert "".join(line.split("\u2502")[1].strip() for line in body) == "".join(names)  # folded, nothing lost
    assert max(len(line) for line in out.splitlines()) <= 80


def test_an_evidence_quote_with_a_newline_stays_on_its_file_line():
    # error.json messages hold the exception's whole text, newlines included
    report = analyze(HEALTHY).report
    quote = {"file": "logs/attempt_0/1/error.json", "line": 1, "text": "DistBackendError: NCCL error\nncclInvalidUsage: usage"}
    verdict = {**report["verdict"], "category": "other", "confidence": 0.5, "rule_id": "r", "evidence": [quote]}
    out = text_report({**report, "verdict": verdict})
    assert "logs/attempt_0/1/error.json:1  DistBackendError: NCCL error\\x0ancclInvalidUsage: usage" in out
    assert not any(line.startswith("ncclInvalidUsage") for line in out.splitlines())
