"""Generators of the hostile inputs of issue 18, one per class, written at test time into a directory.

Each generator writes one job directory (small on disk: sparse files, repeated blocks, DAG pickles)
and returns the input whose row the report must carry. `scale` shrinks the large items for the
test suite (1.0 is the size the red team used; bench/bench_bad_input.py runs them at full size).
tests/test_hostile_bounds.py runs every item in a child process and bounds its time and memory.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
import sqlite3
import struct
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE_LOG = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job" / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log"
FR_DUMP = ROOT / "fixtures" / "recorded" / "hang_conditional_collective" / "job" / "fr" / "nccl_trace_rank_0"
MB = 1 << 20
HUGE = "123456789012345678901234567890"  # 30 digits: past int64 and uint64
WARN = ("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> "
        "with error 4, opcode 5327, len 5327, vendor err 81 (Send)")


@dataclass(frozen=True)
class Item:
    name: str
    klass: str  # numbers, super-linear, memory, zip, audit, names
    make: Callable[[Path, float], str]  # (job directory, scale) -> the input to look for ("" = the job)
    argv: tuple[str, ...] = ()  # extra CLI arguments


def _companion(job: Path) -> None:
    shutil.copyfile(CASE_LOG, job / "rank0.stderr.log")


def _fr_doc() -> dict:
    from analyzer.io.safepickle import load_untrusted_pickle

    return load_untrusted_pickle(FR_DUMP.read_bytes())


def _dag(levels: int) -> list:
    """A list whose str() is 2**levels long: each level holds the one below twice (pickled once, by memo)."""
    node: list = ["x"]
    for _ in range(levels):
        node = [node, node]
    return node


# --- numbers past int64, absurd world sizes ---------------------------------------------------------


def huge_numbers_in_lines(job: Path, scale: float) -> str:
    _companion(job)
    lines = [
        f"[rank{HUGE}]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank {HUGE}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={HUGE}, OpType=ALLREDUCE, NumelIn={HUGE}, NumelOut={HUGE}, Timeout(ms)={HUGE}) "
        "ran for 600011 milliseconds before timing out.",
        f"[rank{HUGE}]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:1914] [PG 0 Rank {HUGE}] Last enqueued NCCL work: "
        f"{HUGE}, last completed NCCL work: {HUGE}.",
        f"host-a:{HUGE}:{HUGE} [0] NCCL INFO comm 0x55d0 rank {HUGE} nranks {HUGE} cudaDev {HUGE} busId 1000 - Init COMPLETE",
        f"host-a:{HUGE}:1 [{HUGE}] NCCL INFO cudaDriverVersion {HUGE}",
        f"{HUGE}.{HUGE} host-a:1:1 [0] NCCL WARN Timestamped {HUGE}",
        f"[E{HUGE} 99:99:99.{HUGE} ProcessGroupNCCL.cpp:1 ] [Rank {HUGE}] Exception (either an error or timeout) detected",
        f"torch.distributed.elastic.multiprocessing.api:[ERROR] failed (exitcode: {HUGE}) local_rank: {HUGE} (pid: {HUGE}) "
        "of binary: /usr/bin/python",
        f"  rank      : {HUGE} (local_rank: {HUGE})",
        f"  exitcode  : {HUGE} (pid: {HUGE})",
        WARN,
    ]
    (job / "huge.log").write_text("\n".join(lines) + "\n")
    return "huge.log"


def huge_numbers_in_names(job: Path, scale: float) -> str:
    _companion(job)
    shutil.copyfile(CASE_LOG, job / f"rank{HUGE}.log")
    run = job / "run" / f"attempt_{HUGE}" / HUGE
    run.mkdir(parents=True)
    shutil.copyfile(CASE_LOG, run / "stderr.log")
    pyspy = job / f"dump_rank{HUGE}.txt"
    pyspy.write_text(f"Process {HUGE}: python train.py\nPython v3.11.4 (/usr/bin/python)\n\n"
                     f"Thread {HUGE} (idle): \"MainThread\"\n    wait (threading.py:{HUGE})\n")
    (job / f"nccl_trace_rank_{HUGE}").write_bytes(FR_DUMP.read_bytes())
    return f"rank{HUGE}.log"


def huge_numbers_in_fr(job: Path, scale: float) -> str:
    _companion(job)
    doc = _fr_doc()
    big = 2**70
    for entry in doc["entries"]:
        entry.update(time_created_ns=big, collective_seq_id=big, p2p_seq_id=big, timeout_ms=big, op_id=big,
                     record_id=big, pg_id=big, input_sizes=[[big, big]], output_sizes=[[big]],
                     time_discovered_completed_ns=big)
    doc["pg_config"]["0"]["ranks"] = f"[0, {big}]"
    doc["pg_status"]["0"] = {"last_enqueued_collective": big, "last_started_collective": big, "last_completed_collective": big}
    (job / "nccl_trace_rank_1").write_bytes(pickle.dumps(doc, protocol=4))
    return "nccl_trace_rank_1"


def absurd_world_size(job: Path, scale: float) -> str:
    _companion(job)
    lines = [
        "host-a:1000:1000 [0] NCCL INFO comm 0x55d0 rank 0 nranks 100000000 cudaDev 0 busId 1000 - Init COMPLETE",
        "host-a:1000:1000 [0] NCCL INFO comm 0x55d1 rank 99999999 nranks 100000000 cudaDev 0 busId 1000 - Init COMPLETE",
        "[rank1000000000000000000]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 1000000000000000000] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600011 milliseconds before timing out.",
        "mp_world_size=3e8 dp_world_size=300000000 world_size=300000000",
    ]
    (job / "world.log").write_text("\n".join(lines) + "\n")
    ckpt = job / "checkpoints" / "global_step10"
    ckpt.mkdir(parents=True)
    for dp in (0, 1):
        (ckpt / f"zero_pp_rank_{dp}_mp_rank_00_optim_states.pt").write_bytes(pickle.dumps({"optimizer_state_dict": {}}))
    (ckpt / "mp_rank_00_model_states.pt").write_bytes(
        pickle.dumps({"module": {}, "dp_world_size": 300_000_000, "mp_world_size": 3e8, "global_steps": 10}))
    return "world.log"


# --- super-linear shapes ------------------------------------------------------------------------------


def _pyspy_line(job: Path, size: int) -> str:
    # `    f (a (a (a ...` with no closing parenthesis: every " (" is a place for the frame regex to retry.
    body = "    f" + " (a" * (size // 3)
    (job / "rank3.pyspy.txt").write_text(
        "Process 4242: python train.py\nPython v3.11.4 (/usr/bin/python3.11)\n\n"
        "Thread 4242 (idle): \"MainThread\"\n" + body + "\n    all_reduce (torch/distributed/c10d.py:2501)\n")
    return "rank3.pyspy.txt"


def pyspy_backtracking(job: Path, scale: float) -> str:
    _companion(job)
    return _pyspy_line(job, max(64 << 10, int(3 * MB * scale)))


def kineto_without_separator(job: Path, scale: float) -> str:
    _companion(job)
    size = max(40 * MB, int(256 * MB * scale))
    with open(job / "trace_rank0.json", "wb") as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "')
        block = b"a" * MB
        for _ in range(size // MB):
            fh.write(block)
        fh.write(b'"}]}')
    return "trace_rank0.json"


def _nsys_tables(con: sqlite3.Connection, name_column: str = "shortName INTEGER") -> None:
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL')")
    con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER, "
                f"globalPid INTEGER, {name_column})")


def nsys_generated_column(job: Path, scale: float) -> str:
    _companion(job)
    con = sqlite3.connect(job / "prof.sqlite")
    _nsys_tables(con, "other INTEGER")
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, globalPid) VALUES (?, ?, 0, 7, 1)",
                    [(i * 1000, i * 1000 + 500) for i in range(100)])
    # Then the column the reader needs, generated: a 200 MB zero blob turned into hex on every read of
    # a row (about a second each). Added afterwards, so writing the rows computed nothing.
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL ADD COLUMN shortName INTEGER "
                "GENERATED ALWAYS AS (length(hex(zeroblob(200000000 + start - start)))) VIRTUAL")
    con.commit()
    con.close()
    return "prof.sqlite"


def nsys_many_rows(job: Path, scale: float) -> str:
    _companion(job)
    rows = max(200_000, int(20_000_000 * scale))
    con = sqlite3.connect(job / "prof.sqlite")
    _nsys_tables(con)
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "SELECT i * 1000, i * 1000 + 500, 0, 7, 1, 1 FROM n", (rows - 1,))
    con.commit()
    con.close()
    return "prof.sqlite"


def safetensors_huge_shape(job: Path, scale: float) -> str:
    _companion(job)
    big = int("9" * 4000)
    header = {f"w{i}": {"dtype": "F32", "shape": [big] * 64, "data_offsets": [0, 4]} for i in range(64)}
    raw = json.dumps(header).encode()
    ckpt = job / "checkpoints"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    return "rank0.stderr.log"


def fr_shared_list_dag(job: Path, scale: float) -> str:
    _companion(job)
    doc = _fr_doc()
    dag = _dag(64)
    for entry in doc["entries"]:
        entry.update(input_sizes=dag, output_sizes=dag, input_dtypes=dag, frames=[{"name": dag, "filename": dag, "line": dag}],
                     profiling_name=dag, state=dag, process_group=(dag, dag))
    doc["pg_config"]["0"]["ranks"] = dag
    doc["pg_config"][("pg", 1)] = {"name": dag, "desc": dag, "ranks": dag}
    doc["comm_lib_version"] = dag
    (job / "nccl_trace_rank_1").write_bytes(pickle.dumps(doc, protocol=4))
    return "nccl_trace_rank_1"


def memsnapshot_shared_list_dag(job: Path, scale: float) -> str:
    _companion(job)
    dag = _dag(64)
    snap = {"segments": [{"device": 0, "total_size": 1 << 30, "allocated_size": 1 << 29, "blocks": [{"size": dag, "state": dag}],
                          "is_expandable": dag}],
            "device_traces": [[{"action": dag, "size": dag, "device_free": dag}, {"action": "oom", "size": 2**70}]]}
    (job / "snapshot_rank0.pickle").write_bytes(pickle.dumps(snap, protocol=4))
    return "snapshot_rank0.pickle"


def checkpoint_self_reference(job: Path, scale: float) -> str:
    _companion(job)
    state: dict = {"step": 5}
    state["model"] = state
    state["optimizer"] = {"state": state, "param_groups": [state, [state]]}
    chain: dict = state
    for _ in range(5000):  # and a nesting far deeper than any walker's recursion limit
        chain = {"model": chain}
    ckpt = job / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step_5.pt").write_bytes(pickle.dumps(state, protocol=2))
    (ckpt / "checkpoint_deep.pkl").write_bytes(_deep_pickle(5000))
    return "rank0.stderr.log"


def _deep_pickle(depth: int) -> bytes:
    """A dict nested `depth` levels, written opcode by opcode (pickle.dumps itself would recurse)."""
    return b"\x80\x02" + b"}(X\x05\x00\x00\x00model" * depth + b"}" + b"u" * depth + b"."


# --- memory amplification ---------------------------------------------------------------------------


def pickle_huge_memo_index(job: Path, scale: float) -> str:
    _companion(job)
    # PROTO 2, NONE, LONG_BINPUT 2**28, STOP: 9 bytes asking for a memo of 2**28 slots.
    bomb = b"\x80\x02Nr" + struct.pack("<I", 2**28) + b"."
    (job / "nccl_trace_rank_1").write_bytes(bomb)
    ckpt = job / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step_7.pt").write_bytes(bomb)
    return "nccl_trace_rank_1"


def fr_pickle_object_bomb(job: Path, scale: float) -> str:
    _companion(job)
    count = max(8 * MB, int(64 * MB * scale))
    # One list of `count` empty dicts: 1 byte of pickle, ~64 bytes of memory each.
    (job / "nccl_trace_rank_1").write_bytes(b"\x80\x04(" + b"}" * count + b"l.")
    return "nccl_trace_rank_1"


def sparse_pickle(job: Path, scale: float) -> str:
    _companion(job)
    path = job / "nccl_trace_rank_1"
    with open(path, "wb") as fh:
        fh.write(b"\x80\x04\x95" + struct.pack("<Q", 2 << 30) + b"(")  # a FRAME of 2 GiB, then a hole
        fh.truncate(2 << 30)
    return "nccl_trace_rank_1"


# --- a zip whose central directory repeats one member ------------------------------------------------


def zip_overlapping_entries(job: Path, scale: float) -> str:
    _companion(job)
    entries = max(2000, int(20_000 * scale))
    inflated = 64 * MB
    ckpt = job / "checkpoints"
    ckpt.mkdir()
    path = ckpt / "step_3.pt"
    pkl = pickle.dumps({"model": {}, "step": 3}, protocol=2)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/data/0", bytes(inflated))
        zf.writestr("archive/version", "3\n")
    data = path.read_bytes()
    # Repeat the central-directory record of archive/data/0 `entries` times under new names.
    eocd = data.rindex(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", data[eocd + 12: eocd + 20])
    central = data[cd_offset: cd_offset + cd_size]
    records, pos = [], 0
    while pos < len(central):
        n, m, k = struct.unpack("<HHH", central[pos + 28: pos + 34])
        records.append(central[pos: pos + 46 + n + m + k])
        pos += 46 + n + m + k
    member = next(r for r in records if r[46:46 + struct.unpack("<H", r[28:30])[0]] == b"archive/data/0")
    extra = []
    for i in range(entries):
        name = f"archive/data/{i + 1}".encode()
        extra.append(member[:28] + struct.pack("<H", len(name)) + member[30:46] + name)
    new_central = b"".join(records + extra)
    total = len(records) + len(extra)
    eocd_rec = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, total, total, len(new_central), cd_offset, 0)
    path.write_bytes(data[:cd_offset] + new_central + eocd_rec)
    return "rank0.stderr.log"


# --- the checkpoint audit misled ----------------------------------------------------------------------


def _reduce_pickle(module: str = "", name: str = "", *args: str, step: int = 900) -> bytes:
    """A protocol-2 pickle of {"model": {"w": <a tensor>}, "step": step, "x": module.name(*args)} built
    opcode by opcode (nothing is imported to write it); without `module`, no "x"."""
    tensor = b"ctorch._utils\n_rebuild_tensor_v2\n)R"
    body = (b"X\x05\x00\x00\x00model}X\x01\x00\x00\x00w" + tensor + b"s"
            + b"X\x04\x00\x00\x00stepJ" + struct.pack("<i", step))
    if module:
        body += b"X\x01\x00\x00\x00xc" + module.encode() + b"\n" + name.encode() + b"\n(" + b"".join(
            b"X" + struct.pack("<I", len(a.encode())) + a.encode() for a in args) + b"tR"
    return b"\x80\x02}(" + body + b"u."


def trojan_checkpoints(job: Path, scale: float) -> str:
    _companion(job)
    ckpt = job / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step_100.pt").write_bytes(_reduce_pickle(step=100))
    (ckpt / "step_900.pt").write_bytes(_reduce_pickle("torch.utils.collect_env", "run", "touch /tmp/pwned-collect-env"))
    (ckpt / "step_901.pt").write_bytes(_reduce_pickle("pkgutil", "resolve_name", "os:system", step=901))
    (ckpt / "step_902.pt").write_bytes(_reduce_pickle("some_lib.tools", "run_command", "id", step=902))
    (ckpt / "step_903.pt").write_bytes(_reduce_pickle("some_lib.models", "Net", step=903))  # a class: unknown, said so
    return "rank0.stderr.log"


def checkpoint_symlink_loop(job: Path, scale: float) -> str:
    _companion(job)
    ckpt = job / "checkpoints"
    (ckpt / "a" / "b").mkdir(parents=True)
    (ckpt / "a" / "b" / "up").symlink_to("../..", target_is_directory=True)
    (ckpt / "loop").symlink_to("loop")
    (ckpt / "self.pt").symlink_to("self.pt")
    (ckpt / "step_900.pt").write_bytes(_reduce_pickle("os", "system", "touch /tmp/pwned"))
    return "rank0.stderr.log"


def sibling_jobs(job: Path, scale: float) -> str:
    """`job` is one of several jobs under a common parent that also holds `outputs/` and `ckpt-*` of no job in
    particular, and the job's own `<job>-checkpoints/` (audited only when --checkpoint names it)."""
    _companion(job)
    parent = job.parent
    other = parent / "other-job"
    other.mkdir(exist_ok=True)
    shutil.copyfile(CASE_LOG, other / "rank0.stderr.log")
    for name in ("outputs", "ckpt-other-job", "checkpoint-100"):
        (parent / name).mkdir(exist_ok=True)
        (parent / name / "step_900.pt").write_bytes(_reduce_pickle("os", "system", "touch /tmp/pwned"))
    own = parent / f"{job.name}-checkpoints"
    own.mkdir(exist_ok=True)
    (own / "step_5.pt").write_bytes(_reduce_pickle(step=5))
    return "rank0.stderr.log"


