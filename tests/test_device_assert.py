"""A device-side assert is evidence of the kernel fault it caused, once per writer: CUDA prints its
`Assertion ... failed.` line for every faulting thread (line kind cuda.device_assert, collapsed on the
block and thread), so hundreds of them neither crowd the AcceleratorError out of the capped evidence
nor inflate the finding's line count."""

from analyzer.api import analyze

KERNEL = "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel"
CONDITION = 'Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"` failed.'


def assert_lines(threads: int) -> list[str]:
    return [f"[rank1]:{KERNEL}: block: [{t // 128},0,0], thread: [{t % 128},0,0] {CONDITION}" for t in range(threads)]


def test_hundreds_of_thread_asserts_are_one_evidence_line_beside_the_error(tmp_path):
    lines = ["step 1 loss 2.0", *assert_lines(300), "[rank1]: torch.AcceleratorError: CUDA error: device-side assert triggered",
             "[rank1]: Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.",
             "step 2 loss 1.9"]
    (tmp_path / "rank1.log").write_text("\n".join(lines) + "\n")
    verdict = analyze(str(tmp_path)).report["verdict"]
    assert (verdict["rule_id"], verdict["culprit_ranks"]) == ("cuda-kernel-fault-on-rank", [1])
    texts = [e["text"] for e in verdict["evidence"]]
    asserts = [t for t in texts if "Assertion `" in t]
    assert len(asserts) == 1 and "thread: [0,0,0]" in asserts[0] and KERNEL in asserts[0]
    assert any("device-side assert triggered" in t for t in texts)


def test_a_host_assert_is_no_kernel_fault(tmp_path):
    (tmp_path / "rank0.log").write_text("step 1 loss 2.0\npython: train.py:40: main: Assertion `x > 0' failed.\nstep 2 loss 1.9\n")
    report = analyze(str(tmp_path)).report
    assert not [f for f in report["findings"] if f["rule_id"] == "cuda-kernel-fault-on-rank"]
