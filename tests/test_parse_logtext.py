"""Line classification and field extraction on real lines of every era (FORMATS.md)."""

from pathlib import Path

import polars as pl
import pytest

from analyzer.io import discover
from analyzer.parse.logtext import parse_text_file


def parse(tmp_path: Path, text: str) -> pl.DataFrame:
    (tmp_path / "x.log").write_text(text)
    (item,) = discover(tmp_path)
    events = parse_text_file(item, 2026)
    # The vocabulary layer (`vocab.*` events beside a line's own kind) is tested in test_vocabulary.py.
    return events.filter((pl.col("kind") != "log.last") & ~pl.col("kind").str.starts_with("vocab."))


def test_nccl_warn_with_timestamp_and_func(tmp_path):
    ev = parse(tmp_path, "\n[2025-03-12 10:11:12] node7:10:20 [3] transport/net_ib.cc:93 (ncclIbAsync) NCCL WARN NET/IB : Got async event : port error\n")
    row = ev.row(0, named=True)
    assert (row["kind"], row["host"], row["pid"], row["device"], row["code"]) == ("nccl.warn", "node7", 10, 3, "port error")
    assert str(row["ts"]).startswith("2025-03-12 10:11:12")


def test_watchdog_timeout_fields_and_rank_prefix(tmp_path):
    ev = parse(tmp_path, "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out.\n")
    row = ev.row(0, named=True)
    assert (row["kind"], row["rank"], row["seq"], row["op"], row["numel_in"], row["timeout_ms"]) == ("watchdog.timeout", 1, 6463, "ALLREDUCE", 1, 1800000)


def test_wrapped_workncll_is_joined(tmp_path):
    ev = parse(tmp_path, "[Rank 0] Watchdog caught collective operation timeout:\n  WorkNCCL(SeqNum=9, OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=100)\n  ran for 101 milliseconds before timing out.\n")
    first = ev.filter(pl.col("line") == 1).row(0, named=True)
    assert (first["seq"], first["op"]) == (9, "BROADCAST")


def test_traceback_exception_carries_its_stack(tmp_path):
    ev = parse(tmp_path, 'Traceback (most recent call last):\n  File "/x/sync.py", line 57, in __init__\n    sl = self._semlock = _multiprocessing.SemLock(\nOSError: [Errno 28] No space left on device\n')
    row = ev.filter(pl.col("kind") == "traceback.exception").row(0, named=True)
    assert row["code"] == "OSError" and "SemLock" in row["detail"]


def test_nccl_error_raised_takes_last_error_line(tmp_path):
    ev = parse(tmp_path, "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/NCCLUtils.cpp:93, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5\n[rank0]: ncclInternalError: Internal check failed.\n[rank0]: Last error:\n[rank0]: Bootstrap : no socket interface found\n")
    row = ev.filter(pl.col("kind") == "nccl.error_raised").row(0, named=True)
    assert row["rank"] == 0 and row["detail"] == "Bootstrap : no socket interface found"


def test_prefix_layers(tmp_path):
    text = (
        "10: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled system error, NCCL version 2.18.1\n"
        "[default3]:[rank11]:[E1130 14:57:41.7 ProcessGroupNCCL.cpp:689] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=1)\n"
        "(RayWorkerWrapper pid=270291, ip=10.175.94.190) [rank3]:[E219 08:58:32.606667496 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0 Rank 3] Timeout at NCCL work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4.\n"
    )
    rows = parse(tmp_path, text).sort("line").select("rank", "local_rank", "pid", "pg_rank").rows()
    assert rows == [(10, None, None, None), (11, 3, None, 3), (3, None, 270291, 3)]


def test_pdsh_host_labels(tmp_path):
    ev = parse(tmp_path, "c000001: FileNotFoundError: [Errno 2] No such file\nc000002:   File \"/a.py\", line 3, in f\nc000002: ValueError: bad\n")
    assert ev.filter(pl.col("kind") == "traceback.exception").get_column("host").to_list() == ["c000001", "c000002"]


