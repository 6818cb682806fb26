"""Hostile and broken inputs: every one ends in a bounded result, never a traceback.

Each input of the bad-input corpus gives either a report whose input table lists the file with its
status and the reason, or exit 2 with a message that names it. Nothing is ever written inside the
analysed directory: every run here snapshots the tree (names, types, sizes, modes, mtimes, link
targets) before and after.

The small items are committed under fixtures/bad-inputs/ (written by its make.py); the large ones
(a 200 MB line, gzip bombs, 100,000 files) and the ones a checkout cannot carry (symlinks, FIFOs,
sockets, unreadable files and directories) are generated here into tmp_path. CI runs as root, and
root reads files whatever their mode, so unreadable files and directories are simulated there by
making `open` / `os.scandir` raise the PermissionError a normal user would get. Time and memory
are measured by bench/bench_bad_input.py, not asserted here.
"""

from __future__ import annotations

import builtins
import gzip
import io
import json
import os
import pickle
import re
import runpy
import shutil
import socket
import stat
import subprocess
import tarfile
import zipfile
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import polars as pl
import pytest
from click.testing import CliRunner

import analyzer.api as api_module
import analyzer.io.inputs as inputs_module
import analyzer.io.walk as discover_module
from analyzer.api import analyze
from analyzer.cli import main

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "fixtures" / "bad-inputs"
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
CASE_JOB = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
CASE_LOG = CASE_JOB / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log"
STATUSES = {"parsed", "partial", "skipped", "error"}
# The NCCL WARN every text item of the corpus carries (fixtures/bad-inputs/make.py).
WARN_PEER = "10.0.35.1<49189>"
WARN_LINE = ("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> "
             "with error 4, opcode 5327, len 5327, vendor err 81 (Send)")
HANG_SECONDS = 240  # a FIFO opened for reading, a symlink loop followed: that test fails instead of hanging CI
# SIGALRM fails the one test that passes the bound; the run goes on to its summary.
pytestmark = pytest.mark.timeout(HANG_SECONDS, method="signal")


# --- harness --------------------------------------------------------------------------------------


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything under `root`, links not followed: what a write, a create or a delete would change."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for path in [Path(dirpath), *(Path(dirpath) / n for n in dirnames + filenames)]:
            st = path.lstat()
            link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            state[path.relative_to(root).as_posix()] = (st.st_mode, st.st_size, st.st_mtime_ns, link)
    return state


@contextmanager
def untouched(root: Path):
    before = tree_state(root)
    yield
    assert tree_state(root) == before, "the analysis wrote inside the analysed directory"


