"""The known-issue table: every entry fires on an affected stack with its symptom and stays silent on
the fixed one (`pytest -k ENTRY_ID` runs one), the loader's checks, the matcher, the README table."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import polars as pl
import pytest

from analyzer.analyses.known_issues import known_issues
from analyzer.facts.correlate import correlate
from analyzer.io import discover
from analyzer.knownissues import (
    KnownIssueError,
    affected,
    load,
    markdown_table,
    parse_range,
    stack_versions,
    version_key,
)
from analyzer.parse import parse_inputs
from analyzer.rules import rules_by_id

ROOT = Path(__file__).resolve().parents[1]
ISSUES = load()
HOST = "host1"


def stack_lines(stack: dict[str, str]) -> list[str]:
    """Log lines stating each component's version, as the job's own logs print them."""
    lines = []
    build = stack.get("nccl-cuda", "12.1")
    if "nccl" in stack or "nccl-cuda" in stack:
        lines.append(f"{HOST}:100:100 [0] NCCL INFO NCCL version {stack.get('nccl', '2.21.5')}+cuda{build}")
    if "cuda-driver-api" in stack:
        major, minor = stack["cuda-driver-api"].split(".")[:2]
        lines.append(f"{HOST}:100:100 [0] NCCL INFO cudaDriverVersion {int(major) * 1000 + int(minor) * 10}")
    if "pytorch" in stack:
        lines.append(f"PyTorch version: {stack['pytorch']}")
    if "cuda-runtime" in stack:
        lines.append(f"CUDA used to build PyTorch: {stack['cuda-runtime']}")
    if "fabric-manager" in stack:
        lines.append(f"nv-fabricmanager[3228]: fabric manager NVIDIA GPU driver interface version {stack['fabric-manager']} "
                     f"don't match with driver version {stack['cuda-driver']}. Please update with matching NVIDIA driver package.")
    elif "cuda-driver" in stack:
        lines.append(f"Driver Version                            : {stack['cuda-driver']}")
    if "aws-ofi-nccl" in stack:
        lines.append(f"{HOST}:100:100 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl {stack['aws-ofi-nccl']}")
    if "deepspeed" in stack:
        lines.append(f"[INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version={stack['deepspeed']}, git-hash=unknown")
    return lines


def symptom_lines(issue) -> list[str]:
    rule = rules_by_id()[issue.symptom.signatures[0]] if issue.symptom.signatures else None
    lines = list(issue.tests.get("lines") or [rule.tests["must_match"][0]])
    # One machine: the NCCL `host:pid:tid` prefixes of lines copied from other logs name it.
    return [re.sub(r"^[\w.\-]+:\d+:\d+ \[", f"{HOST}:100:101 [", line) for line in lines]


def run_job(lines: list[str]) -> pl.DataFrame:
    """The known-issue findings of a one-file job (py-spy dumps, which start with `Process N:`, go
    to a file of their own, as py-spy writes them)."""
    with tempfile.TemporaryDirectory(prefix="postmortem-ki-") as tmp:
        log = [line for line in lines if not line.startswith("Process ")]
        Path(tmp, "job.log").write_text("\n".join(log) + "\n", encoding="utf-8")
        for n, dump in enumerate(line for line in lines if line.startswith("Process ")):
            Path(tmp, f"rank{n}.pyspy.txt").write_text(dump + "\n", encoding="utf-8")
        inputs = discover(tmp)
        events, facts = correlate(parse_inputs(inputs), inputs)
    return known_issues(events, facts.context(events))


@pytest.mark.parametrize("issue", ISSUES, ids=[i.id for i in ISSUES])
def test_affected_stack_with_symptom_gives_the_finding(issue):
    found = run_job(stack_lines(issue.tests["affected"]) + symptom_lines(issue))
    mine = found.filter(pl.col("summary").str.contains(f"Known issue {issue.id}", literal=True))
    assert mine.height == 1, found.get_column("summary").to_list()
    assert mine.item(0, "rule_id") == issue.rule_id
    assert issue.fixed_in in mine.item(0, "summary") or issue.fixed_in == "none"


@pytest.mark.parametrize("issue", ISSUES, ids=[i.id for i in ISSUES])
def test_fixed_stack_gives_none(issue):
    found = run_job(stack_lines(issue.tests["fixed"]) + symptom_lines(issue))
    assert not found.get_column("summary").str.contains(f"Known issue {issue.id}", literal=True).any()


def test_affected_version_without_symptom_is_a_note_not_a_finding():
    found = run_job(stack_lines({"nccl": "2.18.1"}) + [f"{HOST}:100:100 [0] NCCL INFO Connected all rings"])
    assert found.height == 0


def test_the_table_is_big_and_every_entry_cites_a_source():
    assert len(ISSUES) >= 60
    assert all(issue.sources for issue in ISSUES)
    rules = rules_by_id()
    assert all(issue.rule_id in rules and rules[issue.rule_id].category == issue.category for issue in ISSUES)


def test_versions_order_numerically():
    assert version_key("2.18.10") > version_key("2.18.3") > version_key("2.18.1+cuda12.1")
    assert version_key("535.104.05") > version_key("535.54.03")
    assert version_key("cuda12.3") == version_key("12.3")
    assert parse_range("==2.7.0") == (version_key("2.7.0"), True, version_key("2.7.0"), True)
    with pytest.raises(ValueError):
        parse_range("~=2.1")
    with pytest.raises(ValueError):
        parse_range(">=2.5,<2.4")


def test_matching_a_stack_by_hand():
    hits = affected(stack_versions({"nccl": "2.18.1", "pytorch": "2.1.0"}))
    ids = set(hits.get_column("issue_id").to_list())
    assert {"nccl-2.18-shm-create-failure-crash", "pytorch-2.1-nccl-2.18.1-bugfix-release"} <= ids
    assert "nccl-2.19-cumem-alltoall-deadlock" not in ids
    assert affected(stack_versions({"nccl": "2.30.7"})).height == 0


def test_fabric_manager_mismatch_needs_both_versions_and_a_difference():
    mismatch = affected(stack_versions({"fabric-manager": "530.30.02", "cuda-driver": "530.41.03"}))
    assert "compat-fabric-manager-driver-mismatch" in mismatch.get_column("issue_id").to_list()
    assert affected(stack_versions({"fabric-manager": "530.41.03", "cuda-driver": "530.41.03"})).height == 0
    assert affected(stack_versions({"fabric-manager": "530.41.03"})).height == 0


@pytest.mark.parametrize("text,problem", [
    ('[[issue]]\nid = "x"\n', "missing required key"),
    ('[[issue]]\nid = "x"\nbogus = 1\n', "unknown keys"),
    ('[other]\n', "only [[issue]] tables"),
])
def test_loader_rejects_malformed_files(tmp_path, text, problem):
    (tmp_path / "bad.toml").write_text(text, encoding="utf-8")
    with pytest.raises(KnownIssueError, match=problem.replace("[", r"\[")):
        load.__wrapped__(str(tmp_path))


def test_loader_rejects_unknown_signature_and_generic_symptom_without_context(tmp_path):
    base = (ROOT / "known_issues" / "nccl.toml").read_text(encoding="utf-8")
    first = "[[issue]]" + base.split("[[issue]]")[2]  # nccl-2.7-sendrecv-false-mismatch
    (tmp_path / "a.toml").write_text(first.replace("nccl-mismatched-collective", "no-such-rule"), encoding="utf-8")
    with pytest.raises(KnownIssueError, match="not in rules"):
        load.__wrapped__(str(tmp_path))
    (tmp_path / "a.toml").write_text(first.replace("nccl-mismatched-collective", "watchdog-timeout"), encoding="utf-8")
    with pytest.raises(KnownIssueError, match="needs `context`"):
        load.__wrapped__(str(tmp_path))


def test_readme_table_is_generated_from_the_data():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- known-issues-table:start -->\n", "<!-- known-issues-table:end -->"
    assert start in readme and end in readme, "README lacks the known-issues table markers"
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "README table is stale: python -m analyzer.knownissues --markdown"


def test_host_facts_carry_the_note_and_json_names_it(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "log.txt").write_text("\n".join(stack_lines({"nccl": "2.18.1"}) + [f"{HOST}:100:100 [0] NCCL INFO Connected all rings"]) + "\n")
    from analyzer.api import analyze

    report = analyze(job).report
    assert report["findings"] == []
    notes = report["job"]["host_facts"][0]["known_issues"]
    assert {"nccl-2.18-shm-create-failure-crash"} <= {n["id"] for n in notes}
    assert all(n["severity"] == "info" and n["facts"] == ["nccl_version"] for n in notes)
    json.dumps(report)


def test_known_issues_command(tmp_path):
    from click.testing import CliRunner

    from analyzer.cli import main

    runner = CliRunner()
    listed = runner.invoke(main, ["known-issues", "--nccl", "2.18.1", "--torch", "2.3.0"])
    assert listed.exit_code == 1, listed.output
    assert "nccl-2.18-shm-create-failure-crash" in listed.output and "fixed in 2.18.3" in listed.output
    as_json = runner.invoke(main, ["known-issues", "--nccl", "2.18.1", "--format", "json"])
    assert {"nccl-2.18-shm-create-failure-crash"} <= {row["id"] for row in json.loads(as_json.output)["known_issues"]}
    assert runner.invoke(main, ["known-issues", "--nccl", "2.30.7"]).exit_code == 0
    assert runner.invoke(main, ["known-issues"]).exit_code == 2
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "postmortem known-issues" in readme


def test_the_known_issue_is_the_verdict_and_explains_the_symptom_finding(tmp_path):
    """NCCL built for CUDA 12.4 on a driver of CUDA 11.8: the compatibility entry is the cause, and
    the driver-too-old signature on the same line is its symptom (caused_by)."""
    from analyzer.api import analyze

    job = tmp_path / "job"
    job.mkdir()
    (job / "log.txt").write_text(
        f"{HOST}:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        f"{HOST}:100:100 [0] NCCL INFO cudaDriverVersion 11080\n"
        f"{HOST}:100:101 [0] enqueue.cc:43 NCCL WARN Cuda failure 35 'CUDA driver version is insufficient for CUDA runtime version'\n",
        encoding="utf-8",
    )
    report = analyze(job).report
    assert report["verdict"]["rule_id"] == "known-issue-nccl-version-mismatch"
    assert "compat-nccl-build-cuda-12-driver-api-below-12" in report["verdict"]["summary"]
    assert report["verdict"]["culprit_hosts"] == [HOST]
    symptom = next(f for f in report["findings"] if f["rule_id"] == "cuda-driver-too-old")
    assert symptom["caused_by"] == ["known-issue-nccl-version-mismatch"]
