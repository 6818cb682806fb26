"""The vocabularies of the job's other components (Slurm and PMIx, HIP / ROCr, Open MPI / PRRTE, UCX, libfabric / EFA,
Kubernetes, nvidia-container-cli, DCGM, DeepSpeed's launcher, Ray, torch.elastic): complete for the sources they name,
documented, and their cause rows recognised between ordinary lines as the category the text means."""

import re
from pathlib import Path

import polars as pl

from analyzer.api import analyze
from analyzer.parse.vocabulary import vocabulary
from tests.test_vocabulary import categories_mid_file

ROOT = Path(__file__).resolve().parent.parent / "vocabularies"
ROWS = vocabulary().rows
FILES = ("slurm.csv", "hip_runtime.csv", "open_mpi.csv", "ucx.csv", "libfabric.csv", "kubernetes.csv", "nvidia_container.csv",
         "dcgm.csv", "deepspeed.csv", "ray.csv", "torch_elastic.csv")


def of(file: str) -> pl.DataFrame:
    return ROWS.filter(pl.col("file") == file)


def test_every_vocabulary_file_has_its_readme_entry():
    readme = (ROOT / "README.md").read_text()
    for path in sorted(ROOT.glob("*.csv")):
        assert f"`{path.name}`" in readme, path.name


def test_each_component_file_names_its_source_and_versions():
    for file in FILES:
        rows = of(file)
        assert rows.height > 0, file
        for rid, source, versions in rows.select("id", "source", "versions").rows():
            assert "/" in source, (rid, source)  # a repository path or a documented header
            assert re.search(r"\d", versions), (rid, versions)


def test_hip_has_every_hiperror_of_the_header():
    codes = set(of("hip_runtime.csv").get_column("code"))
    assert len({c for c in codes if c.startswith("hipError")}) == 74  # hip_runtime_api.h, aliases folded into their primary code
    assert {"hipErrorIllegalAddress", "hipErrorNoBinaryForGpu", "hipErrorOutOfMemory", "hipErrorAssert", "hipErrorRuntimeOther"} <= codes


def test_ucx_and_libfabric_have_every_status_string():
    assert len([c for c in of("ucx.csv").get_column("code") if c.startswith("UCS_ERR_")]) == 26  # UCS_OK / UCS_INPROGRESS are no failure
    fi = of("libfabric.csv").get_column("code").to_list()
    assert len([c for c in fi if c.startswith("FI_E") and not c.startswith("FI_EFA_")]) == 16  # FI_EOTHER .. FI_EFIREWALLADDR
    assert {"EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE", "FI_EFA_ERR_PEER_ABORTED"} <= set(fi)
    assert len([c for c in fi if c.startswith(("EFA_IO_COMP_STATUS_", "FI_EFA_ERR_"))]) >= 45


def test_slurm_and_dcgm_families_are_covered():
    slurm = set(of("slurm.csv").get_column("id"))
    for family in ("slurm/cancelled-time-limit", "slurm/cancelled-node-failure", "slurm/oom-kill-event", "slurm/oom-kill-event-old",
                   "slurm/task-exit-code", "slurm/task-killed", "slurm/task-segfault", "slurm/socket-timed-out",
                   "slurm/controller-unreachable", "slurm/pmix-collective-timeout", "pmix/error-log"):
        assert family in slurm, family
    assert of("dcgm.csv").height >= 70


SLURM = [
    ("slurmstepd: error: *** JOB 4812209 ON gpu-node-17 CANCELLED AT 2024-06-02T03:14:07 DUE TO TIME LIMIT ***", "host_oom_or_killed"),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=30399.0. Some of the step tasks have been OOM Killed.", "host_oom_or_killed"),
    ("slurmstepd: error: Detected 2 oom-kill event(s) in StepId=812.batch cgroup. Some of your processes may have been killed by the cgroup out-of-memory handler.", "host_oom_or_killed"),
    ("srun: error: gpu-node-07: task 3: Out Of Memory", "host_oom_or_killed"),
    ("srun: error: gpu-node-07: tasks 0-3: Killed", "host_oom_or_killed"),
    ("srun: error: gpu-node-07: task 3: Exited with exit code 1", "other"),
    ("srun: error: gpu-node-07: task 5: Segmentation fault (core dumped)", "other"),
    ("srun: error: slurm_receive_msgs: [[gpu-node-3]:6818] failed: Socket timed out on send/recv operation", "other"),
]


def test_slurm_lines_mid_file(tmp_path):
    lines, want = zip(*SLURM)
    assert categories_mid_file(tmp_path, list(lines)) == list(want)


def test_an_exit_code_zero_is_no_failure(tmp_path):
    assert categories_mid_file(tmp_path, ["srun: gpu-node-07: task 0: Exited with exit code 0"]) == [None]


