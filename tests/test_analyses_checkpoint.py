"""The checkpoint_audit analysis through the whole pipeline: findings, verdicts, the report's
`checkpoints` table, the link to a disk error in the logs, and `--checkpoint`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import torch
from click.testing import CliRunner

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.rules import catalogue
from tests.accuracy import evaluate
from tests.test_checkpoints import dcp_two_ranks, deepspeed_tag, malicious_state, training_state

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
HEALTHY = ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"
TRAIN_LOG = "epoch 0 step 100 loss 2.31\nsaving checkpoint\nepoch 0 step 200 loss 2.05\n"
DISK_FULL = "OSError: [Errno 28] No space left on device: '/ckpt/step_300.pt'\n"


def _job(tmp_path: Path, log: str = TRAIN_LOG) -> Path:
    job = tmp_path / "job"
    (job / "ckpt").mkdir(parents=True)
    (job / "train.log").write_text(log)
    return job


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def complete(tmp_path):
    job = _job(tmp_path)
    torch.save(training_state(100), job / "ckpt" / "step_100.pt")
    return job


def truncated_newest(tmp_path):
    job = complete(tmp_path)
    torch.save(training_state(200), job / "ckpt" / "step_200.pt")
    _truncate(job / "ckpt" / "step_200.pt")
    return job


def without_rng_and_sampler(tmp_path):
    job = _job(tmp_path)
    torch.save(training_state(100, rng=False, sampler=False), job / "ckpt" / "step_100.pt")
    return job


def dcp_rank_shard_deleted(tmp_path):
    job = complete(tmp_path)
    dcp_two_ranks(job / "ckpt" / "step_250", 250)
    (job / "ckpt" / "step_250" / "__1_0.distcp").unlink()
    return job


def leftover_tmp(tmp_path):
    job = complete(tmp_path)
    torch.save(training_state(200), job / "ckpt" / "step_200.pt.tmp")
    return job


def malicious(tmp_path):
    job = complete(tmp_path)
    torch.save(malicious_state(tmp_path / "PWNED"), job / "ckpt" / "step_150.pt")
    return job


def disk_full_during_save(tmp_path):
    job = _job(tmp_path, TRAIN_LOG + DISK_FULL)
    torch.save(training_state(100), job / "ckpt" / "step_100.pt")
    torch.save(training_state(300), job / "ckpt" / "step_300.pt")
    _truncate(job / "ckpt" / "step_300.pt", 0.3)
    return job


# name -> (builder, rules that must fire, verdict category, verdict rule)
SCENARIOS = {
    "complete": (complete, set(), "none", None),
    "truncated-newest": (truncated_newest, {"checkpoint-file-corrupt"}, "checkpoint_corruption", "checkpoint-file-corrupt"),
    "no-rng-no-sampler": (without_rng_and_sampler, {"checkpoint-resume-inexact"}, "checkpoint_corruption",
                          "checkpoint-resume-inexact"),
    "dcp-shard-deleted": (dcp_rank_shard_deleted, {"checkpoint-shards-missing"}, "checkpoint_corruption",
                          "checkpoint-shards-missing"),
    "leftover-tmp": (leftover_tmp, {"checkpoint-save-interrupted"}, "checkpoint_corruption",
                     "checkpoint-save-interrupted"),
    "malicious-pickle": (malicious, {"checkpoint-unsafe-pickle"}, "checkpoint_corruption", "checkpoint-unsafe-pickle"),
    "disk-full-during-save": (disk_full_during_save, {"checkpoint-broken-by-disk-error", "disk-full-or-io-error"},
                              "disk_full_or_io", "disk-full-or-io-error"),
}
CHECKPOINT_RULES = {r.id for r in catalogue() if r.analysis == "checkpoint_audit"}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_finding_and_verdict(tmp_path, name):
    build, rules, category, verdict_rule = SCENARIOS[name]
    report = analyze(build(tmp_path)).report
    fired = {f["rule_id"] for f in report["findings"]}
    assert rules <= fired and fired & CHECKPOINT_RULES == rules & CHECKPOINT_RULES
    assert fired or not rules
    assert report["verdict"]["category"] == category
    assert report["verdict"]["rule_id"] == verdict_rule
    jsonschema.validate(report, SCHEMA)
    newest = [c["path"] for c in report["checkpoints"] if c["newest_resumable"]]
    assert newest == ["ckpt/step_100.pt"]
    for finding in report["findings"]:
        if finding["rule_id"] in CHECKPOINT_RULES - {"checkpoint-resume-inexact"}:
            assert "Resume from ckpt/step_100.pt (step 100)" in finding["summary"]


def test_every_checkpoint_rule_has_a_scenario():
    covered = set().union(*(rules for _, rules, _, _ in SCENARIOS.values()))
    assert CHECKPOINT_RULES <= covered, CHECKPOINT_RULES - covered


def test_disk_error_makes_the_broken_checkpoint_a_symptom(tmp_path):
    report = analyze(disk_full_during_save(tmp_path)).report
    by_rule = {f["rule_id"]: f for f in report["findings"]}
    assert report["findings"][0]["rule_id"] == "disk-full-or-io-error"
    linked = by_rule["checkpoint-broken-by-disk-error"]
    assert linked["caused_by"] == ["disk-full-or-io-error"]
    assert "ckpt/step_300.pt (step 300): truncated" in linked["summary"]
    assert "No space left on device" in linked["summary"]
    # its evidence is the disk error's line, shown once: under the verdict, which it explains
    assert [e["file"] for e in report["findings"][0]["evidence"]] == ["train.log"] and linked["evidence"] == []
    assert "checkpoint-file-corrupt" not in by_rule


def test_failed_resume_in_the_log_and_the_broken_file_agree(tmp_path):
    """Case 026's story with the checkpoint present: the log's load error and the file's audit."""
    log = (TRAIN_LOG + "Search for history checkpoints...\n"
           "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory\n")
    job = _job(tmp_path, log)
    torch.save(training_state(100), job / "ckpt" / "step_100.pt")
    torch.save(training_state(200), job / "ckpt" / "step_200.pt")
    _truncate(job / "ckpt" / "step_200.pt")
    report = analyze(job).report
    assert report["verdict"]["category"] == "checkpoint_corruption"
    by_rule = {f["rule_id"]: f for f in report["findings"]}
    assert {"checkpoint-unreadable", "checkpoint-file-corrupt"} <= set(by_rule)
    corrupt = by_rule["checkpoint-file-corrupt"]
    # The failed load, seen from the script, is evidence of both; it is shown once, under the verdict.
    cited = [(f["rule_id"], e["line"]) for f in report["findings"] for e in f["evidence"]]
    assert [line for _, line in cited].count(5) == 1 and (report["findings"][0]["rule_id"], 5) in cited
    assert "Resume from ckpt/step_100.pt (step 100)" in corrupt["summary"]


