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


# --- the sizes of a CUDA OOM on lines of their own -----------------------------------------------------

def oom(tmp_path: Path, allocated: str, unallocated: str) -> dict:
    return job(tmp_path, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.",
                          "GPU has 39.39 GiB total, 1.02 GiB free.",
                          f"PyTorch allocated: {allocated}",
                          f"Reserved but unallocated: {unallocated}"])


def findings_of(report: dict) -> set[str]:
    return {f["rule_id"] for f in report["findings"]}


def test_multi_line_oom_sizes_with_a_large_idle_reserve_are_fragmentation(tmp_path):
    report = oom(tmp_path, "24.10 GiB", "12.80 GiB")
    assert report["verdict"]["category"] == "fragmented_memory"
    assert "12.80 GiB" in report["verdict"]["summary"]


def test_multi_line_oom_sizes_with_a_small_idle_reserve_stay_an_oom(tmp_path):
    report = oom(tmp_path, "36.20 GiB", "1.60 GiB")  # 4% of the reserve idle: the model's need explains it
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"
    assert "memory-oom-reserved-unallocated" in findings_of(report)


def test_size_lines_below_no_oom_line_are_no_finding(tmp_path):
    report = job(tmp_path, ["GPU has 39.39 GiB total, 1.02 GiB free.", "PyTorch allocated: 24.10 GiB",
                            "Reserved but unallocated: 12.80 GiB"])
    assert report["verdict"]["category"] == "none"


# --- gdb backtraces as stacks ----------------------------------------------------------------------

GDB_STORE_WAIT = """(gdb) bt
#0  __libc_recv (fd=41, buf=0x7f2a10001000, len=8, flags=0) at ../sysdeps/unix/sysv/linux/recv.c:28
#1  0x00007f2b3c1a2e40 in void c10d::tcputil::recvBytes<unsigned long>(int, unsigned long*, unsigned long) () from /venv/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so
#2  0x00007f2b3c1a1b2d in c10d::TCPStore::doWait(c10::ArrayRef<std::string>, std::chrono::duration<long, std::ratio<1l, 1000l> >) ()
   from /venv/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so
#3  0x00007f2b3c19f0aa in c10d::TCPStore::get(std::string const&) () from /venv/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so
#4  0x00007f2b4a0c1d52 in _PyEval_EvalFrameDefault () from /usr/lib/libpython3.10.so.1.0
"""


def test_a_gdb_backtrace_becomes_a_stack_of_named_frames(tmp_path):
    from analyzer.io import discover
    from analyzer.parse import parse_input

    (tmp_path / "rank2-gdb.txt").write_text(GDB_STORE_WAIT)
    (item,) = discover(tmp_path)
    assert item.format == "gdb_backtrace"
    (thread,) = parse_input(item).filter(kind="stack.thread").iter_rows(named=True)
    assert thread["rank"] == 2
    assert thread["detail"].split(" <- ")[:4] == [
        "__libc_recv (../sysdeps/unix/sysv/linux/recv.c:28)", "c10d::tcputil::recvBytes<unsigned long> (libtorch_cpu.so)",
        "c10d::TCPStore::doWait (libtorch_cpu.so)", "c10d::TCPStore::get (libtorch_cpu.so)"]


def test_thread_apply_all_bt_gives_one_stack_per_thread(tmp_path):
    from analyzer.io import discover
    from analyzer.parse import parse_input

    (tmp_path / "bt.txt").write_text(
        'Thread 2 (Thread 0x7f00aa (LWP 4242) "pt_watchdog"):\n'
        "#0  0x00007f2b in pthread_cond_timedwait@@GLIBC_2.3.2 () from /lib/x86_64-linux-gnu/libpthread.so.0\n"
        'Thread 1 (Thread 0x7f00bb (LWP 4240) "python"):\n'
        "#0  0x00007f2c in cudaStreamSynchronize () from /usr/local/cuda/lib64/libcudart.so.12\n"
        "#1  0x00007f2d in at::native::_local_scalar_dense_cuda(at::Tensor const&) () from /venv/torch/lib/libtorch_cuda.so\n")
    (item,) = discover(tmp_path)
    threads = parse_input(item).filter(kind="stack.thread").sort("line")
    assert threads.get_column("tid").to_list() == [4242, 4240]
    assert threads.get_column("message").to_list()[1].startswith('thread "MainThread" (gdb): cudaStreamSynchronize (libcudart.so.12)')


