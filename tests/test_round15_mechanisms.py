"""The general changes made for the misses of held-out round 15 (docs/heldout/round15-misses.md): each
tested on made-up lines between ordinary ones, with a silent counterpart, never on a case's text."""

from pathlib import Path

from analyzer.api import analyze

ORDINARY_BEFORE = ["starting the training loop", "step 10 loss 0.51"]
ORDINARY_AFTER = ["step 11 loss 0.50"]

IPOIB_OOB = "gpu-7:310:420 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.20.0.7<0>"
IPOIB_BOOTSTRAP = "gpu-7:310:310 [1] NCCL INFO Bootstrap : Using [0]ibs3:10.20.0.7<0>"
ETH_BOOTSTRAP = "gpu-7:310:310 [1] NCCL INFO Bootstrap : Using [0]enp65s0:10.1.0.7<0>"
CHAIN = ["gpu-7:310:420 [1] NCCL INFO misc/socket.cc:540 -> 2", "gpu-7:310:420 [1] NCCL INFO bootstrap.cc:301 -> 2"]


def job(tmp_path: Path, lines: list[str], name: str = "rank1.log") -> dict:
    (tmp_path / name).write_text("\n".join([*ORDINARY_BEFORE, *lines, *ORDINARY_AFTER]) + "\n")
    return analyze(str(tmp_path)).report


def test_a_bootstrap_failure_over_an_ipoib_interface_is_the_interface(tmp_path):
    for i, head in enumerate((IPOIB_OOB, IPOIB_BOOTSTRAP)):
        (tmp_path / str(i)).mkdir()
        verdict = job(tmp_path / str(i), [head, *CHAIN])["verdict"]
        assert verdict["category"] == "wrong_network_interface"
        assert verdict["rule_id"] == "nccl-bootstrap-over-ipoib"
        assert verdict["culprit_hosts"] == ["gpu-7"]


def test_a_bootstrap_failure_over_ethernet_is_an_unexplained_nccl_failure_never_silent(tmp_path):
    verdict = job(tmp_path, [ETH_BOOTSTRAP, *CHAIN])["verdict"]
    assert verdict["category"] == "other"
    assert verdict["rule_id"] == "nccl-error-chain-unexplained"
    assert "misc/socket.cc:540 -> 2" in verdict["evidence"][0]["text"]


def test_an_ipoib_bootstrap_interface_in_a_run_that_did_not_fail_is_silent(tmp_path):
    report = job(tmp_path, [IPOIB_OOB, IPOIB_BOOTSTRAP, "gpu-7:310:420 [1] NCCL INFO comm 0x5d0 rank 1 nranks 2 - Init COMPLETE"])
    assert report["verdict"]["category"] == "none" and not report["findings"]


def test_a_missing_command_in_a_launcher_script_is_other_naming_it(tmp_path):
    lines = ["+ /usr/bin/helper exec worker-3 -- true", "/etc/mpi/agent.sh: 9: /usr/bin/helper: not found",
             "command terminated with exit code 127"]
    verdict = job(tmp_path, lines)["verdict"]
    assert verdict["category"] == "other"
    assert "/usr/bin/helper: not found" in verdict["evidence"][0]["text"]


def test_deepspeed_op_report_warnings_alone_are_read_and_clean(tmp_path):
    lines = ["DeepSpeed general environment info:",
             " [WARNING]  async_io requires the dev libaio .so object and headers but these were not found.",
             " [WARNING]  async_io: please install the libaio-dev package with apt",
             " [WARNING]  Please specify the CUTLASS repo directory as environment variable $CUTLASS_PATH"]
    report = job(tmp_path, lines)
    assert report["verdict"]["category"] == "none" and not report["findings"]


OLD_WATCHDOG = ("[E ProcessGroupNCCL.cpp:587] [Rank 3] Watchdog caught collective operation timeout: "
                "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800391 milliseconds before timing out.")
NEW_WATCHDOG = ("[E ProcessGroupNCCL.cpp:587] [Rank 3] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=5321, OpType=BROADCAST, NumelIn=4096, NumelOut=4096, Timeout(ms)=1800000) "
                "ran for 1800391 milliseconds before timing out.")


def test_one_ranks_old_watchdog_line_without_size_or_sequence_is_a_timeout_not_a_divergence(tmp_path):
    verdict = job(tmp_path, [OLD_WATCHDOG])["verdict"]
    assert verdict["category"] == "nccl_timeout"


def test_a_watchdog_line_with_its_sequence_number_mid_run_is_still_read_as_a_divergence(tmp_path):
    report = job(tmp_path, [NEW_WATCHDOG])
    assert "hang-data-collective-diverged" in {f["rule_id"] for f in report["findings"]}


RAY_MONITOR = ("(raylet) node_manager.cc:3040: 2 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
               "crashed due to other reasons at node (ID: 5f0c1e2d, IP: 10.4.0.21) over the last time period.")
RAY_TASK = ("(raylet) Task was killed due to the node running low on memory. "
            "Memory on the node (IP: 10.4.0.22, ID: 9a8b7c6d) where the task was running was 60.1GB / 62.0GB (0.97).")
RAY_NO_NODE = "(raylet) 1 Workers (tasks / actors) killed due to memory pressure (OOM) over the last time period."


def test_rays_node_ip_names_the_culprit_host_of_its_oom_kill(tmp_path):
    for i, (line, host) in enumerate(((RAY_MONITOR, "10.4.0.21"), (RAY_TASK, "10.4.0.22"))):
        (tmp_path / str(i)).mkdir()
        verdict = job(tmp_path / str(i), [line], name="raylet.log")["verdict"]  # no rank writes it
        assert verdict["category"] == "host_oom_or_killed"
        assert verdict["culprit_hosts"] == [host]


def test_a_ray_oom_line_naming_no_node_names_no_host(tmp_path):
    verdict = job(tmp_path, [RAY_NO_NODE], name="raylet.log")["verdict"]
    assert verdict["category"] == "host_oom_or_killed" and verdict["culprit_hosts"] == []
