"""mpirun's non-zero-exit notice and the rank its `Process name:` line names (vocabulary row
mpi/nonzero-exit-first-process, line kind mpirun.process_name, analysis mpirun_first_nonzero_exit):
made-up job logs in the help text's layout, between ordinary lines, with counterparts that must not
name a rank."""

from pathlib import Path

from analyzer.api import analyze

BEFORE = ["epoch 3 step 1200 loss 1.92", "epoch 3 step 1210 loss 1.90"]
AFTER = ["[gpu-node-07:81234] 3 more processes have sent help message help-mpi-api.txt / mpi-abort"]


def notice(name: str) -> list[str]:
    return [
        "--------------------------------------------------------------------------",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "the job to be terminated. The first process to do so was:",
        "",
        f"  Process name: {name}",
        "  Exit code:    1",
        "--------------------------------------------------------------------------",
    ]


def report(tmp_path: Path, lines: list[str]) -> dict:
    (tmp_path / "mpirun.log").write_text("\n".join([*BEFORE, *lines, *AFTER]) + "\n")
    return analyze(str(tmp_path)).report


def test_the_first_process_to_exit_is_the_culprit_rank(tmp_path):
    verdict = report(tmp_path, notice("[[40960,1],3]"))["verdict"]
    assert verdict["rule_id"] == "mpirun-first-process-nonzero-exit"
    assert verdict["culprit_ranks"] == [3]


def test_prrte_names_the_rank_after_its_namespace(tmp_path):
    verdict = report(tmp_path, notice("[prterun-gpu-node-07-81234@1,5]"))["verdict"]
    assert verdict["culprit_ranks"] == [5]


def test_a_process_name_under_another_notice_names_no_culprit(tmp_path):
    lines = [
        "mpirun failed to receive scheduled heartbeat communications from a remote",
        "process:",
        "",
        "  Process name: [[40960,1],6]",
        "  Node:         gpu-node-09",
    ]
    rep = report(tmp_path, lines)
    assert all(f["rule_id"] != "mpirun-first-process-nonzero-exit" for f in rep["findings"])
    assert 6 not in rep["verdict"]["culprit_ranks"]


def test_a_specific_signature_keeps_the_verdict(tmp_path):
    lines = ["gpu-node-07:81234:81290 [0] NCCL INFO comm 0x5581 rank 3 nranks 8 cudaDev 3 busId 4f000 - Init COMPLETE",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity; 76.10 GiB already allocated)",
             *notice("[[40960,1],3]")]
    rep = report(tmp_path, lines)
    assert rep["verdict"]["category"] == "cuda_oom_on_some_ranks"