def link_out_of_root(job: Path, scale: float) -> str:
    """A single log analysed whose directory holds `model.pt -> ` a file outside it (stands for /etc/shadow)."""
    shutil.copyfile(CASE_LOG, job / "rank0.stderr.log")
    secret = job.parent / "secret-outside"
    secret.write_bytes(b"\x80\x02}q\x00." + b"S" * 123_457)
    (job / "model.pt").symlink_to(secret)
    (job / "ckpt").mkdir()
    (job / "ckpt" / "weights.pt").symlink_to(secret)
    return "rank0.stderr.log"


# --- names and evidence text ------------------------------------------------------------------------


def long_member_name(job: Path, scale: float) -> str:
    _companion(job)
    name = "n" * max(1 * MB, int(16 * MB * scale)) + ".log"
    body = (WARN + "\n").encode()
    info = tarfile.TarInfo(name)
    info.size = len(body)
    with tarfile.open(job / "logs.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(body))
    long_line = "x" * (4 * MB)
    (job / "long.log").write_text(WARN + " " + long_line + "\n")
    return "long.log"


ITEMS: tuple[Item, ...] = (
    Item("huge-numbers-in-log-lines", "numbers", huge_numbers_in_lines),
    Item("huge-numbers-in-file-names", "numbers", huge_numbers_in_names),
    Item("huge-numbers-in-fr-dump", "numbers", huge_numbers_in_fr),
    Item("absurd-world-size", "numbers", absurd_world_size),
    Item("pyspy-frame-backtracking", "super-linear", pyspy_backtracking),
    Item("kineto-without-separator", "super-linear", kineto_without_separator),
    Item("nsys-generated-column", "super-linear", nsys_generated_column),
    Item("safetensors-4000-digit-shape", "super-linear", safetensors_huge_shape),
    Item("fr-shared-list-dag", "super-linear", fr_shared_list_dag),
    Item("memsnapshot-shared-list-dag", "super-linear", memsnapshot_shared_list_dag),
    Item("checkpoint-self-reference", "super-linear", checkpoint_self_reference),
    Item("pickle-long-binput-2**28", "memory", pickle_huge_memo_index),
    Item("fr-pickle-object-bomb", "memory", fr_pickle_object_bomb),
    Item("sparse-pickle", "memory", sparse_pickle),
    Item("nsys-many-rows", "memory", nsys_many_rows),
    Item("zip-overlapping-entries", "zip", zip_overlapping_entries),
    Item("trojan-checkpoints", "audit", trojan_checkpoints),
    Item("checkpoint-symlink-loop", "audit", checkpoint_symlink_loop),
    Item("sibling-jobs", "audit", sibling_jobs),
    Item("link-out-of-root", "audit", link_out_of_root),
    Item("long-member-name", "names", long_member_name),
)
BY_NAME = {item.name: item for item in ITEMS}


def write(item: Item, job: Path, scale: float = 1.0) -> str:
    job.mkdir(parents=True, exist_ok=True)
    return item.make(job, scale)


# --- running one item ---------------------------------------------------------------------------------

CHILD = r"""
import json, resource, sys, time
limit = int(sys.argv[3])
if limit:  # a hard ceiling far above the bound, so a regression fails the test instead of the machine
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
wall = time.perf_counter()
import click
from analyzer.cli import main
code, message = 0, ""
try:
    main(["analyze", sys.argv[1], "--format", "json", "--output", sys.argv[2], *sys.argv[4:]], standalone_mode=False)
except SystemExit as exc:
    code = exc.code
except click.ClickException as exc:
    code, message = exc.exit_code, exc.format_message()
# VmHWM is this program's own peak: ru_maxrss keeps the parent's across fork and exec (a test runner
# of 900 MB would read as a child of 900 MB); resource's figure is printed too, an upper bound.
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"seconds": time.perf_counter() - wall, "peak_rss_mb": hwm,
                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "exit": code, "message": message[:2000]}))
"""


def measure(job: Path, report: Path, argv: tuple[str, ...] = (), *, address_space: int = 4 << 30, timeout: float = 300,
            prelude: str = "") -> dict:
    """`postmortem analyze JOB --format json --output REPORT` in a child: wall seconds, peak RSS (MB), exit, report."""
    import subprocess
    import sys

    report.unlink(missing_ok=True)
    code = prelude + CHILD
    try:
        run = subprocess.run([sys.executable, "-c", code, str(job), str(report), str(address_space), *argv],
                             capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": timeout, "peak_rss_mb": float("nan"), "exit": "timeout", "message": "", "report": None, "stderr": ""}
    lines = run.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"seconds": float("nan"), "peak_rss_mb": float("nan"), "exit": run.returncode, "message": ""}
    result["stderr"] = run.stderr[-4000:]
    result["report"] = json.loads(report.read_text()) if report.exists() and report.stat().st_size else None
    return result
