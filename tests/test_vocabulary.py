"""The vocabularies (vocabularies/*.csv): complete for the sources they claim, valid rows, every row's
test line recognised mid-file as its category, and never silent on failure wording nor noisy on benign lines."""

import csv
import re
from pathlib import Path

import polars as pl
import pytest

from analyzer.api import analyze
from analyzer.io import discover
from analyzer.parse.literals import covers
from analyzer.parse.logtext import PREFILTER_LITERALS, parse_text_file
from analyzer.parse.vocabulary import COLUMNS, VocabularyError, check_test_lines, vocabulary, with_hits
from analyzer.rules import CATEGORIES, catalogue

ROOT = Path(__file__).resolve().parent.parent / "vocabularies"
ROWS = vocabulary().rows


def rows_of(component: str) -> pl.DataFrame:
    return ROWS.filter(pl.col("component") == component)


def test_minimum_content():
    header = ROWS.filter(pl.col("component") == "cuda-runtime").get_column("code").to_list()
    assert len(header) >= 130 and {"cudaErrorSystemNotReady", "cudaErrorAssert", "cudaErrorIllegalAddress", "cudaErrorDevicesUnavailable"} <= set(header)
    assert rows_of("cuda-driver").height >= 99
    assert set(ROWS.filter(pl.col("id").str.starts_with("nccl-result/")).get_column("code")) == {
        "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"}
    warn = ROWS.filter(pl.col("id").str.starts_with("nccl-warn/"))
    assert warn.height >= 500 and warn.get_column("versions").str.contains("NCCL 2.4-").any() and warn.get_column("versions").str.contains("-2.28 ").any()
    assert set(rows_of("nvidia-driver").get_column("code")) == {f"Xid {n}" for n in range(1, 173)}
    assert rows_of("ibverbs").height == 24  # IBV_WC_SUCCESS .. IBV_WC_TM_RNDV_INCOMPLETE
    for needle in ("Test CUDA failure", "Test NCCL failure", "NCCL failure", "Test failure"):
        assert needle in ROWS.filter(pl.col("component").is_in(["nccl-tests", "rccl-tests"])).get_column("code").to_list()
    kernel = " ".join(rows_of("kernel").get_column("pattern").to_list() + rows_of("nvidia-smi").get_column("pattern").to_list())
    for needle in ("fallen off the bus", "Reset", "RmInitAdapter failed", "AER", "Uncorrected \\(Fatal\\)", "Unable to determine the device handle"):
        assert needle in kernel


def test_every_row_is_complete_and_its_category_a_verdict_category():
    for path in sorted(ROOT.glob("*.csv")):
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            assert tuple(reader.fieldnames) == COLUMNS, path.name
            for row in reader:
                assert row["category"] in CATEGORIES, f"{path.name} {row['id']}: {row['category']}"
                assert all(row[c].strip() for c in ("meaning", "remediation", "source", "versions", "test_line")), row["id"]


def test_every_row_matches_its_test_line_in_both_regex_engines():
    check_test_lines(vocabulary())
    for row in ROWS.filter(pl.col("match") == "regex").iter_rows(named=True):
        assert re.search(row["pattern"], row["test_line"]), row["id"]


def test_prefilter_literals_cover_every_regex_and_ride_the_text_prefilter():
    literals = vocabulary().literals
    for row in ROWS.filter(pl.col("match") == "regex").iter_rows(named=True):
        mine = literals.filter(pl.col("row") == row["row"]).get_column("literal").to_list()
        assert covers(mine, row["pattern"]), row["id"]
    assert set(vocabulary().prefilter) <= set(PREFILTER_LITERALS)


def test_every_row_is_recognised_mid_file_as_its_category(tmp_path):
    """All test lines in one file, each between neutral lines; each gets its row's category.

    A row of category `other` knows a message but no cause: a more specific row may explain its test line."""
    neutral = "the training loop goes on with the next batch"
    rows = ROWS.select("id", "category", "test_line").rows()
    (tmp_path / "all.log").write_text("".join(f"{neutral}\n{line}\n" for _, _, line in rows) + f"{neutral}\n")
    (item,) = discover(tmp_path)
    events = parse_text_file(item, 2026)
    vocab = events.filter(pl.col("kind").str.starts_with("vocab.")).select("line", pl.col("kind").str.strip_prefix("vocab.").alias("category"))
    got = dict(vocab.rows())
    wrong = [(rid, cat, got.get(2 * i + 2)) for i, (rid, cat, _) in enumerate(rows) if cat != "none" and got.get(2 * i + 2) != cat and not (cat == "other" and got.get(2 * i + 2))]
    assert not wrong, wrong[:10]
    benign_lines = {2 * i + 2 for i, (_, cat, _) in enumerate(rows) if cat == "none"}
    assert all(got.get(line) == "none" for line in benign_lines)
    assert set(events.filter(pl.col("kind") == "vocab.none").get_column("severity")) == {"info"}
    generic = events.filter(pl.col("kind") == "log.failure").get_column("line").to_list()
    assert not benign_lines & set(generic)