ROCM = [
    ("RuntimeError: HIP error: an illegal memory access was encountered", "rank_crash_exception_then_hang"),
    ("hipErrorNoBinaryForGpu: Unable to find code object for all current devices!", "nccl_version_mismatch"),
    ("Memory access fault by GPU node-1 (Agent handle: 0x556e9b7e3360) on address 0x7f52c3f5f000. Reason: Page not present or supervisor privilege.",
     "rank_crash_exception_then_hang"),
    ("HW Exception by GPU node-1 (Agent handle: 0x563e71f098b0) reason :GPU Hang", "gpu_hardware_xid"),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB of which 1.02 GiB is free.",
     "cuda_oom_on_some_ranks"),
    ("gpu-node-1:1234:1300 [0] NCCL WARN HIP failure 'invalid device ordinal' at /src/misc/rocmwrap.cc:120", "duplicate_gpu_or_cuda_visible_devices"),
]


def test_rocm_lines_mid_file_take_the_category_of_their_cuda_twin(tmp_path):
    lines, want = zip(*ROCM)
    assert categories_mid_file(tmp_path, list(lines)) == list(want)


NETWORK = [
    ("mpirun noticed that process rank 3 with PID 0 on node gpu-node-2 exited on signal 9 (Killed).", "host_oom_or_killed"),
    ("prterun noticed that process rank 0 with PID 4242 on node gpu-node-1 exited on signal 11 (Segmentation fault).", "other"),
    ("[gpu-node-1][[51488,1],3][btl_tcp_endpoint.c:625:mca_btl_tcp_endpoint_recv_connect_ack] received unexpected process identifier [[51488,1],0]",
     "wrong_network_interface"),
    ("WARNING: Open MPI failed to TCP connect to a peer MPI process.  This", "network_unreachable_or_firewall"),
    ("[1733000000.123456] [gpu-node-1:4242:0]      ib_mlx5_log.c:177  UCX  ERROR Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)",
     "ib_link_or_hca_error"),
    ("[1733000000.123456] [gpu-node-1:4242:0]      wireup.c:1100 UCX  ERROR failed: Destination is unreachable", "network_unreachable_or_firewall"),
    ("ip-10-1-2-3:1929:1937 [0] ofi_process_cq:100 NCCL WARN NET/OFI Request 0x7f0 completed with error. RC: 15. Error: 15 (Unreachable remote (never received a response))",
     "network_unreachable_or_firewall"),
    ("libfabric:17778:1732779731::efa:cq:efa_rdm_cq_readfrom():425<warn> Unreachable remote - never received a response", "network_unreachable_or_firewall"),
    # fi_strerror's generic text first, the provider's file after it (fi_eq_strerror / fi_cq_strerror output)
    ("Unable to read from CQ: Missing or unavailable completion queue. err: Invalid argument (22) prov_errno: Unknown error -5 (-5) prov/efa/src/rdm/efa_rdm_cq.c:88",
     "other"),
]


def test_mpi_ucx_and_libfabric_lines_mid_file(tmp_path):
    lines, want = zip(*NETWORK)
    assert categories_mid_file(tmp_path, list(lines)) == list(want)


def test_a_status_text_outside_its_component_is_not_taken_for_it(tmp_path):
    # UCX's and libfabric's generic texts need their component's context on the line
    assert categories_mid_file(tmp_path, ["copying shard 3: Out of memory", "Input/output error while reading the manifest"]) == [None, None]


CLUSTER = [
    ("      Reason:       OOMKilled", "host_oom_or_killed"),
    ("Message:        The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 2Gi.", "disk_full_or_io"),
    ("Message:        Pod was terminated in response to imminent node shutdown.", "host_oom_or_killed"),
    ("stderr: nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or use an earlier cuda container: unknown.",
     "nccl_version_mismatch"),
    ("stderr: nvidia-container-cli: device error: 3: unknown device: unknown.", "duplicate_gpu_or_cuda_visible_devices"),
    ("stderr: nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.", "gpu_hardware_xid"),
    ("Error: Detected 2 volatile double-bit ECC error(s) in GPU 3.", "gpu_hardware_xid"),
    ("Error: GPU 0's NvLink link 3 is currently down", "p2p_nvlink_or_pcie_error"),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.", "host_oom_or_killed"),
    ("RuntimeError: Unable to proceed, no GPU resources available", "duplicate_gpu_or_cuda_visible_devices"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError", "other"),
]


def test_cluster_and_launcher_lines_mid_file(tmp_path):
    lines, want = zip(*CLUSTER)
    assert categories_mid_file(tmp_path, list(lines)) == list(want)


def test_torchs_oom_is_not_rays():
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert not [rid for rid, pattern in of("ray.csv").select("id", "pattern").rows() if re.search(pattern, line)]


def job(tmp_path: Path, lines: list[str]) -> dict:
    (tmp_path / "slurm-4812209.out").write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


def test_a_job_whose_only_failure_is_a_task_exit_is_never_silent(tmp_path):
    report = job(tmp_path, ["srun: error: gpu-node-07: task 3: Exited with exit code 1"])
    assert report["verdict"]["category"] == "other"
    assert "Exited with exit code 1" in report["verdict"]["evidence"][0]["text"]


def test_a_time_limit_is_the_scheduler_not_the_gpu(tmp_path):
    report = job(tmp_path, ["slurmstepd: error: *** JOB 4812209 ON gpu-node-17 CANCELLED AT 2024-06-02T03:14:07 DUE TO TIME LIMIT ***"])
    assert report["verdict"]["category"] == "host_oom_or_killed"
