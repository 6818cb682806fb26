"""Logs as people send them: every archive and compression kind, standard input, and the bomb caps.

Archives are built at test time from a recorded case, in every kind (`.tar`, `.tar.gz`, `.tgz`,
`.tar.xz`, `.tar.bz2`, `.tar.zst`, `.zip`; single `.gz`, `.xz`, `.bz2`, `.zst` files) and must give
the verdict the plain files give. Kinds are told by content: the names here are chosen to mislead.
The bombs are concatenated compressed members (cheap to write, gigabytes to inflate); each is run
in a child process whose peak RSS is measured with `resource.getrusage(RUSAGE_CHILDREN)`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from analyzer.cli import main
from analyzer.io import discover, iter_text_chunks
from analyzer.io.archives import MAX_ARCHIVE_MEMBER_BYTES

ROOT = Path(__file__).resolve().parents[1]
CASE_JOB = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
CASE_LOG = CASE_JOB / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log"
MB = 1 << 20
RSS_BOUND_KB = 1 << 20  # 1 GiB, in ru_maxrss's kilobytes
pytestmark = pytest.mark.timeout(120)

COMPRESS = {
    "gzip": lambda data: gzip.compress(data, compresslevel=9, mtime=0),
    "xz": lzma.compress,
    "bzip2": bz2.compress,
    "zstd": lambda data: zstandard.ZstdCompressor(level=19).compress(data),
}
# archive kind -> (codec of the tar stream or None, or "zip")
ARCHIVES = {"tar": None, "tar.gz": "gzip", "tgz": "gzip", "tar.xz": "xz", "tar.bz2": "bzip2", "tar.zst": "zstd",
            "zip": "zip"}
SINGLE = {"gz": "gzip", "xz": "xz", "bz2": "bzip2", "zst": "zstd"}


def case_files() -> list[tuple[str, bytes]]:
    return [(p.relative_to(CASE_JOB).as_posix(), p.read_bytes()) for p in sorted(CASE_JOB.rglob("*")) if p.is_file()]


def tar_bytes(files: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_bytes(files: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zf.writestr(name, data)
    return buffer.getvalue()


def archive(kind: str, files: list[tuple[str, bytes]]) -> bytes:
    codec = ARCHIVES[kind]
    if codec == "zip":
        return zip_bytes(files)
    data = tar_bytes(files)
    return COMPRESS[codec](data) if codec else data


def analyze_json(target: str | Path, stdin: bytes | None = None) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(main, ["analyze", str(target), "--format", "json"], input=stdin, catch_exceptions=False)
    assert "Traceback" not in result.output
    report = json.loads(result.stdout) if result.exit_code in (0, 1) else None
    return result.exit_code, report, result.output


def verdict(report: dict) -> tuple[str, list[int]]:
    return report["verdict"]["category"], report["verdict"]["culprit_ranks"]


@pytest.fixture(scope="module")
def reference() -> tuple[str, list[int]]:
    code, report, _ = analyze_json(CASE_JOB)
    assert code == 1
    return verdict(report)


@pytest.fixture(scope="module")
def single_reference() -> tuple[str, list[int]]:
    code, report, _ = analyze_json(CASE_LOG)
    assert code == 1
    return verdict(report)


@pytest.mark.parametrize("kind", sorted(ARCHIVES))
def test_every_archive_kind_gives_the_directorys_verdict(tmp_path, kind, reference):
    # Named to mislead: the kind is told from the bytes.
    target = tmp_path / f"case-{kind.replace('.', '-')}.log"
    target.write_bytes(archive(kind, case_files()))
    code, report, output = analyze_json(target)
    assert code == 1, output
    assert verdict(report) == reference
    inputs = {i["file"]: i for i in report["inputs"]}
    member = f"{target.name}!none_rvolrln4/attempt_0/1/stderr.log"
    assert inputs[member]["status"] == "parsed" and 1 in inputs[member]["ranks"]


@pytest.mark.parametrize("kind", sorted(ARCHIVES))
def test_an_archive_inside_a_job_directory_is_read_beside_its_files(tmp_path, kind, reference):
    job = tmp_path / "job"
    job.mkdir()
    files = case_files()
    (job / files[0][0].replace("/", "_")).write_bytes(files[0][1])  # one rank's log beside, the rest packed
    (job / f"rest.{kind}").write_bytes(archive(kind, files[1:]))
    code, report, output = analyze_json(job)
    assert code == 1, output
    assert verdict(report) == reference


@pytest.mark.parametrize("ext", sorted(SINGLE))
def test_every_single_file_compression_reads_like_the_plain_file(tmp_path, ext, single_reference):
    target = tmp_path / f"stderr.{ext}"
    target.write_bytes(COMPRESS[SINGLE[ext]](CASE_LOG.read_bytes()))
    code, report, output = analyze_json(target)
    assert code == 1, output
    assert verdict(report) == single_reference
    assert [(i["file"], i["format"], i["status"]) for i in report["inputs"]] == [(target.name, "text", "parsed")]


def test_concatenated_members_and_frames_are_all_read(tmp_path):
    lines = CASE_LOG.read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    for codec, compress in COMPRESS.items():
        (tmp_path / f"cat.{codec}").write_bytes(compress(b"".join(lines[:half])) + compress(b"".join(lines[half:])))
        (item,) = discover(tmp_path / f"cat.{codec}")
        with item.open_bytes() as fh:
            assert fh.read() == CASE_LOG.read_bytes(), codec


def test_truncated_compressed_files_are_errors_with_the_reason(tmp_path):
    data = CASE_LOG.read_bytes() * 20
    for codec, compress in COMPRESS.items():
        job = tmp_path / codec
        job.mkdir()
        (job / "rank0.stderr.log").write_bytes(CASE_LOG.read_bytes())
        packed = compress(data)
        (job / "cut.log").write_bytes(packed[: len(packed) // 2])
        code, report, output = analyze_json(job)
        assert code == 1, output
        entry = next(i for i in report["inputs"] if i["file"] == "cut.log")
        assert entry["status"] == "error" and entry["reason"], (codec, entry)


def test_a_plain_text_file_with_an_archive_name_is_read_as_text(tmp_path, single_reference):
    target = tmp_path / "logs.tar.gz"
    target.write_bytes(CASE_LOG.read_bytes())
    code, report, _ = analyze_json(target)
    assert code == 1 and verdict(report) == single_reference


def test_a_torch_zip_is_a_checkpoint_and_a_zip_of_logs_is_an_archive(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "model.zip").write_bytes(zip_bytes([("model/data.pkl", b"\x80\x02}q\x00."), ("model/version", b"3\n"),
                                               ("model/data/0", bytes(64))]))
    (job / "logs.zip").write_bytes(zip_bytes(case_files()))
    inputs = {i.path: i for i in discover(job)}
    assert (inputs["model.zip"].format, inputs["model.zip"].status) == ("checkpoint", "skipped")
    assert not any(path.startswith("model.zip!") for path in inputs)
    member = inputs["logs.zip!none_rvolrln4/attempt_0/0/stderr.log"]
    assert (member.format, member.status, member.local_rank_hint) == ("text", "pending", 0)


def test_nested_archives_are_read_one_level_deep(tmp_path):
    inner = archive("tar.gz", case_files())
    deeper = zip_bytes([("deepest.tar", tar_bytes([("rank9.log", CASE_LOG.read_bytes())]))])
    (tmp_path / "outer.zip").write_bytes(zip_bytes([("node1/logs.tar.gz", inner), ("node2/more.zip", deeper)]))
    inputs = {i.path: i for i in discover(tmp_path / "outer.zip")}
    assert inputs["outer.zip!node1/logs.tar.gz!none_rvolrln4/attempt_0/1/stderr.log"].format == "text"
    too_deep = inputs["outer.zip!node2/more.zip!deepest.tar"]
    assert too_deep.status == "skipped" and too_deep.capped and "nested more than 1 level" in too_deep.reason
    assert not any("rank9.log" in path for path in inputs)


def test_traversal_names_in_compressed_archives_stay_inert(tmp_path, monkeypatch):
    workdir = tmp_path / "cwd" / "a" / "b"
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)  # where a careless extract of `../../escape/rank0.log` would land
    files = [("../../escape/rank0.log", CASE_LOG.read_bytes()), ("/tmp/abs-rank1.log", CASE_LOG.read_bytes())]
    job = tmp_path / "job"
    job.mkdir()
    for kind in ("tar.zst", "zip"):
        (job / f"evil.{kind}").write_bytes(archive(kind, files))
    code, report, _ = analyze_json(job)
    assert code == 1
    members = {i["file"]: i for i in report["inputs"] if "!" in i["file"]}
    assert len(members) == 4
    for entry in members.values():
        assert entry["status"] == "parsed" and "escapes the archive root" in entry["reason"], entry
    assert sorted(os.listdir(tmp_path / "cwd")) == ["a"] and not (tmp_path / "escape").exists()
    assert not Path("/tmp/abs-rank1.log").exists()
    assert sorted(os.listdir(job)) == ["evil.tar.zst", "evil.zip"]


# --- standard input -------------------------------------------------------------------------------


@pytest.mark.parametrize("packing", ["plain", "gzip", "zstd", "tar.xz"])
def test_standard_input(packing, reference, single_reference):
    if packing == "plain":
        data, expected = CASE_LOG.read_bytes(), single_reference
    elif packing == "tar.xz":
        data, expected = archive("tar.xz", case_files()), reference
    else:
        data, expected = COMPRESS[packing](CASE_LOG.read_bytes()), single_reference
    code, report, output = analyze_json("-", stdin=data)
    assert code == 1, output
    assert verdict(report) == expected
    assert all(i["file"].startswith("<stdin>") for i in report["inputs"])


def test_empty_standard_input_cannot_be_analysed():
    code, _, output = analyze_json("-", stdin=b"")
    assert code == 2 and "<stdin>" in output and "empty" in output


# --- bombs: each kind, bounded in a child process ----------------------------------------------------


def _repeat_compressed(codec: str, block: bytes, copies: int) -> bytes:
    """`copies` concatenated members (gzip), streams (xz, bzip2) or frames (zstd) of one block."""
    return COMPRESS[codec](block) * copies


def _tar_with_one_member(path: Path, size: int, fill: bytes, codec: str | None) -> None:
    """Write a tar stream holding one member of `size` bytes of `fill`, compressed block by block
    when `codec` is given (a few KB that declare and inflate to hundreds of MB); uncompressed, the
    member is a hole in a sparse file."""
    info = tarfile.TarInfo("big.log")
    info.size, info.mtime = size, 0
    header = info.tobuf(tarfile.GNU_FORMAT)
    if codec is None:
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(len(header) + size + (-size % 512) + 1024)
        return
    block = fill * (MB // len(fill))
    copies, rest = divmod(size, MB)
    trailer = fill[:1] * rest + bytes(-size % 512) + bytes(1024)
    path.write_bytes(COMPRESS[codec](header) + _repeat_compressed(codec, block, copies) + COMPRESS[codec](trailer))


LINE = b"[rank0]:[W1130 14:57:21.464574780 Utils.hpp:137] Warning: the same line again and again\n"


def _bomb(kind: str, job: Path) -> str:
    """Write a bomb of `kind` into `job`; the name of the input row that must carry the reason."""
    if kind in SINGLE:  # 1 GiB of one letter in 1,024 members (deflate's best case, ~1,000:1)
        name = f"bomb.log.{kind}"
        (job / name).write_bytes(_repeat_compressed(SINGLE[kind], b"A" * MB, 1024))
        return name
    if kind == "zip":  # one member of 600 MB of zeros: deflate packs it ~1,000:1
        with zipfile.ZipFile(job / "bomb.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, \
                zf.open("big.log", "w", force_zip64=True) as fh:
            block = bytes(MB)
            for _ in range(600):
                fh.write(block)
        return "bomb.zip!big.log"
    name = f"bomb.{kind}"
    _tar_with_one_member(job / name, MAX_ARCHIVE_MEMBER_BYTES + 64 * MB, LINE, ARCHIVES[kind])  # over the member cap
    return f"{name}!big.log"


def run_in_child(args: list[str], stdin: bytes | None = None) -> dict:
    """`postmortem ARGS` run as a grandchild, so that the peak RSS measured is that run's alone:
    {code, stdout, stderr, rss_kb, seconds}."""
    probe = (
        "import json, resource, subprocess, sys, time\n"
        "start = time.monotonic()\n"
        "done = subprocess.run([sys.executable, '-m', 'analyzer.cli', *sys.argv[1:]], stdin=sys.stdin, capture_output=True)\n"
        "print(json.dumps({'code': done.returncode, 'stdout': done.stdout.decode(), 'stderr': done.stderr.decode(),\n"
        "                  'rss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,\n"
        "                  'seconds': time.monotonic() - start}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *args], input=stdin if stdin is not None else b"",
                          capture_output=True, cwd=ROOT, timeout=110, check=True)
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ARCHIVES) + sorted(SINGLE))
def test_bomb_caps_hold_for_every_kind(tmp_path, kind):
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.stderr.log").write_bytes(CASE_LOG.read_bytes())
    row = _bomb(kind, job)
    assert sum(p.stat().st_blocks * 512 for p in job.iterdir()) < 8 * MB  # small on disk
    run = run_in_child(["analyze", str(job), "--format", "json"])
    assert run["code"] == 1, run["stderr"][-2000:]
    inputs = {i["file"]: i for i in json.loads(run["stdout"])["inputs"]}
    assert inputs["rank0.stderr.log"]["status"] == "parsed"
    entry = inputs[row]
    assert entry["status"] in ("skipped", "error"), entry
    assert any(word in entry["reason"] for word in ("bomb", "larger than")), entry
    assert run["rss_kb"] < RSS_BOUND_KB, f"peak RSS {run['rss_kb']} KB"
    assert run["seconds"] < 60


def _gnu_sparse_member(name: str, real_size: int) -> bytes:
    """An old-GNU sparse header ('S') declaring `real_size` bytes of which one 512-byte block is
    stored, and that block: tar's way of packing a mostly-empty file (tarfile cannot write them)."""
    header = bytearray(512)

    def put(offset: int, width: int, value: bytes) -> None:
        header[offset : offset + len(value)] = value[:width]

    def octal(value: int, width: int) -> bytes:
        return f"{value:0{width - 1}o}".encode() + b"\0"

    put(0, 100, name.encode())
    put(100, 8, octal(0o644, 8))
    put(108, 8, octal(0, 8))
    put(116, 8, octal(0, 8))
    put(124, 12, octal(512, 12))  # stored bytes
    put(136, 12, octal(0, 12))
    put(156, 1, b"S")
    put(257, 8, b"ustar  \0")
    put(386, 12, octal(real_size - 512, 12))  # the one stored block sits at the end of the file
    put(398, 12, octal(512, 12))
    put(483, 12, octal(real_size, 12))
    header[148:156] = b" " * 8
    put(148, 8, f"{sum(header):06o}".encode() + b"\0 ")
    return bytes(header) + b"x" * 511 + b"\n"