def test_each_category_has_its_vocabulary_rule():
    kinds = {k for rule in catalogue() for k in rule.match.get("kinds", [])}
    used = set(ROWS.get_column("category")) - {"none"}
    assert {f"vocab.{c}" for c in used} <= kinds


def test_hits_need_a_prefilter_literal_and_prefer_benign_then_specific():
    frame = pl.DataFrame({"body": [
        "nothing to see here",
        "node-1:1:2 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
    ]})
    got = with_hits(frame, "body").select("vocab_category").to_series().to_list()
    assert got == [None, "none", "rank_crash_exception_then_hang", "gpu_hardware_xid"]


def test_bad_rows_fail_to_load_naming_file_row_and_field(tmp_path):
    good = {c: "x" for c in COLUMNS} | {"id": "t/1", "match": "literal", "pattern": "frobnicator broke", "category": "other", "test_line": "the frobnicator broke"}
    for change, message in (({"category": "gremlins"}, "category 'gremlins' is not a verdict category"),
                            ({"match": "glob"}, "match 'glob'"),
                            ({"meaning": ""}, "field 'meaning' is empty"),
                            ({"match": "regex", "pattern": "(unclosed"}, "does not compile"),
                            ({"match": "regex", "pattern": "\\d+"}, "no prefilter literal")):
        directory = tmp_path / f"v{len(message)}"
        directory.mkdir()
        with (directory / "t.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerow(good | change)
        with pytest.raises(VocabularyError, match=r"t\.csv: row 't/1'") as info:
            vocabulary(str(directory))
        assert message in str(info.value)


def job(tmp_path: Path, lines: list[str]) -> dict:
    (tmp_path / "rank0.log").write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


def test_never_silent_on_unknown_failure_wording(tmp_path):
    report = job(tmp_path, ["the frobnicator gave up: handshake failed with the peer", "continuing"])
    assert report["verdict"]["category"] == "other"
    assert "handshake failed" in report["verdict"]["evidence"][0]["text"]


def test_a_job_of_benign_lines_is_read_and_clean(tmp_path):
    (tmp_path / "out.log").write_text("libibverbs: Warning: couldn't load driver 'libipathverbs-rdmav34.so': libipathverbs-rdmav34.so: cannot open shared object file: No such file or directory\n")
    assert analyze(str(tmp_path)).report["verdict"]["category"] == "none"


def test_benign_lines_keep_a_healthy_run_silent(tmp_path):
    report = job(tmp_path, [
        "node-1:100:200 [0] NCCL INFO Failed to open libibverbs.so[.1]",
        "node-1:100:200 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        "node-1:100:200 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
        "[rank0]:[W1130 15:01:02.000000000 ProcessGroupNCCL.cpp:1250] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources.",
        "#       size         count      type   redop    root     time   algbw   busbw  error     time   algbw   busbw  error",
    ])
    assert report["verdict"]["category"] == "none", report["findings"]


# --- cause over symptom (decide: `cause_of`) ----------------------------------------------------------

NO_INTERFACE = "node-1:100:200 [0] NCCL INFO Bootstrap : no socket interface found"
OLD_OOM = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
           "60.00 GiB already allocated; 1.50 GiB free; 75.00 GiB reserved in total by PyTorch)")


def test_the_interface_setting_beside_no_interface_found_is_the_cause(tmp_path):
    report = job(tmp_path, ["node-1:100:200 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth7", NO_INTERFACE])
    assert report["verdict"]["category"] == "wrong_network_interface"
    symptom = next(f for f in report["findings"] if f["rule_id"] == "nccl-no-socket-interface")
    assert symptom["caused_by"] == ["nccl-socket-ifname-names-no-interface"]


def test_no_interface_found_without_the_setting_is_the_interface_choice(tmp_path):
    # the fix is the interface either way (a filter naming nothing, or a host with only lo), so the
    # line alone gives the interface's category, from its own rule
    verdict = job(tmp_path, [NO_INTERFACE])["verdict"]
    assert (verdict["category"], verdict["rule_id"]) == ("wrong_network_interface", "nccl-no-socket-interface")


