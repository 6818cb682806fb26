"""A store that waited for a rank or node that never joined (analysis store_wait, rule store-wait-rank-absent),
told apart from a store that could not be reached (store-connect-timeout), and the other readings made
precise beside it: a child killed under a rank's exception (worker-killed-sigkill-raised), the watchdog's
frames without a timeout, C++'s terminate line. Every line is written between ordinary lines."""

from pathlib import Path

from analyzer.api import analyze

BEFORE = "[rank0]: step 3 loss 0.731 lr 0.0003"
AFTER = "[rank0]: saving metrics to /tmp/run/metrics.json"
GLOO_WAIT = "[rank0]: torch.distributed.DistStoreError: wait timeout after 30000ms, keys: /default_pg/0//cpu//0/1"
CLIENTS = "torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. 1/2 clients joined."


def report(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> dict:
    (tmp_path / name).write_text("\n".join([BEFORE, *lines, AFTER]) + "\n")
    return analyze(str(tmp_path)).report


def finding(rep: dict, rule_id: str) -> dict | None:
    return next((f for f in rep["findings"] if f["rule_id"] == rule_id), None)


def test_a_gloo_address_key_never_set_names_its_rank_absent(tmp_path):
    verdict = report(tmp_path, [GLOO_WAIT])["verdict"]
    assert (verdict["rule_id"], verdict["category"], verdict["culprit_ranks"]) == (
        "store-wait-rank-absent", "rank_absent_from_collective", [1])


def test_several_keys_name_every_missing_rank(tmp_path):
    line = "[rank0]: torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cpu//0/2, /default_pg/0//cpu//0/3"
    assert report(tmp_path, [line])["verdict"]["culprit_ranks"] == [2, 3]


def test_the_nccl_unique_id_key_names_rank_0_and_a_p2p_key_its_low_rank(tmp_path):
    nccl = "[rank2]: torch.distributed.DistStoreError: Wait timeout after 1800000ms, keys: /default_pg//0//cuda//0"
    (tmp_path / "id").mkdir()
    verdict = report(tmp_path / "id", [nccl], "rank2.log")["verdict"]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rank_absent_from_collective", [0])
    p2p = "[rank3]: torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda//1:3"
    (tmp_path / "p2p").mkdir()
    assert report(tmp_path / "p2p", [p2p], "rank3.log")["verdict"]["culprit_ranks"] == [1]


def test_a_subgroup_key_names_no_global_rank(tmp_path):
    line = "[rank0]: torch.distributed.DistStoreError: wait timeout after 30000ms, keys: /default_pg/5//cpu//0/1"
    rep = report(tmp_path, [line])
    assert rep["verdict"]["category"] == "rank_absent_from_collective"
    assert finding(rep, "store-wait-rank-absent")["ranks"] == []


def test_too_few_clients_with_nothing_refused_is_a_participant_that_never_joined(tmp_path):
    rep = report(tmp_path, [CLIENTS], "console_node0.log")
    assert (rep["verdict"]["rule_id"], rep["verdict"]["category"]) == ("store-wait-rank-absent", "rank_absent_from_collective")
    assert "1 participant" in rep["verdict"]["summary"]
    assert not [f for f in rep["findings"] if f["category"] == "network_unreachable_or_firewall"]


def test_a_connect_failure_beside_the_wait_is_why_it_never_joined(tmp_path):
    connect = "[rank1]: torch.distributed.DistStoreError: The client socket has timed out after 30000ms while trying to connect to (10.0.0.1, 29500)."
    (tmp_path / "node1.log").write_text(f"{BEFORE}\n{connect}\n{AFTER}\n")
    rep = report(tmp_path, [CLIENTS], "node0.log")
    assert (rep["verdict"]["rule_id"], rep["verdict"]["category"]) == ("store-connect-timeout", "network_unreachable_or_firewall")
    assert "store-connect-timeout" in finding(rep, "store-wait-rank-absent")["caused_by"]


def test_a_refused_connection_beside_the_wait_is_the_network(tmp_path):
    refused = "[rank1]: ConnectionRefusedError: [Errno 111] Connection refused"
    rep = report(tmp_path, [refused, GLOO_WAIT])
    assert rep["verdict"]["category"] == "network_unreachable_or_firewall"
    assert "store-wait-rank-absent" in [f["rule_id"] for f in rep["findings"]]


def test_a_store_based_barrier_timeout_is_left_to_its_vocabulary_row(tmp_path):
    line = ("[rank0]: RuntimeError: Timed out initializing process group in store based barrier on rank 0, for key: "
            "store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:00:30 error=wait timeout after 10000ms, "
            "keys: /default_pg/store_based_barrier_key:1:last_worker)")
    rep = report(tmp_path, [line])
    assert rep["verdict"]["category"] == "rank_absent_from_collective"
    assert finding(rep, "store-wait-rank-absent") is None


def test_a_gloo_pair_reset_is_no_store_failure(tmp_path):
    reset = "[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:26831: Connection reset by peer"
    rep = report(tmp_path, [reset])
    assert finding(rep, "store-connect-timeout") is None


def test_a_dataloader_worker_killed_under_a_ranks_exception_is_the_kill(tmp_path):
    killed = "[rank1]: RuntimeError: DataLoader worker (pid 1111) is killed by signal: Killed. "
    closed = "[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:33173"
    verdict = report(tmp_path, [killed, closed])["verdict"]
    assert (verdict["rule_id"], verdict["category"], verdict["culprit_ranks"]) == (
        "worker-killed-sigkill-raised", "host_oom_or_killed", [1])


def test_watchdog_frames_without_a_timeout_are_no_timeout(tmp_path):
    lines = [
        "[rank0]:[E1202 07:49:48.273981683 ProcessGroupNCCL.cpp:2119] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog "
        "thread terminated with exception: CUDA error: an illegal memory access was encountered",
        "frame #4: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7fd3c9d08333 in /opt/torch/lib/libtorch_cuda.so)",
        "frame #5: c10d::ProcessGroupNCCL::Watchdog::run() + 0x157 (0x7fd3c9d093b7 in /opt/torch/lib/libtorch_cuda.so)",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
    ]
    rep = report(tmp_path, lines)
    categories = {f["category"] for f in rep["findings"]}
    assert "nccl_timeout" not in categories and "nccl_init_failure" not in categories
    assert rep["verdict"]["category"] == "rank_crash_exception_then_hang"


def test_the_timeout_checks_frame_is_still_a_timeout(tmp_path):
    frame = ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, "
             "1000l> > >) + 0x1d2 (0x1554e9e0f8f2 in /opt/torch/lib/libtorch_cuda.so)")
    assert finding(report(tmp_path, [frame]), "watchdog-timeout") is not None