def run_cli(job: Path, *args: object):
    with untouched(job if job.is_dir() else job.parent):
        result = CliRunner().invoke(main, ["analyze", str(job), *map(str, args)], catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


def json_report(job: Path, *args: object) -> tuple[int, dict]:
    result = run_cli(job, "--format", "json", *args)
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    assert {i["status"] for i in report["inputs"]} <= STATUSES
    return result.exit_code, report


def inputs_of(report: dict) -> dict[str, dict]:
    return {i["file"]: i for i in report["inputs"]}


def cannot_analyse(job: Path, *fragments: str) -> str:
    """Exit 2, and the message names every fragment (the file, the reason)."""
    result = run_cli(job)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    for fragment in fragments:
        assert fragment in message, message
    return message


def job_with(tmp_path: Path, *files: Path, companion: bool = True) -> Path:
    """A job directory holding copies of `files`, plus a real crash log unless `companion` is False."""
    job = tmp_path / "job"
    job.mkdir(parents=True, exist_ok=True)
    for file in files:
        shutil.copyfile(file, job / file.name)
    if companion:
        shutil.copyfile(CASE_LOG, job / "rank0.stderr.log")
    return job


def events_of(job: Path, name: str) -> pl.DataFrame:
    with untouched(job):
        events = analyze(job).events
    return events.filter(pl.col("file") == name)


# --- the committed corpus -------------------------------------------------------------------------

# file -> (status, reason pattern, whether the NCCL WARN inside must still be found)
EXPECTED = {
    "empty.log": ("skipped", r"^empty file$", False),
    "binary-garbage.bin": ("skipped", r"^binary content", False),
    "nul-padded.log": ("partial", r"^4096 NUL bytes dropped", True),
    "nul-only.log": ("skipped", r"^nothing but NUL bytes", False),
    "invalid-utf8.log": ("parsed", r"^\d+ invalid UTF-8 sequence\(s\) shown as U\+FFFD$", True),
    "utf16le-bom.log": ("parsed", r"^$", True),
    "utf16be-nobom.log": ("parsed", r"^$", True),
    "invalid-utf16.log": ("parsed", r"^\d+ invalid UTF-16 sequence\(s\) shown as U\+FFFD$", True),
    "crlf-ansi.log": ("parsed", r"^$", True),
    "truncated.log.gz": ("error", r"ended before the end-of-stream marker", False),
    "corrupted.log.gz": ("error", r"Error -3 while decompressing|CRC check failed|Not a gzipped file", False),
    "interleaved-ranks.log": ("parsed", r"^$", True),  # the spliced WARN is cut out of its line: see below
    "markup.log": ("parsed", r"^$", True),
}
ARCHIVES = {"traversal.tar"}
NOT_INPUTS = {"make.py", "README.md", "__pycache__"}


def test_every_committed_item_has_a_test():
    on_disk = {p.name for p in BAD.iterdir()} - NOT_INPUTS
    assert on_disk == set(EXPECTED) | ARCHIVES


def test_committed_corpus_is_what_make_py_writes():
    make = runpy.run_path(str(BAD / "make.py"), run_name="bad_inputs_make")  # compiled in memory: no __pycache__
    for name, data in make["files"]().items():
        assert (BAD / name).read_bytes() == data, f"{name} differs from make.py's output: run fixtures/bad-inputs/make.py"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_beside_a_real_log_is_listed_with_its_reason(tmp_path, name):
    status, reason, has_warn = EXPECTED[name]
    job = job_with(tmp_path, BAD / name)
    code, report = json_report(job)
    assert code == 1  # the real log's failure is still found
    entry = inputs_of(report)[name]
    assert entry["status"] == status and re.search(reason, entry["reason"]), entry
    assert inputs_of(report)["rank0.stderr.log"]["status"] == "parsed"
    if has_warn:
        warn = events_of(job, name).filter(pl.col("kind") == "nccl.warn")
        assert WARN_PEER in warn.get_column("peer").to_list(), warn
        assert not warn.get_column("message").str.contains(r"[\x00\r\x1b]").any()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_alone_gives_a_report_or_exit_two(tmp_path, name):
    status, reason, _ = EXPECTED[name]
    job = job_with(tmp_path, BAD / name, companion=False)
    if status in ("skipped", "error"):
        message = cannot_analyse(job, "nothing readable", name)
        assert re.search(reason.strip("^$"), message)
    else:
        _, report = json_report(job)
        assert inputs_of(report)[name]["status"] == status


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_given_as_the_job_itself(name):
    """`postmortem analyze FILE`: the committed file is read where it lies, and nothing is written beside it."""
    status, reason, _ = EXPECTED[name]
    if status in ("skipped", "error"):
        cannot_analyse(BAD / name, "nothing readable", name)
    else:
        _, report = json_report(BAD / name)
        assert [(i["file"], i["status"]) for i in report["inputs"]] == [(name, status)]


def test_crlf_and_colour_codes_parse_like_the_clean_log(tmp_path):
    (tmp_path / "clean").mkdir()
    clean = tmp_path / "clean" / "crlf-ansi.log"
    clean.write_bytes(re.sub(rb"\x1b\[[0-9;]*m|\r", b"", (BAD / "crlf-ansi.log").read_bytes()))
    fields = ["line", "kind", "host", "pid", "rank", "seq", "op", "numel_in", "timeout_ms", "peer", "code", "message"]
    dirty = events_of(job_with(tmp_path, BAD / "crlf-ansi.log", companion=False), "crlf-ansi.log").select(fields)
    assert dirty.height >= 3
    assert dirty.equals(events_of(clean.parent, "crlf-ansi.log").select(fields))


def test_utf16_parses_like_utf8(tmp_path):
    fields = ["line", "kind", "host", "pid", "rank", "seq", "op", "peer", "code", "message"]
    frames = []
    for name in ("utf16le-bom.log", "utf16be-nobom.log"):
        job = job_with(tmp_path / name, BAD / name, companion=False)
        frames.append(events_of(job, name).select(fields))
    utf8 = tmp_path / "utf8"
    utf8.mkdir()
    (utf8 / "x.log").write_bytes((BAD / "utf16be-nobom.log").read_bytes().decode("utf-16-be").encode())
    reference = events_of(utf8, "x.log").select(fields)
    assert reference.height >= 3
    for frame in frames:
        assert frame.equals(reference)


def test_tar_with_traversal_names_and_links_is_read_in_place(tmp_path, monkeypatch):
    job = job_with(tmp_path, BAD / "traversal.tar")
    workdir = tmp_path / "cwd" / "a" / "b"
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)  # where a careless extract of `../../escape/rank0.log` would land
    _, report = json_report(job)
    members = {k.split("!", 1)[1]: v for k, v in inputs_of(report).items() if k.startswith("traversal.tar!")}
    for name in ("../../escape/rank0.log", "/etc/cron.d/rank1.log"):
        assert members[name]["status"] == "parsed" and "escapes the archive root" in members[name]["reason"]
    for name in ("logs/passwd", "logs/up", "logs/shadow"):
        assert (members[name]["status"], members[name]["reason"]) == ("skipped", "link inside archive; not followed")
    for name in ("logs/fifo", "logs/null"):
        assert members[name]["status"] == "skipped" and "device or FIFO" in members[name]["reason"]
    assert members["logs/rank2.log.gz"]["status"] == "parsed"  # a compressed member is read too
    assert sorted(os.listdir(tmp_path / "cwd")) == ["a"] and not (tmp_path / "escape").exists()
    assert not Path("/etc/cron.d/rank1.log").exists()
    warn = events_of(job, "traversal.tar!../../escape/rank0.log").filter(pl.col("kind") == "nccl.warn")
    assert warn.get_column("peer").to_list() == [WARN_PEER]