@pytest.mark.slow
@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_sparse_tar_of_twelve_500_mb_members_stays_small(tmp_path, codec):
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.stderr.log").write_bytes(CASE_LOG.read_bytes())
    data = b"".join(_gnu_sparse_member(f"sparse{i}.log", 500 * MB) for i in range(12)) + bytes(1024)
    (job / "sparse.tar").write_bytes(COMPRESS[codec](data) if codec else data)
    assert len(data) < 64 << 10
    run = run_in_child(["analyze", str(job), "--format", "json"])
    assert run["code"] == 1, run["stderr"][-2000:]
    inputs = {i["file"]: i for i in json.loads(run["stdout"])["inputs"]}
    for i in range(12):
        entry = inputs[f"sparse.tar!sparse{i}.log"]
        assert entry["status"] == "skipped" and "GNU sparse member" in entry["reason"], entry
    assert run["rss_kb"] < RSS_BOUND_KB // 2, f"peak RSS {run['rss_kb']} KB"


@pytest.mark.slow
def test_a_bomb_on_standard_input_is_capped(tmp_path):
    name = _bomb("gz", tmp_path)
    run = run_in_child(["analyze", "-"], stdin=(tmp_path / name).read_bytes())
    assert run["code"] == 2 and "gzip bomb" in run["stderr"], run["stderr"][-2000:]
    assert run["rss_kb"] < RSS_BOUND_KB and run["seconds"] < 60