def test_dcp_finding_names_the_rank_whose_shard_is_missing(tmp_path):
    report = analyze(dcp_rank_shard_deleted(tmp_path)).report
    finding = next(f for f in report["findings"] if f["rule_id"] == "checkpoint-shards-missing")
    assert finding["ranks"] == [1]
    assert "__1_0.distcp" in finding["summary"]


def test_inexact_resume_is_a_warning_naming_what_is_missing(tmp_path):
    report = analyze(without_rng_and_sampler(tmp_path)).report
    (finding,) = report["findings"]
    assert finding["severity"] == "warning"
    assert "lacks rng_python, rng_numpy, rng_torch, data_position" in finding["summary"]


def test_inexact_resume_names_an_older_exact_checkpoint(tmp_path):
    job = without_rng_and_sampler(tmp_path)
    torch.save(training_state(50), job / "ckpt" / "step_50.pt")
    (finding,) = analyze(job).report["findings"]
    assert finding["summary"].endswith("ckpt/step_50.pt (step 50) is older but holds every component")


def test_malicious_checkpoint_via_cli_runs_nothing(tmp_path):
    job = malicious(tmp_path)
    result = CliRunner().invoke(main, ["analyze", str(job), "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 1
    assert not (tmp_path / "PWNED").exists()
    report = json.loads(result.output)
    evil = next(c for c in report["checkpoints"] if c["path"] == "ckpt/step_150.pt")
    assert evil["problem"] == "unsafe" and not evil["resumable"]


def test_healthy_job_with_a_complete_checkpoint_stays_silent(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(HEALTHY, job)
    torch.save(training_state(100), job / "model_step100.pt")
    result = CliRunner().invoke(main, ["analyze", str(job), "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0
    report = json.loads(result.output)
    assert report["findings"] == []
    (record,) = report["checkpoints"]
    # NCCL ran, so the job used GPUs: CUDA RNG state is part of an exact resume here, and present.
    assert record["newest_resumable"] and record["exact_resume"] and "rng_cuda" in record["components"]


def test_checkpoint_option_audits_a_path_outside_the_job(tmp_path):
    job = _job(tmp_path)
    store = deepspeed_tag(tmp_path / "store" / "global_step40", 40, dp=4, present=range(2))
    result = CliRunner().invoke(main, ["analyze", str(job), "--checkpoint", str(store), "--format", "json"],
                                catch_exceptions=False)
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["verdict"]["rule_id"] == "checkpoint-shards-missing"
    assert report["checkpoints"][0]["path"] == str(store)
    assert report["checkpoints"][0]["shards_present"] == 3 and report["checkpoints"][0]["shards_expected"] == 5


def test_job_without_checkpoints_reports_an_empty_table(tmp_path):
    report = analyze(_job(tmp_path)).report
    assert report["checkpoints"] == [] and report["findings"] == []


@pytest.mark.parametrize("case", ["026-dddd-trainer-truncated-ckpt-after-disk-full",
                                  "028-deepspeed-zero-shards-missing-no-shared-fs"])
def test_real_checkpoint_incidents_keep_their_verdict(case):
    result = evaluate(ROOT / "fixtures" / "cases" / case)
    assert result.category_ok, f"{case}: {result.category}"
