"""The CLI contract: exit codes, JSON validated against the shipped schema, bad inputs never traceback."""

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from analyzer.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
CASE = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
HEALTHY = ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_text_verdict_with_evidence():
    result = run("analyze", CASE)
    assert result.exit_code == 1
    assert "VERDICT: rank_absent_from_collective" in result.output
    assert "stderr.log:3" in result.output


@pytest.mark.parametrize("job", sorted((ROOT / "fixtures").glob("*/*/job")), ids=lambda p: p.parent.name)
def test_json_validates_against_schema(job):
    result = run("analyze", job, "--format", "json")
    assert result.exit_code in (0, 1)
    report = json.loads(result.output)
    jsonschema.validate(report, SCHEMA)
    assert (report["verdict"]["category"] == "none") == (result.exit_code == 0)


def test_json_is_deterministic():
    assert run("analyze", CASE, "--format", "json").output == run("analyze", CASE, "--format", "json").output


def test_healthy_exits_zero():
    assert run("analyze", HEALTHY).exit_code == 0


def test_missing_path_exits_two():
    result = run("analyze", "/no/such/job")
    assert result.exit_code == 2
    assert "no such file or directory" in result.output


def test_empty_directory_exits_two(tmp_path):
    result = run("analyze", tmp_path)
    assert result.exit_code == 2
    assert "holds no files" in result.output


def test_binary_only_exits_two(tmp_path):
    (tmp_path / "core").write_bytes(bytes(range(256)) * 400)
    result = run("analyze", tmp_path)
    assert result.exit_code == 2
    assert "binary" in result.output


def test_truncated_gzip_is_a_partial_report(tmp_path):
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    (tmp_path / "good.log").write_bytes(log)
    (tmp_path / "cut.log.gz").write_bytes(gzip.compress(log * 50)[:300])
    result = run("analyze", tmp_path, "--format", "json")
    assert result.exit_code == 1
    inputs = {i["file"]: i for i in json.loads(result.output)["inputs"]}
    assert inputs["cut.log.gz"]["status"] == "error"
    assert inputs["cut.log.gz"]["reason"]


def test_gzip_log_is_read(tmp_path):
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    (tmp_path / "rank0.log.gz").write_bytes(gzip.compress(log))
    report = json.loads(run("analyze", tmp_path, "--format", "json").output)
    assert report["inputs"][0]["status"] == "parsed"
    assert report["findings"]


def test_huge_single_line_is_bounded(tmp_path):
    (tmp_path / "one.log").write_bytes(b"x" * (50 << 20))
    result = run("analyze", tmp_path, "--format", "json")
    assert result.exit_code in (0, 2)
    if result.exit_code == 0:
        inputs = json.loads(result.output)["inputs"]
        assert inputs[0]["status"] in ("partial", "parsed")


def test_rules_list_and_explain():
    listing = run("rules", "list")
    assert listing.exit_code == 0 and "nccl-duplicate-gpu" in listing.output
    explained = run("rules", "explain", "nccl-duplicate-gpu")
    assert explained.exit_code == 0 and "set_device" in explained.output
    assert run("rules", "explain", "no-such-rule").exit_code == 2


def test_rules_test_command_passes():
    result = run("rules", "test")
    assert result.exit_code == 0, result.output


def test_every_command_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for command in ("analyze", "rules list", "rules explain", "rules test"):
        assert f"postmortem {command}" in readme


def test_host_pid_text_is_not_turned_into_emoji(tmp_path):
    (tmp_path / "x.log").write_text("host-a:100:107 [0] misc/socket.cc:1 NCCL WARN socketStartConnect: Connect to 10.0.0.2<4576> failed : Connection refused\n")
    result = run("analyze", tmp_path)
    assert "\U0001f4af" not in result.output
    assert "host-a:100:107" in result.output