# --- names, memory, zip bombs ----------------------------------------------------------------------


def test_a_huge_member_name_is_cut_in_the_report(tmp_path):
    name = "logs/" + "x" * (2 * MB) + "/rank0.log"  # a PAX header carries it
    (tmp_path / "long.tar.gz").write_bytes(COMPRESS["gzip"](tar_bytes([(name, CASE_LOG.read_bytes())], tarfile.PAX_FORMAT)))
    (item,) = discover(tmp_path / "long.tar.gz")
    assert item.format == "text" and len(item.path) < 1100 and "more characters cut" in item.path


def test_the_memory_cap_on_held_members_leaves_a_row(tmp_path, monkeypatch):
    import analyzer.io.archives as discover_module

    monkeypatch.setattr(discover_module, "MAX_HELD_BYTES", 1)  # the first member (read whole) fills it
    (tmp_path / "logs.tar.xz").write_bytes(archive("tar.xz", case_files()))
    first, *rest = discover(tmp_path / "logs.tar.xz")
    assert (first.format, first.status, first.capped) == ("text", "pending", False)
    assert len(rest) == 3 and all(i.capped and i.status == "skipped" and "memory cap" in i.reason for i in rest)


def test_a_member_cut_by_the_memory_cap_is_partial(tmp_path, monkeypatch):
    import analyzer.io.archives as discover_module

    monkeypatch.setattr(discover_module, "MAX_HELD_BYTES", 64 << 10)
    random_text = os.urandom(3 * MB).hex().encode()  # text that does not compress below the cap
    (tmp_path / "big.zip").write_bytes(zip_bytes([("rank0.log", CASE_LOG.read_bytes() + random_text)]))
    (item,) = discover(tmp_path / "big.zip")
    assert item.capped and "memory cap" in item.reason and item.size < 6 * MB
    assert "".join(iter_text_chunks(item)).startswith(CASE_LOG.read_text()[:200])
    assert item.status == "partial"  # read in part: the rest may hold the evidence