def test_unparsed_lines_are_counted(tmp_path):
    (tmp_path / "x.log").write_text("hello\nworld\nnode1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    (item,) = discover(tmp_path)
    parse_text_file(item, 2026)
    assert (item.lines, item.unparsed_lines) == (3, 2)


TABLE = (Path(__file__).parent / "data" / "torchrun_child_failed_table.log").read_text()


def test_torchrun_failure_table_entries(tmp_path):
    ev = parse(tmp_path, TABLE).filter(pl.col("kind").is_in(["torchrun.root_cause", "torchrun.failure"])).sort("kind")
    assert ev.select("kind", "rank", "local_rank", "host", "pid", "exitcode").rows() == [
        ("torchrun.failure", 1, 1, "localhost", 2180, -15),
        ("torchrun.root_cause", 0, 0, "localhost", 2179, -6),
    ]


def test_torchrun_root_cause_alone_names_no_culprit(tmp_path):
    from analyzer.api import analyze

    (tmp_path / "console.log").write_text(TABLE)
    verdict = analyze(tmp_path).report["verdict"]
    assert verdict["rule_id"] == "torchrun-worker-failed"
    assert verdict["culprit_ranks"] == [] and "Only symptoms" in verdict["summary"]


def test_torch_rank_prefix_alone_keeps_the_exception_line(tmp_path):
    """A console without torchrun's `[defaultN]:` tee: `[rank3]: ` opens the line, space included."""
    events = parse(tmp_path, "[rank3]: Traceback (most recent call last):\n"
                             "[rank3]:   File \"train.py\", line 10, in <module>\n"
                             "[rank3]:     main()\n"
                             "[rank3]: ValueError: bad shard 7\n")
    raised = events.filter(pl.col("kind") == "traceback.exception")
    assert raised.select("line", "rank", "message").rows() == [(4, 3, "ValueError: bad shard 7")]
    assert "File \"train.py\", line 10" in raised.get_column("detail").item()


def test_nccl_lines_without_a_numeric_host_pid_tid(tmp_path):
    """Pasted, redacted and bare NCCL lines still read as NCCL (level, message, host when given)."""
    events = parse(tmp_path, "include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device\n"
                             "ibvwrap.cc: NCCL WARN Call to ibv_modify_qp failed with error Connection timed out\n"
                             "[2026-03-13 22:26:02] host-01.example.com:XXXXXX [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out\n"
                             "NCCL INFO Failed to open libibverbs.so[.1]\n"
                             "Set NCCL INFO level to see more\n")
    rows = events.select("line", "kind", "source", "host", "device").rows()
    assert rows == [
        (1, "nccl.warn", "nccl", None, None),
        (2, "nccl.warn", "nccl", None, None),
        (3, "nccl.warn", "nccl", "host-01.example.com", 5),
        (4, "nccl.net", "nccl", None, None),
    ]
    assert events.row(0, named=True)["message"].startswith("Call to posix_fallocate failed")


def test_nccl_result_name_line_and_indented_last_error(tmp_path):
    events = parse(tmp_path, "[trainer0|0]:ncclInternalError: Internal check failed.\n"
                             "[trainer0|0]:Last error:\n"
                             "[trainer0|0]:Bootstrap : no socket interface found\n"
                             "  Last error:\n")
    raised = events.filter(pl.col("kind") == "nccl.error_raised")
    assert raised.select("line", "local_rank", "detail").rows() == [(1, 0, "Bootstrap : no socket interface found")]
    assert events.filter(pl.col("kind") == "nccl.last_error").get_column("line").to_list() == [2, 4]


def test_rendezvous_store_wordings_across_versions(tmp_path):
    """1.x TCPStore name lookup and connect timeout, torchelastic's rendezvous errors (also inside its JSON record)."""
    events = parse(tmp_path, "ValueError: host not found: Name or service not known\n"
                             "RuntimeError: connect() timed out. Original timeout was 60000 ms.\n"
                             '    "message": "RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.",\n'
                             "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n"
                             "[W socket.cpp:601] [c10d] The IPv6 network addresses of (node-1, 29500) cannot be retrieved (gai error: -2 - Name or service not known).\n")
    assert events.select("line", "kind").rows() == [
        (1, "c10d.store_error"), (2, "c10d.store_error"), (3, "c10d.store_error"), (4, "c10d.store_error"), (5, "c10d.warning"),
    ]


def test_nccl_socket_error_quoted_after_last_error_is_not_the_store(tmp_path):
    events = parse(tmp_path, "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
                             "Last error:\n"
                             "socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer\n"
                             "socketProgress: Connection closed by remote peer ip-172-31-45-209.eu-north-1.compute.internal<32926>\n")
    assert events.select("line", "kind").rows() == [
        (1, "nccl.error_raised"), (2, "nccl.last_error"), (3, "nccl.socket_error"), (4, "nccl.socket_error"),
    ]
    assert events.row(0, named=True)["detail"].startswith("socketProgressOpt: Call to recv from")


def test_nccl_mismatch_warning_without_its_header(tmp_path):
    """A markdown paste (backticks) loses NCCL's header; the check's own text still classifies the line."""
    events = parse(tmp_path, "`init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and around rank 39.`\n"
                             "node-1:39719:39719 [3] init.cc:1197 NCCL WARN Mismatched collective detected, please check your collective calls at and around rank 11.\n")
    assert events.select("line", "kind", "host").rows() == [(1, "nccl.collective_mismatch", None), (2, "nccl.warn", "node-1")]


def test_nccl_warn_from_a_cu_source_file(tmp_path):
    """NCCL <= 2.5 names its sources `*.cu` (`init.cu:1197`, `transport/net_ib.cu:788`)."""
    events = parse(tmp_path, "node-8x-v100-nvlink-1:39719:39719 [3] transport/net_ib.cu:788 NCCL WARN NET/IB : Got completion with error 4, opcode 1, len 21938, vendor err 81\n")
    assert events.select("kind", "host", "device").rows() == [("nccl.warn", "node-8x-v100-nvlink-1", 3)]


def test_fatal_signal_reports_outside_python(tmp_path):
    events = parse(tmp_path, "[8d6bf97c3bf4:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)\n"
                             "Fatal Python error: Bus error\n"
                             "/bin/bash: line 1:  4242 Killed                  python train.py\n"
                             "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n"
                             "RuntimeError: DataLoader worker (pid 262) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory.\n")
    assert events.select("line", "kind", "severity").rows() == [
        (1, "process.fatal_signal", "error"), (2, "process.fatal_signal", "error"), (3, "process.fatal_signal", "error"),
        (4, "process.fatal_signal", "error"), (5, "traceback.exception", "error"),
    ]


def test_kubernetes_oom_and_eviction_records(tmp_path):
    events = parse(tmp_path, "      Reason:       OOMKilled\n"
                             "Pod failed: PodPattern matched: containers: - name: app reason: OOMKilled message: \"/usr/local/pai/runtime: line 30: 7 Killed x.sh\" code: 137\n"
                             "Message:        The node was low on resource: memory.\n"
                             "  Warning  Evicted  pod/trainer-0  The node had condition: [MemoryPressure].\n"
                             "Message:        The node was low on resource: ephemeral-storage. Container pytorch was using 52Gi, which exceeds its request of 0.\n")
    assert events.select("line", "kind").rows() == [
        (1, "system.oom_kill"), (2, "system.oom_kill"), (3, "system.oom_kill"), (4, "system.oom_kill"), (5, "system.io_error"),
    ]


def test_bare_cuda_runtime_error_strings(tmp_path):
    """Horovod and THC print cudaGetErrorString without `CUDA error:`; PyTorch raises it with the head."""
    events = parse(tmp_path, "CUDA driver version is insufficient for CUDA runtime version at horovod/torch/cuda_util.cc:32\n"
                             "THCudaCheck FAIL file=THCStorage.cu line=66 error=46 : all CUDA-capable devices are busy or unavailable\n"
                             "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n")
    assert events.select("line", "kind").rows() == [(1, "cuda.error"), (2, "cuda.error"), (3, "traceback.exception")]


def test_srun_task_exit_names_its_node(tmp_path):
    events = parse(tmp_path, "srun: error: sn30-r1-h1: tasks 0-3: Out Of Memory\n"
                             "slurmstepd: error: *** STEP 30399.0 ON sn30-r1-h1 CANCELLED AT 2024-04-03T09:40:00 DUE TO TIME LIMIT ***\n")
    assert events.select("kind", "host").rows() == [("slurm.task_exit", "sn30-r1-h1"), ("slurm.cancelled", None)]


def test_nccl_warn_keeps_its_source_location(tmp_path):
    events = parse(tmp_path, "gpu47:1822:1822 [0] transport/nvls.cc:223 NCCL WARN Cuda failure 999 'unknown error'\n"
                             "gpu47:1822:1822 [0] NCCL WARN Cuda failure 999 'unknown error'\n")
    assert events.select("message", "detail").rows() == [
        ("Cuda failure 999 'unknown error'", "transport/nvls.cc:223"),
        ("Cuda failure 999 'unknown error'", None),
    ]


def test_tensorflow_glog_header_gives_level_message_and_its_own_year(tmp_path):
    ev = parse(tmp_path, "2019-03-07 14:06:14.336218: E tensorflow/core/common_runtime/session.cc:52] Internal: building the session failed\n")
    row = ev.row(0, named=True)
    assert (row["kind"], row["message"], row["source"]) == ("c10d.error", "Internal: building the session failed", "c10d")
    assert str(row["ts"]).startswith("2019-03-07 14:06:14.336218") and row["ts_source"] == "glog-dated"


def test_xla_last_nccl_warning_quote_is_joined_over_its_wrapped_lines(tmp_path):
    text = (
        "E0101 10:00:00.000001    77 pjrt_client.cc:100] Execution of replica 0\n"
        "failed: INTERNAL: NCCL operation ncclCommInitRank() failed: unhandled system error (run with\n"
        "NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) 'Error\n"
        "while creating shared memory segment /dev/shm/nccl-AbCdEf (size 4194304), error: No space\n"
        "left on device (28)'.\n"
        "I0101 10:00:01.000000    77 main.cc:1] next record\n"
    )
    row = parse(tmp_path, text).filter(pl.col("kind") == "nccl.last_error").row(0, named=True)
    assert row["line"] == 3
    assert row["detail"] == "'Error while creating shared memory segment /dev/shm/nccl-AbCdEf (size 4194304), error: No space left on device (28)'."


def test_a_closed_last_warning_quote_takes_no_following_line(tmp_path):
    text = "x failed: unhandled cuda error. Last NCCL warning(error) log entry (may be unrelated) 'Cuda failure 2 'out of memory''.\nI0101 10:00:01.000000    77 main.cc:1] next\n"
    row = parse(tmp_path, text).filter(pl.col("kind") == "nccl.last_error").row(0, named=True)
    assert row["detail"] == "'Cuda failure 2 'out of memory''."


@pytest.mark.parametrize(("line", "kind", "ranks", "seq"), [
    ("             [7] finished collective #182, but didn't join collective #183 (count from 1)", "desync.lagging", [7], 182),
    ("\t   - [3, 5] joined but didn't finish collective #41207 (count from 1)", "desync.lagging", [3, 5], 41207),
    ("[rank0]:[E ProcessGroupNCCL.cpp:1107] [Rank 0] Timeout at collective: ALLREDUCE, #20, group_id: 0, rank 1 joined but"
     " didn't finish collective #20 (count 1) on pg 0", "desync.lagging", [1], 20),
    ("\t - To our best knowledge, ranks [5, 9] are the lagging ranks that caused this timeout. They never joined any collectives",
     "desync.lagging", [5, 9], None),
    ("         - [0] Timeout at collective: ALLREDUCE, #315", "desync.report", None, 315),
    ("missing ranks: {3, 4, 5, 6, 7}", "frtrace.missing_ranks", [3, 4, 5, 6, 7], None),
    ("Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce Missing ranks are {1}", "frtrace.missing_ranks", [1], None),
    ("error msg: Culprit rank 2; Error type: COLLECTIVE_TYPE_MISMATCH, x, Culprit rank 6; Error type: SIZE_OR_SYNTAX_MISMATCH",
     "frtrace.culprit", [2, 6], None),
])
def test_reports_that_name_ranks_carry_them(tmp_path, line, kind, ranks, seq):
    """A desync report's and fr_trace's named ranks are the event's ranks_ref, never the writer's own rank."""
    ev = parse(tmp_path, f"training goes on\n{line}\nand on\n")
    row = ev.filter(pl.col("line") == 2).row(0, named=True)
    assert (row["kind"], row["ranks_ref"], row["seq"]) == (kind, ranks, seq)


def test_deepspeeds_exit_line_names_the_local_rank_of_the_child_it_quotes(tmp_path):
    ev = parse(tmp_path, "[2022-01-30 20:09:26,784] [ERROR] [launch.py:184:sigkill_handler] ['/usr/bin/python', '-u', 'train.py',"
                         " '--local_rank=3'] exits with return code = -9\n")
    assert ev.get_column("local_rank").to_list() == [3]
