"""The general changes made for the misses of held-out round 17 (docs/heldout/round17-misses.md): each
tested on made-up lines between ordinary ones, with a counterpart that keeps the old reading, never on a
case's text."""

from pathlib import Path

from analyzer.api import analyze

ORDINARY_BEFORE = ["starting the training loop", "step 10 loss 0.51"]
ORDINARY_AFTER = ["step 11 loss 0.50"]


def job(tmp_path: Path, lines: list[str], name: str = "train.log") -> dict:
    (tmp_path / name).write_text("\n".join([*ORDINARY_BEFORE, *lines, *ORDINARY_AFTER]) + "\n")
    return analyze(str(tmp_path)).report


def test_an_exception_raised_under_the_base_class_name_is_read(tmp_path):
    verdict = job(tmp_path, ["Exception: process 3 terminated with signal SIGKILL"])["verdict"]
    assert verdict["category"] == "host_oom_or_killed"
    assert verdict["rule_id"] == "worker-killed-sigkill-raised"


def test_a_base_class_exception_of_another_kind_is_an_uncaught_exception(tmp_path):
    verdict = job(tmp_path, ["Exception: the tokenizer file is missing"])["verdict"]
    assert verdict["category"] == "other"
    assert "the tokenizer file is missing" in verdict["evidence"][0]["text"]


def watchdog(timeout_ms: int) -> str:
    return ("[E ProcessGroupNCCL.cpp:467] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5120, "
            f"OpType=ALLGATHER, NumelIn=2048, NumelOut=4096, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 700} "
            "milliseconds before timing out.")


def test_one_ranks_timeout_under_a_short_configured_timeout_is_the_timeout_not_a_divergence(tmp_path):
    verdict = job(tmp_path, [watchdog(45_000)])["verdict"]
    assert verdict["category"] == "nccl_timeout"


def test_one_ranks_timeout_under_the_default_timeout_still_reads_as_a_divergence(tmp_path):
    verdict = job(tmp_path, [watchdog(1_800_000)])["verdict"]
    assert verdict["category"] == "collective_mismatch"
    assert verdict["rule_id"] == "hang-data-collective-diverged"


def test_a_log_of_python_warnings_alone_is_read_and_clean(tmp_path):
    (tmp_path / "train.log").write_text(
        "/opt/env/lib/python3.11/site-packages/lightning/trainer/result.py:212: It is recommended to log this metric on epoch level\n"
        "/opt/env/lib/python3.11/site-packages/torch/nn/modules/module.py:1501: UserWarning: the parameter is deprecated\n")
    report = analyze(str(tmp_path)).report
    assert report["verdict"]["category"] == "none" and not report["findings"]
