"""The aws-ofi-nccl table (vocabularies/aws_ofi_nccl.csv) and the NCCL rows read with the CUDA error they carry:
complete for the plugin's releases, the rows with a cause category right mid-file, and a plugin's line that names
the cause ranked over the NCCL error it makes Python raise."""

from pathlib import Path

import polars as pl

from analyzer.api import analyze
from analyzer.parse.vocabulary import vocabulary

ROWS = vocabulary().rows
OFI = ROWS.filter(pl.col("component") == "aws-ofi-nccl")
WARN = "ip-10-1-2-3:1929:1937 [0] {func}:100 NCCL WARN NET/OFI {text}"


def job(tmp_path: Path, lines: list[str]) -> dict:
    # ordinary lines before and after: a row must fire mid-file, not only as a file's last line
    before = ["ip-10-1-2-3:1929:1929 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
              "ip-10-1-2-3:1929:1929 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.2-aws"]
    after = ["ip-10-1-2-3:1929:1937 [0] NCCL INFO transport/net.cc:100 -> 2", "epoch 0 step 10 loss 0.5"]
    (tmp_path / "rank0.log").write_text("\n".join(before + lines + after) + "\n")
    return analyze(str(tmp_path)).report


def category_of(tmp_path: Path, line: str) -> str:
    return job(tmp_path, [line])["verdict"]["category"]


def test_every_plugin_warn_of_every_release_is_a_row():
    # 952 NCCL_OFI_WARN formats over v0.9-v1.21.1 and master; those whose text is only specifiers are left out
    assert OFI.height >= 900
    assert OFI.get_column("versions").str.contains("v0.9").any() and OFI.get_column("versions").str.contains("v1.21.1").any()
    assert OFI.get_column("pattern").str.starts_with("NET/OFI ").sum() >= OFI.height - 5  # continuation lines print bare


def test_no_provider_is_an_init_failure(tmp_path):
    line = WARN.format(func="nccl_net_ofi_rdma_init", text="OFI fi_getinfo() call failed: No data available")
    assert category_of(tmp_path, line) == "nccl_init_failure"


def test_cuda_memory_registration_refused_with_einval_is_the_libfabric_version(tmp_path):
    line = WARN.format(func="register_rail_mr_buffer", text="Unable to register memory (type = 2) for device 3. RC: -22, Error: Invalid argument")
    assert category_of(tmp_path, line) == "nccl_version_mismatch"


def test_another_registration_failure_names_no_cause(tmp_path):
    line = WARN.format(func="register_mr_buffers", text="Unable to register memory (type = 1) for device 0. RC: -12, Error: Cannot allocate memory")
    assert category_of(tmp_path, line) == "other"


def test_a_peer_address_the_plugin_cannot_insert_is_the_cause_of_the_internal_error(tmp_path):
    report = job(tmp_path, [WARN.format(func="nccl_net_ofi_sendrecv_connect", text="Unable to insert remote address into address vector for device 1. RC: -22"),
                            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                            "internal error - please report this issue to the NCCL developers, NCCL version 2.21.5",
                            "ncclInternalError: Internal check failed."])
    assert report["verdict"]["category"] == "network_unreachable_or_firewall"
    symptom = next(f for f in report["findings"] if f["rule_id"] == "nccl-internal-error-raised")
    assert symptom["caused_by"] == [report["verdict"]["rule_id"]]


def test_a_quoted_line_without_its_final_full_stop_still_matches(tmp_path):
    assert category_of(tmp_path, "NET/OFI Unable to insert remote address into address vector for device 1") == "network_unreachable_or_firewall"


def test_a_nccl_cuda_failure_saying_no_code_for_this_gpu_is_a_build_mismatch(tmp_path):
    for n, error in enumerate(["named symbol not found", "invalid device function", "no kernel image is available for execution on the device"]):
        (tmp_path / str(n)).mkdir()
        line = f"gpu-node-1:2336636:2336906 [0] enqueue.cc:58 NCCL WARN Cuda failure '{error}'"
        assert category_of(tmp_path / str(n), line) == "nccl_version_mismatch", error


def test_that_cuda_failure_beside_the_unhandled_cuda_error_it_raises_is_the_cause(tmp_path):
    report = job(tmp_path, ["[3] enqueue.cc:215 NCCL WARN Cuda failure 'invalid device function'",
                            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:31, unhandled cuda error, NCCL version 2.7.8"])
    assert report["verdict"]["category"] == "nccl_version_mismatch"


def test_another_nccl_cuda_failure_stays_without_a_cause(tmp_path):
    assert category_of(tmp_path, "gpu-node-1:2336636:2336906 [0] enqueue.cc:58 NCCL WARN Cuda failure 'invalid argument'") != "nccl_version_mismatch"
