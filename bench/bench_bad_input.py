"""Time and peak memory of `postmortem analyze` on the large hostile inputs (issue: bounded results).

    python bench/bench_bad_input.py                   # every item
    python bench/bench_bad_input.py --only one-line   # items whose name contains the word
    python bench/bench_bad_input.py --issue18         # only the classes of issue 18 (tests/hostile_gen.py)

Each item is generated once under --work (default .bench/bad-inputs, git-ignored) and analysed by
the CLI in a child process, as a user would run it; the child prints its own wall and CPU time
and its peak RSS (VmHWM: `resource`'s ru_maxrss, printed too, keeps a parent's peak across fork
and exec). The table shows those with the exit code and what the report says about the item. The
bounds the project holds to: every item peaks under 1 GiB and ends within 60 s (the last line says
so; exit status 1 if one does not). The issue-18 classes (numbers past int64, super-linear shapes,
memory amplification, overlapping zip entries, a misled checkpoint audit, huge names) are written
by tests/hostile_gen.py at the sizes the red team used.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tarfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests import hostile_gen, nccl_info_gen  # noqa: E402

MB = 1 << 20
RSS_BOUND_MB = 1024
TIME_BOUND_S = 60
WARN_LINE = ("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> "
             "with error 4, opcode 5327, len 5327, vendor err 81 (Send)")



def _write_repeated(path: Path, block: bytes, total: int) -> None:
    with open(path, "wb") as fh:
        written = 0
        while written < total:
            fh.write(block)
            written += len(block)


def _gzip_members(chunk: bytes, copies: int) -> bytes:
    return gzip.compress(chunk, compresslevel=9, mtime=0) * copies


def one_line(job: Path) -> str:
    _write_repeated(job / "one-line.log", (WARN_LINE + " ").encode() * 4096, 200 * MB)
    return "one-line.log"


def one_line_utf16(job: Path) -> str:
    _write_repeated(job / "one-line-utf16.log", (WARN_LINE + " ").encode("utf-16-le") * 2048, 200 * MB)
    return "one-line-utf16.log"


def tar_member_one_line(job: Path) -> str:
    source = job.parent / f"{job.name}.member"
    _write_repeated(source, (WARN_LINE + " ").encode() * 4096, 200 * MB)
    with tarfile.open(job / "logs.tar", "w") as tar:
        tar.add(source, arcname="rank0/one-line.log")
    source.unlink()
    return "logs.tar!rank0/one-line.log"


def nul_padding(job: Path) -> str:
    with open(job / "nul-padded.log", "wb") as fh:
        fh.write((WARN_LINE + "\n").encode() * 1000)
        for _ in range(200):
            fh.write(bytes(MB))
    return "nul-padded.log"


def gzip_bomb_one_line(job: Path) -> str:
    (job / "bomb.log.gz").write_bytes(_gzip_members(b"A" * MB, 1024))  # 1 GiB of one line in ~1 MB
    return "bomb.log.gz"


def gzip_bomb_zeros(job: Path) -> str:
    (job / "zeros.log.gz").write_bytes(_gzip_members(bytes(MB), 4096))  # 4 GiB of NULs
    return "zeros.log.gz"


def gzip_bomb_short_lines(job: Path) -> str:
    (job / "lines.log.gz").write_bytes(_gzip_members(b"x\n" * (MB // 2), 1024))  # 1 GiB of 2-byte lines
    return "lines.log.gz"


def repeated_channel_line(job: Path) -> str:
    # One kept NCCL INFO line, repeated: once an event per line, 36x its size in memory (issue 18).
    nccl_info_gen.write_repeated_line(job / "channel.log", 100 * MB)
    return "channel.log"


def tiny_files(job: Path) -> str:
    for i in range(100_000):
        (job / f"r{i:06d}.log").write_text(f"[rank{i}]:[W1130 14:57:21.464574780 Utils.hpp:137] Warning: tiny file {i}\n")
    return "r000000.log"


ITEMS = {
    "one-line-200MB": one_line,
    "one-line-200MB-utf16": one_line_utf16,
    "tar-member-one-line-200MB": tar_member_one_line,
    "nul-padding-200MB": nul_padding,
    "gzip-bomb-one-line-1GiB": gzip_bomb_one_line,
    "gzip-bomb-zeros-4GiB": gzip_bomb_zeros,
    "gzip-bomb-short-lines-1GiB": gzip_bomb_short_lines,
    "tiny-files-100000": tiny_files,
    "repeated-channel-line-100MB": repeated_channel_line,
}
ISSUE18 = {item.name: partial(hostile_gen.write, item, scale=1.0) for item in hostile_gen.ITEMS}
ITEMS.update(ISSUE18)
# These analyse one file of the job, not the job (tests/hostile_gen.py: link-out-of-root).
SINGLE_FILE = {"link-out-of-root"}


def prepare(work: Path, name: str) -> tuple[Path, str]:
    # Each item in a directory of its own: some write beside their job (sibling jobs, a link's target).
    job = work / name / "job" if name in ISSUE18 else work / name
    marker = work / f"{name}.ready"
    if marker.exists():
        return job, marker.read_text()
    if job.exists():
        import shutil

        shutil.rmtree(job.parent if name in ISSUE18 else job)
    job.mkdir(parents=True)
    entry = ITEMS[name](job)
    marker.write_text(entry)
    return job, entry


def measure(job: Path, entry: str, work: Path) -> dict:
    out = work / f"{job.parent.name if job.name == 'job' else job.name}.report.json"
    target = job / entry if job.parent.name in SINGLE_FILE else job
    result = hostile_gen.measure(target, out, address_space=0, timeout=900)
    if result["exit"] not in (0, 1, 2):
        raise SystemExit(f"{job.name}: the child failed:\n{result['stderr'][-3000:]}")
    report = result["report"]
    if report is not None:
        inputs = {i["file"]: i for i in report["inputs"]}
        item = inputs.get(entry, {})
        result["status"] = f"{item.get('status', '?')}: {item.get('reason', '')}"[:90]
        result["inputs"] = len(inputs)
    else:
        result["status"] = result["message"][:90]
        result["inputs"] = 0
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "bad-inputs")
    parser.add_argument("--only", help="run the items whose name contains this")
    parser.add_argument("--issue18", action="store_true", help="only the classes of issue 18")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    names = [n for n in (ISSUE18 if args.issue18 else ITEMS) if not args.only or args.only in n]
    print(f"{'item':30} {'disk MB':>8} {'wall s':>7} {'peak RSS MB':>11} {'exit':>4}  report says")
    over = []
    for name in names:
        job, entry = prepare(args.work, name)
        disk = sum(p.lstat().st_blocks * 512 for p in job.rglob("*") if p.is_file() and not p.is_symlink()) / MB
        result = measure(job, entry, args.work)
        print(f"{name:30} {disk:8.1f} {result['seconds']:7.2f} {result['peak_rss_mb']:11.0f} {result['exit']:>4}  "
              f"{result['status']}", flush=True)
        if result["peak_rss_mb"] >= RSS_BOUND_MB or result["seconds"] >= TIME_BOUND_S:
            over.append(name)
    verdict = f"OVER THE BOUND: {', '.join(over)}" if over else "ok"
    print(f"\nbounds: peak RSS < {RSS_BOUND_MB} MB and wall < {TIME_BOUND_S} s for every item: {verdict}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
