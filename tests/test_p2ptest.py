"""The CUDA samples' peer-to-peer tests (analyzer/parse/p2ptest.py, analysis "p2p_test"): outputs
written between ordinary lines, each finding with a healthy counterpart that must stay silent.
The outputs are made up in the samples' printf formats (NVIDIA/cuda-samples)."""

from pathlib import Path

from analyzer.api import analyze

BEFORE = ["$ ./p2pBandwidthLatencyTest", "checking the GPUs of gpu-node-3 before the rerun"]
AFTER = ["$ nvidia-smi -L"]

HEAD = [
    "[P2P (Peer-to-Peer) GPU Bandwidth Latency Test]",
    "Device: 0, NVIDIA RTX A6000, pciBusID: 1, pciDeviceID: 0, pciDomainID:0",
    "Device: 1, NVIDIA RTX A6000, pciBusID: 41, pciDeviceID: 0, pciDomainID:0",
    "Device=0 CAN Access Peer Device=1",
    "Device=1 CAN Access Peer Device=0",
    "",
    "***NOTE: In case a device doesn't have P2P access to other one, it falls back to normal memcopy procedure.",
    "So you can see lesser Bandwidth (GB/s) and unstable Latency (us) in those cases.",
    "",
    "P2P Connectivity Matrix",
    "     D\\D     0     1",
    "     0\t     1     1",
    "     1\t     1     1",
]


def _matrix(title: str, rows: list[str]) -> list[str]:
    return [title, "   D\\D     0      1 ", *rows]


def _bandwidth(enabled_off_diagonal: str) -> list[str]:
    return [
        *_matrix("Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)", ["     0 672.10  11.90 ", "     1  12.05 671.80 "]),
        *_matrix("Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)",
                 [f"     0 672.40 {enabled_off_diagonal} ", f"     1 {enabled_off_diagonal} 672.00 "]),
    ]


END = ["", "NOTE: The CUDA Samples are not meant for performance measurements. Results may vary when GPU Boost is enabled."]


def report(tmp_path: Path, lines: list[str], name: str = "p2p.txt") -> dict:
    (tmp_path / name).write_text("\n".join([*BEFORE, *lines, *AFTER]) + "\n")
    return analyze(str(tmp_path)).report


def rules_of(rep: dict) -> set[str]:
    return {f["rule_id"] for f in rep["findings"]}


def test_a_complete_healthy_output_is_read_and_clean(tmp_path):
    rep = report(tmp_path, [*HEAD, *_bandwidth(" 52.70"), *END])
    assert rep["verdict"]["category"] == "none"
    assert rep["inputs"][0]["format"] == "p2p_test"
    assert rep["findings"] == []


def test_peer_copies_far_below_the_staged_copy_are_a_broken_peer_path(tmp_path):
    rep = report(tmp_path, [*HEAD, *_bandwidth("  1.90"), *END])
    verdict = rep["verdict"]
    assert verdict["rule_id"] == "p2ptest-peer-bandwidth-collapsed"
    assert verdict["category"] == "p2p_nvlink_or_pcie_error"
    assert "GPU0->GPU1 1.9 vs 11.9 GB/s" in verdict["summary"]


def test_a_pair_the_runtime_denies_peer_access_is_not_judged(tmp_path):
    head = [line.replace("CAN Access", "CANNOT Access") for line in HEAD]
    rep = report(tmp_path, [*head, *_bandwidth("  1.90"), *END])
    assert "p2ptest-peer-bandwidth-collapsed" not in rules_of(rep)


def test_output_ending_after_a_matrix_title_stalled_in_that_measurement(tmp_path):
    cut = [*HEAD, *_bandwidth(" 52.70")[:4], "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)"]
    (tmp_path / "p2p.txt").write_text("\n".join([*BEFORE, *cut]) + "\n")
    verdict = analyze(str(tmp_path)).report["verdict"]
    assert verdict["rule_id"] == "p2ptest-stalled-in-measurement"
    assert "P2P=Enabled Bandwidth (P2P Writes)" in verdict["summary"]


def test_output_ending_on_a_cuda_failure_is_the_failure_not_a_stall(tmp_path):
    cut = [*HEAD, "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)",
           "Cuda failure p2pBandwidthLatencyTest.cu:230: 'peer access is not supported between these two devices'"]
    rep = report(tmp_path, cut)
    assert "p2ptest-stalled-in-measurement" not in rules_of(rep)
    assert rep["verdict"]["category"] != "none"


def test_simple_p2p_verification_errors_are_corrupted_peer_traffic(tmp_path):
    lines = [
        "[./simpleP2P] - Starting...", "Checking for multiple GPUs...", "CUDA-capable device count: 2",
        "> Peer access from Tesla V100-SXM2-16GB (GPU0) -> Tesla V100-SXM2-16GB (GPU1) : Yes",
        "cudaMemcpyPeer / cudaMemcpy between GPU0 and GPU1: 0.81GB/s",
        "Verification error @ element 0: val = nan, ref = 0.000000",
        "Verification error @ element 1: val = nan, ref = 4.000000",
        "Disabling peer access...", "Shutting down...", "Test failed!",
    ]
    verdict = report(tmp_path, lines)["verdict"]
    assert verdict["rule_id"] == "p2ptest-verification-failed"
    assert "2 Verification error line(s)" in verdict["summary"]


def test_simple_p2p_that_passed_is_clean(tmp_path):
    lines = [
        "[./simpleP2P] - Starting...", "Checking for multiple GPUs...", "CUDA-capable device count: 2",
        "> Peer access from Tesla V100-SXM2-16GB (GPU0) -> Tesla V100-SXM2-16GB (GPU1) : Yes",
        "cudaMemcpyPeer / cudaMemcpy between GPU0 and GPU1: 22.41GB/s",
        "Disabling peer access...", "Shutting down...", "Test passed",
    ]
    rep = report(tmp_path, lines)
    assert rep["verdict"]["category"] == "none"
    assert rep["inputs"][0]["format"] == "p2p_test"