def test_the_interface_setting_alone_is_no_finding(tmp_path):
    report = job(tmp_path, ["export NCCL_SOCKET_IFNAME=eth7"])
    assert report["verdict"]["category"] == "none" and not report["findings"]


def fragmentation_found(tmp_path, name: str, line: str) -> bool:
    (tmp_path / name).mkdir()
    report = job(tmp_path / name, [line])
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"  # the OOM stays the verdict (cases 022, 148)
    return any(f["rule_id"] == "memory-oom-reserved-unallocated" for f in report["findings"])


def test_old_oom_wording_with_reserved_minus_allocated_over_the_request_shows_fragmentation(tmp_path):
    assert fragmentation_found(tmp_path, "old", OLD_OOM)


def test_old_oom_wording_with_little_reserved_or_a_request_the_card_cannot_hold_is_no_fragmentation(tmp_path):
    assert not fragmentation_found(tmp_path, "little", OLD_OOM.replace("75.00 GiB reserved", "61.00 GiB reserved"))
    whole_card = OLD_OOM.replace("Tried to allocate 2.00 GiB", "Tried to allocate 20.00 GiB")
    assert not fragmentation_found(tmp_path, "card", whole_card)


def test_a_full_disk_beside_an_unreadable_checkpoint_is_the_cause(tmp_path):
    unreadable = "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"
    (tmp_path / "alone").mkdir()
    assert job(tmp_path / "alone", [unreadable])["verdict"]["category"] == "checkpoint_corruption"
    (tmp_path / "full").mkdir()
    report = job(tmp_path / "full", ["tee: train.log: No space left on device", unreadable])
    assert report["verdict"]["category"] == "disk_full_or_io"
    explained = [f for f in report["findings"] if f["rule_id"] == "checkpoint-unreadable"]
    assert explained and explained[0]["caused_by"] == ["disk-full-or-io-error"]


# --- a closed connection is the peer's death, not the network (rules/peer-connection-closed.toml) -----

CLOSED_BY_PEER = "[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:6357"
STORE_UNREACHABLE = ("[rank1]: torch.distributed.DistStoreError: The client socket has timed out after 600s while trying "
                     "to connect to (10.0.0.1, 29500).")


def test_a_closed_connection_beside_another_ranks_crash_is_its_symptom(tmp_path):
    oom = ("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total "
           "capacity of 139.80 GiB of which 137.56 GiB is free.")
    report = job(tmp_path, [oom, CLOSED_BY_PEER])
    assert (report["verdict"]["rule_id"], report["verdict"]["category"]) == ("cuda-oom", "cuda_oom_on_some_ranks")
    closed = next(f for f in report["findings"] if f["rule_id"] == "peer-connection-closed")
    assert closed["caused_by"] == ["cuda-oom"] and closed["ranks"] == [0]
    assert not [f for f in report["findings"] if f["category"] == "network_unreachable_or_firewall"]


def test_a_closed_connection_alone_is_a_peer_death_with_no_named_culprit(tmp_path):
    report = job(tmp_path, [CLOSED_BY_PEER])
    verdict = report["verdict"]
    assert (verdict["rule_id"], verdict["category"]) == ("peer-connection-closed", "rank_crash_exception_then_hang")
    assert verdict["culprit_ranks"] == []  # rank 0 is the survivor that saw it, not the culprit
    assert not [f for f in report["findings"] if f["category"] == "network_unreachable_or_firewall"]


def test_a_store_unreachable_before_any_crash_stays_the_network_failure(tmp_path):
    report = job(tmp_path, [STORE_UNREACHABLE, CLOSED_BY_PEER])
    assert report["verdict"]["category"] == "network_unreachable_or_firewall"
    closed = next(f for f in report["findings"] if f["rule_id"] == "peer-connection-closed")
    assert closed["caused_by"] == [report["verdict"]["rule_id"]]


# --- PyTorch c10d / elastic / DDP / FSDP texts (vocabularies/pytorch_c10d.csv) -------------------------

C10D_HEADERS = (  # the prefixes ProcessGroupNCCL's lines carried over the releases
    "",
    "[E ProcessGroupNCCL.cpp:587] ",  # 1.10-2.1
    "[rank1]:[E ProcessGroupNCCL.cpp:523] ",  # 2.2-2.3
    "[trainer4]:E0228 17:37:21.488888  9191 ProcessGroupNCCL.cpp:1405] [PG 3 Rank 4] ",  # glog's own prefix, 2.3
    "[rank1]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 1] ",  # 2.4
    "[rank3]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank 3] ",  # 2.5+
)