def test_standard_input_past_its_cap_is_partial(monkeypatch):
    import analyzer.io.archives as discover_module

    monkeypatch.setattr(discover_module, "MAX_DECOMPRESSED_BYTES", 4096)
    code, report, output = analyze_json("-", stdin=CASE_LOG.read_bytes())
    assert code == 1, output
    (entry,) = report["inputs"]
    assert entry["status"] == "partial" and "longer than 4096 bytes: the first 4096 read" in entry["reason"]


def test_overlapping_zip_entries_are_not_inflated(tmp_path):
    data = zip_bytes([("a.log", CASE_LOG.read_bytes()), ("b.log", CASE_LOG.read_bytes())])
    second = data.index(b"PK\x01\x02", data.index(b"PK\x01\x02") + 4)
    data = data[: second + 42] + (0).to_bytes(4, "little") + data[second + 46 :]  # b.log's header offset -> a.log's
    (tmp_path / "overlap.zip").write_bytes(data)
    inputs = {i.path: i for i in discover(tmp_path / "overlap.zip")}
    for name in ("overlap.zip!a.log", "overlap.zip!b.log"):
        assert inputs[name].status == "skipped" and "overlaps another member" in inputs[name].reason


def test_a_zip_member_over_the_bomb_ratio_is_not_inflated(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.log", bytes(64 * MB))
        zf.writestr("rank0.log", CASE_LOG.read_bytes())
    (tmp_path / "z.zip").write_bytes(buffer.getvalue())
    inputs = {i.path: i for i in discover(tmp_path / "z.zip")}
    assert inputs["z.zip!zeros.log"].status == "skipped" and "possible zip bomb" in inputs["z.zip!zeros.log"].reason
    assert inputs["z.zip!rank0.log"].format == "text"


def test_a_zstd_file_opening_with_a_skippable_frame_is_read(tmp_path):
    skippable = b"\x50\x2a\x4d\x18" + (8).to_bytes(4, "little") + bytes(8)  # what pzstd writes first
    (tmp_path / "p.log").write_bytes(skippable + COMPRESS["zstd"](CASE_LOG.read_bytes()))
    (item,) = discover(tmp_path / "p.log")
    with item.open_bytes() as fh:
        assert (item.format, fh.read()) == ("text", CASE_LOG.read_bytes())