def test_truncated_tar_lists_what_it_holds(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("a/rank0.log", WARN_LINE.encode() + b"\n"), ("a/rank1.log", CASE_LOG.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    job = tmp_path / "job"
    job.mkdir()
    (job / "logs.tar").write_bytes(buffer.getvalue()[: 512 * 4 + 1000])  # cut inside the second member
    _, report = json_report(job)
    entries = inputs_of(report)
    assert entries["logs.tar!a/rank0.log"]["status"] == "parsed"
    assert entries["logs.tar!a/rank1.log"]["status"] == "error"
    assert "archive ends inside this member" in entries["logs.tar!a/rank1.log"]["reason"]


# --- generated: empty, huge, compressed ------------------------------------------------------------


def test_zero_length_job_directory(tmp_path):
    cannot_analyse(tmp_path, "holds no files")
    (tmp_path / "attempt_0" / "0").mkdir(parents=True)
    cannot_analyse(tmp_path, "holds no files")


def test_only_unreadable_inputs_exit_two_naming_them(tmp_path):
    names = ["binary-garbage.bin", "corrupted.log.gz", "empty.log", "nul-only.log", "truncated.log.gz"]
    job = job_with(tmp_path, *(BAD / n for n in names), companion=False)
    message = cannot_analyse(job, "nothing readable", *names)
    assert "empty file" in message and "binary content" in message


def test_200_mb_line_without_newline_keeps_its_head(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    block = (WARN_LINE + " ") * 4096
    with open(job / "runaway.log", "w") as fh:
        while fh.tell() < 200 << 20:
            fh.write(block)
    code, report = json_report(job)
    entry = inputs_of(report)["runaway.log"]
    assert (entry["status"], entry["lines"]) == ("partial", 1)
    assert re.fullmatch(r"1 line\(s\) longer than \d+ characters cut", entry["reason"])
    assert code == 1  # the head of the line is still the NCCL WARN it started with
    warn = events_of(job, "runaway.log").filter(pl.col("kind") == "nccl.warn")
    assert warn.select("line", "peer").rows() == [(1, WARN_PEER)]
    (job / "runaway.log").unlink()  # pytest keeps the last runs' tmp_path: do not keep 200 MB


def _gzip_members(chunk: bytes, copies: int) -> bytes:
    """A multi-member gzip stream: cheap to write, expands to len(chunk) * copies."""
    return gzip.compress(chunk, compresslevel=9, mtime=0) * copies


def test_gzip_bombs_stop_at_the_cap(tmp_path):
    job = job_with(tmp_path)
    (job / "text-bomb.log.gz").write_bytes(_gzip_members(b"A" * (1 << 20), 1024))  # 1 GiB of one line
    (job / "zero-bomb.log.gz").write_bytes(_gzip_members(bytes(1 << 20), 4096))  # 4 GiB of NULs
    (job / "nested.log.gz.gz").write_bytes(gzip.compress(_gzip_members(b"A" * (1 << 20), 64), mtime=0))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = _gzip_members(b"B" * (1 << 20), 1024)
        info = tarfile.TarInfo("inner/bomb.log.gz")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (job / "bombs.tar").write_bytes(buffer.getvalue())
    code, report = json_report(job)
    assert code == 1
    entries = inputs_of(report)
    for name in ("text-bomb.log.gz", "bombs.tar!inner/bomb.log.gz"):
        assert entries[name]["status"] == "error" and "possible gzip bomb" in entries[name]["reason"], entries[name]
    assert entries["zero-bomb.log.gz"]["status"] == "skipped"  # NULs from its first block: never inflated further
    assert entries["nested.log.gz.gz"]["status"] == "skipped"  # a .gz inside a .gz is not opened again
    (job / "rank0.stderr.log").unlink()
    (job / "zero-bomb.log.gz").unlink()
    (job / "nested.log.gz.gz").unlink()
    cannot_analyse(job, "nothing readable", "possible gzip bomb")


def test_100000_tiny_files(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    for i in range(100_000):
        with open(job / f"r{i:06d}.log", "w") as fh:
            fh.write(f"[rank{i}]:[W1130 14:57:21.464574780 Utils.hpp:137] Warning: tiny file {i}\n")
    result = run_cli(job, "--format", "json", "--output", tmp_path / "report.json")
    assert result.exit_code in (0, 1), result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["inputs"]) == 100_000
    assert {i["status"] for i in report["inputs"]} == {"parsed"}
    assert {i["lines"] for i in report["inputs"]} == {1}
    shutil.rmtree(job)  # pytest keeps the last runs' tmp_path: do not keep 100,000 files


def test_file_count_cap_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(discover_module, "MAX_FILES", 20)
    for i in range(30):
        (tmp_path / f"r{i:02d}.log").write_text(WARN_LINE + "\n")
    _, report = json_report(tmp_path)
    capped = [i for i in report["inputs"] if "file cap 20 reached: 10 files not read" in i["reason"]]
    assert len(report["inputs"]) == 21 and len(capped) == 1 and capped[0]["status"] == "skipped"


# --- generated: links, special files, permissions, names -------------------------------------------


def test_symlinks_out_of_the_root_loops_and_dangling(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text(WARN_LINE + "\n")
    job = job_with(tmp_path)
    (job / "logs").mkdir()
    links = {
        "out-file.log": outside / "secret.log",
        "out-dir": outside,
        "dev-zero.log": Path("/dev/zero"),
        "self-loop.log": job / "self-loop.log",
        "loop-a.log": job / "loop-b.log",
        "loop-b.log": job / "loop-a.log",
        "dangling.log": job / "missing.log",
        "relative-up.log": Path("../outside/secret.log"),
        "inside.log": job / "rank0.stderr.log",
        "logs/dir-loop": Path(".."),
    }
    for name, target in links.items():
        os.symlink(target, job / name)
    os.mkfifo(job / "pipe.log")
    os.symlink(job / "pipe.log", job / "to-pipe.log")
    _, report = json_report(job)
    entries = inputs_of(report)
    expected = {
        "out-file.log": r"outside the job directory",
        "out-dir": r"symlink to a directory; not followed",
        "dev-zero.log": r"outside the job directory",
        "self-loop.log": r"symlink loop",
        "loop-a.log": r"symlink loop",
        "loop-b.log": r"symlink loop",
        "dangling.log": r"dangling symlink",
        "relative-up.log": r"outside the job directory",
        "logs/dir-loop": r"symlink to a directory; not followed",
        "pipe.log": r"not a regular file",
        "to-pipe.log": r"not a regular file",
    }
    for name, reason in expected.items():
        assert entries[name]["status"] == "skipped" and re.search(reason, entries[name]["reason"]), entries[name]
    assert entries["inside.log"]["status"] == "parsed"  # a link that stays inside the job is read


def test_fifo_and_socket_are_never_opened(tmp_path):
    job = job_with(tmp_path)
    os.mkfifo(job / "stdout.log")  # opening it for reading would block forever: no writer
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(job / "agent.sock"))
        _, report = json_report(job)
    finally:
        server.close()
    entries = inputs_of(report)
    for name in ("stdout.log", "agent.sock"):
        assert (entries[name]["status"], entries[name]["reason"]) == ("skipped", "not a regular file")


def test_special_roots_exit_two(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    for root in (tmp_path / "fifo", Path("/dev/null")):
        result = CliRunner().invoke(main, ["analyze", str(root)], catch_exceptions=False)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    for root in (tmp_path / "loop", tmp_path / "dangling"):
        cannot_analyse(root, "no such file or directory")


def _deny(paths: set[Path]):
    """Open/scandir stand-ins that raise what a non-root user gets for `paths` (root is never refused)."""
    real_open, real_scandir = builtins.open, os.scandir

    def fake_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file) in paths:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    def fake_scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) in paths:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    return fake_open, fake_scandir


def test_unreadable_file_and_directory(tmp_path, monkeypatch):
    job = job_with(tmp_path)
    secret, hidden = job / "secret.log", job / "hidden"
    secret.write_text(WARN_LINE + "\n")
    hidden.mkdir()
    (hidden / "rank1.log").write_text(WARN_LINE + "\n")
    secret.chmod(0)
    hidden.chmod(0)
    try:
        if os.geteuid() == 0:  # root ignores modes: make the reads fail the way they fail for a user
            fake_open, fake_scandir = _deny({secret, hidden})
            monkeypatch.setattr(discover_module, "open", fake_open, raising=False)
            monkeypatch.setattr(os, "scandir", fake_scandir)
        _, report = json_report(job)
    finally:
        secret.chmod(0o644)
        hidden.chmod(0o755)
    entries = inputs_of(report)
    assert (entries["secret.log"]["status"], entries["secret.log"]["reason"]) == ("error", "unreadable: Permission denied")
    assert (entries["hidden/"]["status"], entries["hidden/"]["reason"]) == ("error", "cannot list directory: Permission denied")
    assert entries["rank0.stderr.log"]["status"] == "parsed"


def test_file_unreadable_after_discovery(tmp_path, monkeypatch):
    """Rotated or revoked between discovery and parsing: that file fails, the job goes on."""
    job = job_with(tmp_path)
    late = job / "late.log"
    late.write_text(WARN_LINE + "\n")
    real_open, real_discover = builtins.open, api_module.discover_job
    discovered = []

    def discover_then_revoke(root):
        found = real_discover(root)
        discovered.append(root)
        return found

    def open_until_discovered(file, *args, **kwargs):
        if discovered and isinstance(file, (str, os.PathLike)) and Path(file) == late:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(api_module, "discover_job", discover_then_revoke)
    monkeypatch.setattr(inputs_module, "open", open_until_discovered, raising=False)
    code, report = json_report(job)
    entry = inputs_of(report)["late.log"]
    assert entry["status"] == "error" and "Permission denied" in entry["reason"]
    assert code == 1


def test_hostile_file_names_are_escaped(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    names = {
        b"bad\xff\xfe.log": "bad\\xff\\xfe.log",
        b"esc\x1b[2Jname.log": "esc\\x1b[2Jname.log",
        b"new\nline.log": "new\\x0aline.log",
        b"bell\x07\xc2\x9b.log": "bell\\x07\\x9b.log",  # BEL, and CSI (U+009B) written as UTF-8
        "<img src=x onerror=alert(1)>.log".encode(): "<img src=x onerror=alert(1)>.log",
    }
    for raw in names:
        with open(os.path.join(os.fsencode(job), raw), "wb") as fh:
            fh.write(WARN_LINE.encode() + b"\n")
    code, report = json_report(job)
    entries = inputs_of(report)
    for shown in names.values():
        assert entries[shown]["status"] == "parsed", entries
    assert all(not re.search(r"[\x00-\x1f\x7f-\x9f]", name) for name in entries)
    text = run_cli(job).output
    assert "\x1b" not in text and "\x07" not in text


# --- safety ----------------------------------------------------------------------------------------


class _Runs:
    """Pickles as `fn(*args)`: unpickling it with `pickle.load` would run the call."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _legacy_torch_save(obj) -> bytes:
    """torch.save's pre-zip layout: magic number, protocol, sys info, then the object's pickle."""
    parts = [0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True}, obj]
    return b"".join(pickle.dumps(p, protocol=2) for p in parts) + pickle.dumps([], protocol=2)


def test_pickles_that_would_run_code_are_refused_and_run_nothing(tmp_path):
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    marks = [sentinel / f"ran-{i}" for i in range(6)]
    payloads = [
        _Runs(os.system, f"touch {marks[0]}"),
        _Runs(builtins.exec, f"open({str(marks[1])!r}, 'w').close()"),
        _Runs(subprocess.Popen, ["touch", str(marks[2])]),
        _Runs(builtins.eval, f"__import__('pathlib').Path({str(marks[3])!r}).touch()"),
        _Runs(os.mkdir, str(marks[4])),
        _Runs(shutil.copyfile, str(CASE_LOG), str(marks[5])),
    ]
    job = job_with(tmp_path)
    (job / "fr").mkdir()
    (job / "mem").mkdir()
    (job / "ckpt").mkdir()
    for protocol in (2, 4, 5):
        (job / "fr" / f"nccl_trace_rank_{protocol}").write_bytes(
            pickle.dumps({"version": "2.4", "entries": [{"profiling_name": "nccl:all_reduce", "x": payloads}]}, protocol=protocol))
    (job / "mem" / "snapshot.pickle").write_bytes(
        pickle.dumps({"segments": [{"blocks": payloads}], "device_traces": [[]]}, protocol=4))
    (job / "ckpt" / "legacy.pt").write_bytes(_legacy_torch_save({"model": payloads}))
    with zipfile.ZipFile(job / "ckpt" / "model.pt", "w") as archive:
        archive.writestr("model/data.pkl", pickle.dumps({"state_dict": payloads}, protocol=2))
        archive.writestr("model/version", "3\n")
        archive.writestr("model/byteorder", "little")
    code, report = json_report(job)
    assert not any(m.exists() for m in marks), "a pickle ran code"
    entries = inputs_of(report)
    for name in ("fr/nccl_trace_rank_2", "fr/nccl_trace_rank_4", "fr/nccl_trace_rank_5", "mem/snapshot.pickle"):
        assert entries[name]["status"] == "error" and re.match(r"unsafe pickle, not loaded: refused to load global", entries[name]["reason"])
    assert code == 1 and entries["rank0.stderr.log"]["status"] == "parsed"
    checkpoints = {c["path"]: c for c in report["checkpoints"]}
    for name in ("ckpt/legacy.pt", "ckpt/model.pt"):  # audited by the symbolic unpickler: refused, not loaded
        assert checkpoints[name]["problem"] == "unsafe" and "posix.system" in checkpoints[name]["unsafe_globals"]


class _Tags(HTMLParser):
    """Element kinds of a page: (tag, attribute names), event-handler attributes, script elements."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.kinds: set[tuple[str, tuple[str, ...]]] = set()
        self.handlers: list[str] = []
        self.scripts = 0
        self.urls: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.kinds.add((tag, tuple(sorted(name for name, _ in attrs))))
        self.handlers += [name for name, _ in attrs if name.startswith("on")]
        self.scripts += tag == "script"
        self.urls += [v or "" for name, v in attrs if name in ("href", "src", "action", "formaction")]


def test_log_markup_is_inert_in_the_html_report(tmp_path):
    """Log lines and file names carrying markup add no element, attribute or script to the page.

    The page of a job whose logs and file names are hostile has only the element kinds (tag and
    attribute names) of a control job's page; the HTML renderer's own tests check the escaping
    itself and run the page in a browser (tests/test_render_html.py).
    """
    control = job_with(tmp_path / "control", BAD / "binary-garbage.bin")
    (control / "plain.log").write_text(WARN_LINE + "\n")
    hostile = job_with(tmp_path / "hostile", BAD / "binary-garbage.bin", BAD / "markup.log")
    (hostile / "<img src=x onerror=alert(4)>.log").write_text(WARN_LINE + " <svg/onload=alert(5)>\n")
    pages = []
    for job in (control, hostile):
        result = run_cli(job, "--html", tmp_path / f"{job.parent.name}.html")
        assert result.exit_code == 1, result.output
        pages.append(_Tags((tmp_path / f"{job.parent.name}.html").read_text(encoding="utf-8")))
    control_page, hostile_page = pages
    assert hostile_page.kinds <= control_page.kinds, hostile_page.kinds - control_page.kinds
    assert hostile_page.scripts == control_page.scripts
    assert hostile_page.handlers == [] and not any(re.match(r"\s*(?:javascript|https?):", u, re.I) for u in hostile_page.urls)


def test_log_control_sequences_are_inert_in_the_terminal_report(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_text(CASE_LOG.read_text().replace(
        "before timing out.", "before timing out.\x1b]0;owned\x07\x1b[2J\x1b[8m", 1))
    result = run_cli(job)
    assert result.exit_code == 1
    assert "before timing out." in result.output
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", result.output)


# --- interleaving -----------------------------------------------------------------------------------

HALF_TIMEOUT = "[rank0]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] [Rank 0] Watchdog caught collective "
REST_TIMEOUT = ("operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=20000) "
                "ran for 20068 milliseconds before timing out.\n")
STATUS_RANK1 = ("[rank1]:[E1130 14:57:47.100538635 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
                "Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the "
                "debug info. Last enqueued NCCL work: 1, last completed NCCL work: 1.\n")


def _interleaved_events(tmp_path: Path, text: str) -> pl.DataFrame:
    job = tmp_path / "job"
    job.mkdir()
    (job / "console.log").write_text(text)
    return events_of(job, "console.log").filter(pl.col("kind") != "log.last")


def test_interleaved_nccl_lines_keep_each_process(tmp_path):
    """Process 3071's WARN landed inside process 25146's half-written INFO line."""
    info = "kolyoz2:25146:25146 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    warn = WARN_LINE.replace("kolyoz2:25146", "kolyoz3:3071") + "\n"
    events = _interleaved_events(tmp_path, info[:30] + warn + info[30:])
    row = events.filter(pl.col("kind") == "nccl.warn").select("line", "host", "pid", "peer").rows()
    assert row == [(1, "kolyoz3", 3071, WARN_PEER)]


@pytest.mark.parametrize("wrap", ["{}", "[default{r}]:{}", "{r}: {}"], ids=["torch", "torchrun-tee", "srun-label"])
def test_interleaved_rank_prefixes_keep_each_rank(tmp_path, wrap):
    def prefixed(line: str, rank: int) -> str:
        return wrap.format(line, r=rank)

    text = prefixed(HALF_TIMEOUT, 0) + prefixed(STATUS_RANK1, 1) + REST_TIMEOUT
    events = _interleaved_events(tmp_path, text)
    # The status record itself (a vocabulary hit on its line is another event with the same fields).
    status = events.filter(pl.col("last_enqueued").is_not_null() & ~pl.col("kind").str.starts_with("vocab."))
    assert status.select("line", "rank", "last_enqueued", "last_completed").rows() == [(1, 1, 1, 1)]
    # Rank 0's half line and the orphaned rest blame nobody else's content on rank 0.
    assert events.filter((pl.col("rank") == 0) & pl.col("message").str.contains("dump signal")).height == 0


def test_the_orphaned_rest_of_a_split_line_is_not_given_the_spliced_rank(tmp_path):
    """Rank 0's line ends on the next physical line, without a prefix: it must not inherit rank 1's."""
    events = _interleaved_events(tmp_path, HALF_TIMEOUT + STATUS_RANK1 + REST_TIMEOUT)
    rest = events.filter(pl.col("line") == 2)
    assert rest.get_column("rank").drop_nulls().to_list() in ([], [0])


WRAPS = pytest.mark.parametrize("wrap", ["{}", "[default{r}]:{}", "{r}: {}"], ids=["torch", "torchrun-tee", "srun-label"])
WARN_3071 = WARN_LINE.replace("kolyoz2:25146", "kolyoz3:3071") + "\n"


@WRAPS
def test_an_nccl_record_spliced_into_a_rank_line_keeps_its_process_not_the_rank(tmp_path, wrap):
    """Process 3071's WARN landed inside rank 0's half-written watchdog line, each under the file's wrapper.

    Rank 1's own line follows, so the file is no single rank's (correlate would give it all to that one).
    """
    text = wrap.format(HALF_TIMEOUT, r=0) + wrap.format(WARN_3071, r=1) + REST_TIMEOUT + wrap.format(STATUS_RANK1, r=1)
    events = _interleaved_events(tmp_path, text)
    warn = events.filter(pl.col("kind") == "nccl.warn")
    # Under torchrun's tee the record came out of local rank 1's stream, and rank 1's own line in the same
    # file pairs local rank 1 with rank 1 (correlate's local-rank mapping): its rank is that stream's.
    expected_ranks = {"{}": (None, None), "[default{r}]:{}": (1, 1), "{r}: {}": (1, None)}[wrap]
    assert warn.select("line", "host", "pid", "peer", "rank", "local_rank").rows() == [
        (1, "kolyoz3", 3071, WARN_PEER, *expected_ranks)
    ]
    assert warn.item(0, "text") == wrap.format(WARN_3071.rstrip("\n"), r=1)  # the evidence shows the record, not the line
    # A vocabulary hit annotates the record it was found in: same attribution as the WARN.
    vocabulary = events.filter((pl.col("line") == 1) & pl.col("kind").str.starts_with("vocab."))
    assert set(vocabulary.select("rank", "local_rank").rows()) <= {expected_ranks}
    half = events.filter((pl.col("line") == 1) & (pl.col("kind") != "nccl.warn") & ~pl.col("kind").str.starts_with("vocab."))
    assert half.select("rank", "kind").rows() == [(0, "c10d.error")]
    assert not half.get_column("message").str.contains("NET/IB").any()


@WRAPS
def test_interleaved_records_keep_the_wrappers_local_rank(tmp_path, wrap):
    text = wrap.format(HALF_TIMEOUT, r=0) + wrap.format(STATUS_RANK1, r=1) + REST_TIMEOUT
    events = (_interleaved_events(tmp_path, text).filter((pl.col("line") == 1) & ~pl.col("kind").str.starts_with("vocab."))
              .sort("last_enqueued", nulls_last=True))  # the line's own records, not its vocabulary hits
    local = {"{}": [None, None], "[default{r}]:{}": [1, 0], "{r}: {}": [None, None]}[wrap]
    assert events.select("rank", "local_rank", "kind").rows() == [
        (1, local[0], "watchdog.pg_status"), (0, local[1], "c10d.error")
    ]


def test_a_spliced_nccl_host_is_told_from_the_cut_word_by_the_hosts_the_file_names(tmp_path):
    """Rank 0 was cut inside a word (`collect`): the host `kolyoz3`, known from line 1, is where the record starts."""
    first = "kolyoz3:3071:3071 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    events = _interleaved_events(tmp_path, first + HALF_TIMEOUT[:-4] + WARN_3071 + "ve " + REST_TIMEOUT)
    warn = events.filter(pl.col("kind") == "nccl.warn")
    assert warn.select("line", "host", "pid", "tid", "peer").rows() == [(2, "kolyoz3", 3071, 25854, WARN_PEER)]
    half = events.filter((pl.col("line") == 2) & (pl.col("kind") == "c10d.error"))
    assert half.item(0, "message").endswith("Watchdog caught collect") and half.item(0, "rank") == 0


def test_a_spliced_nccl_record_keeps_its_own_timestamp(tmp_path):
    events = _interleaved_events(tmp_path, HALF_TIMEOUT + "[2025-03-12 10:11:12.123] " + WARN_3071 + REST_TIMEOUT)
    warn = events.filter(pl.col("kind") == "nccl.warn").row(0, named=True)
    assert (warn["line"], warn["host"], warn["ts_source"], str(warn["ts"])) == (
        1, "kolyoz3", "nccl", "2025-03-12 10:11:12.123000+00:00"
    )


def test_a_labelled_file_reads_a_spliced_label_and_an_unlabelled_one_does_not(tmp_path):
    """`3: ` before a spliced record is srun's label only in a file whose lines carry labels."""
    (tmp_path / "labelled").mkdir()
    events = _interleaved_events(tmp_path / "labelled", "0: " + HALF_TIMEOUT + "3: " + WARN_3071 + "0: " + REST_TIMEOUT)
    assert events.filter(pl.col("kind") == "nccl.warn").select("rank", "host").rows() == [(3, "kolyoz3")]
    events = _interleaved_events(tmp_path, "listening on port 3: " + WARN_3071 + "plain text\n")
    assert events.filter(pl.col("kind") == "nccl.warn").select("rank", "host").rows() == [(None, "kolyoz3")]


def test_interleaved_lines_are_counted_as_physical_lines(tmp_path):
    """Two records on line 1 make two events but one recognised line; the orphaned rest is unparsed."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "console.log").write_text(HALF_TIMEOUT + WARN_3071 + REST_TIMEOUT)
    _, report = json_report(job)
    entry = inputs_of(report)["console.log"]
    assert (entry["lines"], entry["unparsed_lines"]) == (2, 1)
    events = events_of(job, "console.log").filter(pl.col("kind") != "log.last")
    records = events.filter(~pl.col("kind").str.starts_with("vocab."))  # vocabulary hits annotate a record's line
    assert records.select("line", "kind").rows() == [(1, "c10d.error"), (1, "nccl.warn")]
    assert set(events.filter(pl.col("kind").str.starts_with("vocab."))["line"].to_list()) <= {1}