def test_a_rank_blocked_in_the_store_is_named(tmp_path):
    (tmp_path / "rank2-gdb.txt").write_text(GDB_STORE_WAIT)
    verdict = analyze(str(tmp_path)).report["verdict"]
    assert verdict["category"] == "other"
    assert verdict["rule_id"] == "stack-waits-on-rendezvous-store"
    assert "c10d::TCPStore::get" in verdict["summary"] or "TCPStore::doWait" in verdict["summary"]


def test_a_rank_in_its_training_step_is_no_store_wait(tmp_path):
    (tmp_path / "rank2-gdb.txt").write_text(
        "#0  0x00007f2c in cudaStreamSynchronize () from /usr/local/cuda/lib64/libcudart.so.12\n"
        "#1  0x00007f2d in at::native::_local_scalar_dense_cuda(at::Tensor const&) () from /venv/torch/lib/libtorch_cuda.so\n")
    assert analyze(str(tmp_path)).report["verdict"]["category"] == "none"


# --- communicators confined to one host each --------------------------------------------------------

def comm_lines(host: str, pid: int, members: list[tuple[int, int]], event: str = "Init COMPLETE") -> list[str]:
    return [f"{host}:{pid}:{pid} [{r}] NCCL INFO comm 0x55{host[-1]}{r}0 rank {r} nranks {n} cudaDev {r} busId {r}000 - {event}"
            for r, n in members]


def test_hosts_each_with_a_complete_world_of_their_own_are_named(tmp_path):
    report = job(tmp_path, [*comm_lines("gpu-a", 100, [(0, 2), (1, 2)]), "# Avg bus bandwidth    : 1.75",
                            *comm_lines("gpu-b", 200, [(0, 2), (1, 2)], "Destroy COMPLETE"), "# Avg bus bandwidth    : 1.68"])
    assert report["verdict"]["rule_id"] == "nccl-communicators-confined-to-hosts"
    assert report["verdict"]["category"] == "other"


def test_a_world_spanning_the_hosts_beside_intra_host_groups_is_no_finding(tmp_path):
    # tensor-parallel groups of 2 inside each host, and the 4-rank world across both hosts
    report = job(tmp_path, [*comm_lines("gpu-a", 100, [(0, 2), (1, 2), (0, 4), (1, 4)]),
                            *comm_lines("gpu-b", 200, [(0, 2), (1, 2), (2, 4), (3, 4)])])
    assert report["verdict"]["category"] == "none"


def test_a_single_host_job_is_no_finding(tmp_path):
    report = job(tmp_path, comm_lines("gpu-a", 100, [(0, 2), (1, 2)]))
    assert report["verdict"]["category"] == "none"


# --- an nvidia-smi topo -m matrix without NIC columns ------------------------------------------------

def test_a_gpu_only_topology_matrix_is_read_and_is_no_finding(tmp_path):
    (tmp_path / "topo.txt").write_text(
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV4\tSYS\tSYS\t0-15\t0\n"
        "GPU1\tNV4\t X \tSYS\tSYS\t0-15\t0\n"
        "GPU2\tSYS\tSYS\t X \tPHB\t16-31\t1\n"
        "GPU3\tSYS\tSYS\tPHB\t X \t16-31\t1\n")
    analysis = analyze(str(tmp_path))
    topology = analysis.events.filter(kind="node.topology")
    assert topology.height == 4 and topology.get_column("severity").unique().to_list() == ["info"]
    assert "GPU1 NV4" in topology.sort("line").get_column("message")[0]
    assert analysis.report["verdict"]["category"] == "none"
