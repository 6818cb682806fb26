"""The general changes made for the misses of held-out round 14 (docs/heldout/round14-misses.md): each
tested on made-up lines between ordinary ones, with a silent counterpart, never on a case's text."""

from pathlib import Path

import pytest

from analyzer.api import analyze
from tests.test_vocabulary import ROWS, categories_mid_file

ORDINARY_BEFORE = ["starting the training loop", "step 10 loss 0.51"]
ORDINARY_AFTER = ["step 11 loss 0.50"]


def job(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> dict:
    (tmp_path / name).write_text("\n".join([*ORDINARY_BEFORE, *lines, *ORDINARY_AFTER]) + "\n")
    return analyze(str(tmp_path)).report


# --- a traceback cut before its exception line -------------------------------------------------------

CUT = [
    "[rank3]: Traceback (most recent call last):",
    '[rank3]:   File "/opt/app/train.py", line 88, in <module>',
    "[rank3]:     main()",
    '[rank3]:   File "/opt/app/train.py", line 61, in main',
    "[rank3]:     model = build(cfg)",
]


def test_a_traceback_without_its_exception_line_is_other_naming_its_rank(tmp_path):
    report = job(tmp_path, CUT)
    verdict = report["verdict"]
    assert verdict["category"] == "other"
    assert verdict["rule_id"] == "python-traceback-without-exception"
    assert verdict["culprit_ranks"] == [3]
    assert "Traceback (most recent call last)" in verdict["evidence"][0]["text"]


def test_a_bare_frame_is_read_not_refused(tmp_path):
    report = job(tmp_path, ['  File "/srv/lib/python3.11/site-packages/pkg/loader.py", line 412, in load',
                            "    state = State.from_json(path)"])
    assert report["verdict"]["rule_id"] == "python-traceback-without-exception"
    assert "loader.py" in report["verdict"]["evidence"][0]["text"]


def test_a_file_of_two_frame_lines_alone_is_a_failure_not_an_unknown_format(tmp_path):
    (tmp_path / "excerpt.txt").write_text('  File "/srv/app/run.py", line 9, in <module>\n    run()\n')
    assert analyze(str(tmp_path)).report["verdict"]["category"] == "other"


def test_a_complete_traceback_is_not_a_fragment(tmp_path):
    report = job(tmp_path, [*CUT, "[rank3]: ValueError: the config names no model"])
    assert report["verdict"]["rule_id"] != "python-traceback-without-exception"


def test_a_stack_printed_by_logging_stack_info_is_no_finding(tmp_path):
    report = job(tmp_path, ["Stack (most recent call last):",
                            '  File "/opt/app/train.py", line 88, in <module>',
                            "    main()",
                            '  File "/opt/app/train.py", line 40, in main',
                            "    log.info('checkpoint saved', stack_info=True)"])
    assert report["verdict"]["category"] == "none"


def test_a_warning_with_its_source_line_is_no_finding(tmp_path):
    # warnings.warn prints `file:line: Category: text` and the source line, never `File "..."` frames
    report = job(tmp_path, ["/opt/app/train.py:61: UserWarning: the learning rate scheduler was stepped before the optimizer",
                            "  warnings.warn("])
    assert report["verdict"]["category"] == "none"


def test_the_fragment_gives_way_to_any_other_finding(tmp_path):
    report = job(tmp_path, [*CUT, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], name="rank1.log")
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"


# --- NVIDIA Fabric Manager vocabulary ----------------------------------------------------------------

FABRIC_MANAGER = ROWS.filter(ROWS.get_column("file") == "fabric_manager.csv")


def test_fabric_manager_rows_name_their_source_and_versions():
    assert FABRIC_MANAGER.height >= 8
    for rid, source, versions in FABRIC_MANAGER.select("id", "source", "versions").rows():
        assert "Fabric Manager" in source and "/" in source, rid
        assert any(ch.isdigit() for ch in versions), rid


def test_fabric_manager_rows_mid_file_are_their_category(tmp_path):
    lines, want = zip(*FABRIC_MANAGER.select("test_line", "category").rows())
    assert categories_mid_file(tmp_path, list(lines)) == list(want)


# The `fabric manager ...`-prefixed refusal is also the known issue compat-fabric-manager-driver-mismatch
# (nccl_version_mismatch, with both versions read), which outranks the vocabulary row.
@pytest.mark.parametrize("line", [
    "NVIDIA GPU driver interface version 550.127.05 doesn't match with driver version 550.120. Please update with the matching NVIDIA driver package.",
    "NVIDIA GPU driver interface version 535.54.03 don't match with driver version 535.104.05",
])
def test_a_fabric_manager_version_refusal_is_a_fabric_fault(tmp_path, line):
    report = job(tmp_path, [line])
    assert report["verdict"]["category"] == "p2p_nvlink_or_pcie_error"


def test_a_running_fabric_manager_is_no_finding(tmp_path):
    report = job(tmp_path, ["nv-fabricmanager[2939]: Successfully configured all the available NVSwitches to route GPU NVLink traffic.",
                            "     Active: active (running) since Mon 2024-07-01 14:43:57 UTC; 5s ago"])
    assert report["verdict"]["category"] == "none"
