"""Round 11 general fixes (GPU / PCIe / shared memory): the CUDA samples' `(error code %s)` form of every
CUDA runtime error, and the shared-memory segment that is missing (ENOENT) rather than too small."""

from pathlib import Path

import polars as pl

from analyzer.api import analyze
from tests.test_vocabulary import categories_mid_file, rows_of


def test_every_cuda_runtime_error_in_the_cuda_samples_form_is_its_rows_category(tmp_path):
    """The CUDA samples (vectorAdd, the GPU Operator's cuda-validator) print
    `Failed to ... (error code <cudaGetErrorString>)!`, with no `CUDA error` in front."""
    rows = rows_of("cuda-runtime").filter(pl.col("category") != "none").select("code", "message", "category").rows()
    lines = [f"Failed to allocate device vector A (error code {message})!" for _, message, _ in rows]
    got = categories_mid_file(tmp_path, lines)
    wrong = [(code, want, have) for (code, _, want), have in zip(rows, got)
             if have != want and not (want == "other" and have)]
    assert not wrong, wrong[:10]


def test_the_samples_form_does_not_take_an_unrelated_parenthesis(tmp_path):
    assert categories_mid_file(tmp_path, ["copied 12 files (error code unknown to us) and went on"]) == [None]


def report_of(tmp_path: Path, lines: list[str]) -> dict:
    (tmp_path / "rank0.log").write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


ATTACH_ENOENT = ("node-1:1200:1300 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
                 "/dev/shm/nccl-abc123 (size 9637888), error: No such file or directory (2)")


def test_a_shm_segment_that_does_not_exist_is_no_full_dev_shm(tmp_path):
    report = report_of(tmp_path, ["node-1:1200:1300 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory",
                                  ATTACH_ENOENT])
    assert report["verdict"]["rule_id"] == "nccl-shm-segment-missing"
    assert report["verdict"]["category"] == "other"


def test_the_pre_2_22_attach_pair_is_the_missing_segment(tmp_path):
    report = report_of(tmp_path, ["node-1:1200:1300 [0] include/shm.h:28 NCCL WARN Call to open failed : No such file or directory",
                                  "node-1:1200:1300 [0] include/shm.h:48 NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-abc123 (size 9637888)"])
    assert report["verdict"]["rule_id"] == "nccl-shm-segment-missing"


def test_a_segment_that_could_not_be_created_stays_dev_shm_too_small(tmp_path):
    report = report_of(tmp_path, [
        "node-1:1200:1300 [0] misc/shmutils.cc:129 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-abc123 "
        "(size 9637888), error: No space left on device (28)",
        ATTACH_ENOENT])
    assert report["verdict"]["category"] == "shm_too_small"