def categories_mid_file(tmp_path: Path, lines: list[str]) -> list[str | None]:
    """Each line between two ordinary lines; the vocabulary category each line came out as."""
    neutral = "the training loop goes on with the next batch"
    (tmp_path / "rank.log").write_text("".join(f"{neutral}\n{line}\n" for line in lines) + f"{neutral}\n")
    (item,) = discover(tmp_path)
    events = parse_text_file(item, 2026)
    got = dict(events.filter(pl.col("kind").str.starts_with("vocab.")).select("line", pl.col("kind").str.strip_prefix("vocab.")).rows())
    return [got.get(2 * i + 2) for i in range(len(lines))]


def test_c10d_rows_name_their_releases_within_the_covered_range():
    rows = ROWS.filter(pl.col("file") == "pytorch_c10d.csv")
    assert rows.height >= 80
    for rid, versions in rows.select("id", "versions").rows():
        found = re.fullmatch(r"PyTorch (\d+)\.(\d+)-(\d+)\.(\d+)", versions)
        assert found, (rid, versions)
        first, last = (int(found[1]), int(found[2])), (int(found[3]), int(found[4]))
        assert first <= last <= (2, 13), (rid, versions)


def test_c10d_families_are_covered():
    ids = set(ROWS.filter(pl.col("file") == "pytorch_c10d.csv").get_column("id"))
    for family in ("pytorch-c10d/watchdog-timeout-", "pytorch-c10d/detail-", "pytorch-c10d/gloo-", "pytorch-c10d/store-based-barrier",
                   "pytorch-c10d/recv-0-bytes", "pytorch-ddp/", "pytorch-fsdp/", "pytorch-elastic/", "pytorch-c10d/dump-signal"):
        assert any(i.startswith(family) for i in ids), family


def test_each_watchdog_wording_is_a_timeout_under_every_header(tmp_path):
    bodies = [
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1806483 milliseconds before timing out.",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1803411 milliseconds before timing out.",
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, OpType=ALLGATHER, NumelIn=1, NumelOut=4, Timeout(ms)=600000) ran for 600038 milliseconds before timing out.",
        "Timeout at NCCL work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 6462.",
        "Received a dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued NCCL work: 5, last completed NCCL work: 4.",
    ]
    lines = [header + body for header in C10D_HEADERS for body in bodies]
    assert categories_mid_file(tmp_path, lines) == ["nccl_timeout"] * len(lines)


def test_narrow_c10d_benign_rows_leave_the_failing_wordings_alone(tmp_path):
    benign = "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot assign requested address)."
    failing = "[W socket.cpp:663] [c10d] The client socket has failed to connect to [::ffff:10.0.0.1]:29500 (errno: 110 - Connection timed out)."
    at_exit = ('[rank3]:[W825 07:38:02.806977494 ProcessGroupNCCL.cpp:1662] [PG ID 0 PG GUID 0(default_pg) Rank 3] Failed to check the "should dump" '
               "flag on TCPStore, (maybe TCPStore server has shut down too early), with error: failed to recv, got 0 bytes")
    store_gone = ("[rank1]:[W310 15:54:45.574839167 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=86, addr=[localhost]:54074, "
                  "remote=[localhost]:29500): Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?")
    assert categories_mid_file(tmp_path, [benign, failing, at_exit, store_gone]) == ["none", "network_unreachable_or_firewall", "none", "other"]


def test_a_sigkill_in_the_torchrun_table_is_the_kill_and_other_signals_name_no_cause(tmp_path):
    got = categories_mid_file(tmp_path, ["  traceback : Signal 9 (SIGKILL) received by PID 36072", "  traceback : Signal 6 (SIGABRT) received by PID 2179"])
    assert got == ["host_oom_or_killed", "other"]


def test_every_cuda_runtime_error_is_known_by_c10s_numeric_form():
    """c10's CUDA-initialisation warning names the error as `Error <code>: <cudaGetErrorString text>`,
    with no `CUDA error` word near it."""
    rows = rows_of("cuda-runtime").filter(pl.col("match") == "regex")
    codes = rows.get_column("meaning").str.extract(r"cudaError_t (\d+):").to_list()
    lines = [
        "/x/torch/cuda/__init__.py:129: UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run"
        " some cuda functions before calling NumCudaDevices() that might have already set an error? "
        f"Error {code}: {message} (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)"
        for code, message in zip(codes, rows.get_column("message").to_list())
    ]
    got = with_hits(pl.DataFrame({"body": lines}), "body").get_column("vocab_id").to_list()
    assert got == rows.get_column("id").to_list()
    assert with_hits(pl.DataFrame({"body": ["step 12 Error 2: out of patience"]}), "body").get_column("vocab_id").to_list() == [None]
